#include "distributed/init.h"
#include "distributed/stream_group.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>

#include "distributed/debug.h"
#include "distributed/flight_recorder.h"
#include "distributed/gloo.h"
#include "distributed/gloo_communicator.h"
#include "distributed/heartbeat.h"
#include "distributed/job_token.h"

namespace chorus::distributed {
namespace {

struct State {
  std::mutex mutex;
  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<Store> store;
  std::chrono::milliseconds timeout{300000};
  std::string backend;
  int groups_created = 0;
  int heartbeats_started = 0;  // names each heartbeat's keys apart (every rank starts as many)
  int inits = 0;               // names each job's process groups and flight-recorder keys apart (the same)
  std::unique_ptr<Heartbeat> heartbeat;  // last: stopped (and this rank marked as left) first
};

State& state() {
  static State s;
  return s;
}

std::mutex& backends_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, DeviceBackendFactory>& backends() {
  static auto* b = new std::map<std::string, DeviceBackendFactory>();
  return *b;
}
DeviceBackendFactory registered_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(backends_mutex());
  auto it = backends().find(name);
  return it == backends().end() ? DeviceBackendFactory() : it->second;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

BackendSpec parse_backend(const std::string& spec) {
  const std::string expected =
      "expected \"gloo\", \"nccl\", or device:backend pairs such as \"cpu:gloo,cuda:nccl\" (devices cpu, sim, cuda; "
      "backends gloo, nccl; cpu must be gloo; nccl only for cuda)";
  BackendSpec out;
  const std::string s = trim(spec);
  if (s == "gloo") {
    out.devices = {{DeviceType::Sim, "gloo"}, {DeviceType::CUDA, "gloo"}};
    return out;
  }
  if (s == "nccl") {
    out.devices = {{DeviceType::CUDA, "nccl"}};
    return out;
  }
  if (s.find(':') == std::string::npos) fail("init_process_group: unknown backend '{}' ({})", spec, expected);
  bool has_cpu = false;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = trim(s.substr(pos, comma - pos));
    pos = comma + 1;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) fail("init_process_group: backend '{}': '{}' is not device:backend ({})", spec, item, expected);
    const std::string device = trim(item.substr(0, colon)), backend = trim(item.substr(colon + 1));
    if (backend != "gloo" && backend != "nccl") {
      fail("init_process_group: backend '{}': unknown backend '{}' for {} ({})", spec, backend, device, expected);
    }
    if (device == "cpu") {
      if (backend != "gloo") fail("init_process_group: backend '{}': cpu tensors need gloo, got {} ({})", spec, backend, expected);
      if (has_cpu) fail("init_process_group: backend '{}' names cpu twice", spec);
      has_cpu = true;
      continue;
    }
    DeviceType type;
    if (device == "sim") type = DeviceType::Sim;
    else if (device == "cuda") type = DeviceType::CUDA;
    else fail("init_process_group: backend '{}': unknown device '{}' ({})", spec, device, expected);
    if (backend == "nccl" && type != DeviceType::CUDA) {
      fail("init_process_group: backend '{}': nccl runs on cuda tensors only, not {} ({})", spec, device, expected);
    }
    for (const auto& [t, b] : out.devices)
      if (t == type) fail("init_process_group: backend '{}' names {} twice", spec, device);
    out.devices.emplace_back(type, backend);
  }
  return out;
}

namespace {

// `name` and `global_ranks` (the members' ranks in the job) are the flight recorder's.
std::shared_ptr<ProcessGroup> make_group(const std::string& backend, std::shared_ptr<Store> store, int rank, int size,
                                         std::chrono::milliseconds timeout, std::string name,
                                         std::vector<int> global_ranks) {
  const BackendSpec spec = parse_backend(backend);
  // CPU tensors (and device tensors of device types mapped to gloo) go to one Gloo group; every other
  // device backend gets its own communicator over a store prefix of its name.
  GlooOptions gloo;
  gloo.timeout = timeout;
  gloo.name = std::move(name);
  gloo.global_ranks = std::move(global_ranks);
  auto cpu = std::make_shared<ProcessGroupGloo>(store, rank, size, gloo);
  std::shared_ptr<Communicator> gloo_on_stream;
  StreamOrderedGroup::DeviceCommunicators devices;
  for (const auto& [type, name] : spec.devices) {
    if (name == "gloo") {
      if (!gloo_on_stream) gloo_on_stream = std::make_shared<GlooStreamCommunicator>(cpu);
      devices.emplace_back(type, gloo_on_stream);
      continue;
    }
    DeviceBackendFactory factory = registered_backend(name);
    if (!factory) {
      fail("init_process_group: backend '{}' is not available in this program: link //distributed:nccl (built where a "
           "CUDA toolkit with NCCL is found), or use backend 'gloo', which also runs on CPU and sim tensors",
           name);
    }
    devices.emplace_back(type, factory(std::make_shared<PrefixStore>(name, store), rank, size, timeout));
  }
  std::shared_ptr<ProcessGroup> group = std::make_shared<StreamOrderedGroup>(cpu, std::move(devices), timeout, backend);
  if (debug_mode_enabled()) group = std::make_shared<ProcessGroupDebug>(group);
  return group;
}

}  // namespace

void register_device_backend(const std::string& name, DeviceBackendFactory factory) {
  std::lock_guard<std::mutex> lock(backends_mutex());
  backends()[name] = std::move(factory);
}

bool has_device_backend(const std::string& name) {
  if (name == "gloo") return true;
  std::lock_guard<std::mutex> lock(backends_mutex());
  return backends().count(name) > 0;
}

namespace {

// "host:port" of a tcp:// init method.
void parse_host_port(const std::string& spec, std::string& host, int& port) {
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    fail("init_process_group: init_method 'tcp://{}' must be tcp://host:port", spec);
  }
  host = spec.substr(0, colon);
  try {
    size_t used = 0;
    port = std::stoi(spec.substr(colon + 1), &used);
    if (used != spec.size() - colon - 1) throw std::invalid_argument(spec);
  } catch (const std::exception&) {
    fail("init_process_group: init_method 'tcp://{}' has no valid port", spec);
  }
}

}  // namespace

namespace {

int parse_env_int(const char* name, const char* v) {
  try {
    size_t used = 0;
    const int value = std::stoi(v, &used);
    if (used != std::string(v).size()) throw std::invalid_argument(v);
    return value;
  } catch (const std::exception&) {
    fail("init_process_group: environment variable {}='{}' is not an integer", name, v);
  }
}

}  // namespace

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    fail("init_process_group: environment variable {} is not set (launch with chorusrun, which sets RANK, "
         "WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or pass InitOptions)",
         name);
  }
  return parse_env_int(name, v);
}

std::string slurm_first_host(const std::string& nodelist) {
  // The first entry at bracket depth 0.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    else if (nodelist[end] == ']') --depth;
    else if (nodelist[end] == ',' && depth == 0) break;
    if (depth < 0 || depth > 1) break;
  }
  const std::string first = nodelist.substr(0, end);
  if (first.empty() || depth != 0) fail("SLURM node list '{}': expected host names such as node[01-04,07],gpu5", nodelist);
  const size_t open = first.find('[');
  if (open == std::string::npos) return first;
  const size_t close = first.find(']', open);
  if (close == std::string::npos) fail("SLURM node list '{}': a '[' without its ']'", nodelist);
  // The first number of the first range keeps its zero padding: [008-010] -> 008.
  const std::string ranges = first.substr(open + 1, close - open - 1);
  size_t digits = 0;
  while (digits < ranges.size() && std::isdigit(static_cast<unsigned char>(ranges[digits]))) ++digits;
  if (digits == 0) fail("SLURM node list '{}': expected a number after '[', got '{}'", nodelist, ranges);
  return first.substr(0, open) + ranges.substr(0, digits) + first.substr(close + 1);
}

LaunchEnv launch_env_from(const std::function<const char*(const char*)>& lookup) {
  auto get = [&](const char* name) -> const char* {
    const char* v = lookup(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  auto integer = [&](const char* name) { return parse_env_int(name, get(name)); };
  LaunchEnv env;
  if (get("RANK") || get("WORLD_SIZE")) {
    env.launcher = "env";
    env.rank_variable = "RANK";
    env.world_size_variable = "WORLD_SIZE";
    if (!get("WORLD_SIZE"))
      fail("init_process_group: environment variable RANK is set but WORLD_SIZE is not (launch with chorusrun, "
           "which sets both)");
    env.world_size = integer("WORLD_SIZE");
    if (env.world_size < 1) fail("WORLD_SIZE={} is not a world size (expected an integer >= 1)", env.world_size);
    // A world of one needs no RANK (it is 0); any larger one does.
    if (get("RANK")) env.rank = integer("RANK");
    else if (env.world_size == 1) env.rank = 0;
    else fail("init_process_group: environment variable WORLD_SIZE is set but RANK is not (launch with chorusrun, "
              "which sets both)");
    if (get("LOCAL_RANK")) env.local_rank = integer("LOCAL_RANK");
  } else {
    // A scheduler's variables: the first whose world size is set.
    struct Scheduler {
      const char *launcher, *world, *rank, *local, *hint;
    };
    static constexpr Scheduler kSchedulers[] = {
        {"openmpi", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", ""},
        {"slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", " (run under srun)"},
    };
    const Scheduler* found = nullptr;
    for (const Scheduler& sch : kSchedulers)
      if (!found && get(sch.world)) found = &sch;
    if (!found) return env;
    env.launcher = found->launcher;
    env.rank_variable = found->rank;
    env.world_size_variable = found->world;
    env.world_size = integer(found->world);
    if (!get(found->rank)) fail("init_process_group: {} is set but {} is not{}", found->world, found->rank, found->hint);
    env.rank = integer(found->rank);
    if (get(found->local)) env.local_rank = integer(found->local);
  }
  if (env.world_size < 1)
    fail("{}={} is not a world size (expected an integer >= 1)", env.world_size_variable, env.world_size);
  if (env.rank < 0 || env.rank >= env.world_size)
    fail("{}={} is outside a world of size {} (expected 0 <= rank < {})", env.rank_variable, env.rank, env.world_size,
         env.world_size);
  if (const char* addr = get("MASTER_ADDR")) {
    env.master_addr = addr;
  } else if (env.launcher != "env") {
    const char* nodes = get("SLURM_JOB_NODELIST") ? get("SLURM_JOB_NODELIST") : get("SLURM_NODELIST");
    if (nodes) env.master_addr = slurm_first_host(nodes);
  }
  if (get("MASTER_PORT")) {
    env.master_port = integer("MASTER_PORT");
    if (env.master_port < 1 || env.master_port > 65535)
      fail("MASTER_PORT={} is not a TCP port (expected 1 to 65535)", env.master_port);
  } else if (env.launcher != "env") {
    env.master_port = 29500;
  }
  return env;
}

LaunchEnv launch_env() { return launch_env_from([](const char* name) { return std::getenv(name); }); }

std::shared_ptr<ProcessGroup> init_process_group(InitOptions options) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.group) fail("init_process_group: the default process group is already initialized (call destroy_process_group first)");
  const LaunchEnv launch = launch_env();
  // Without RANK / WORLD_SIZE (nor a scheduler's variables) env_int names what is missing.
  const int rank = options.rank >= 0 ? options.rank : launch.rank >= 0 ? launch.rank : env_int("RANK");
  const int size = options.world_size >= 0 ? options.world_size : launch.world_size >= 0 ? launch.world_size : env_int("WORLD_SIZE");
  if (size < 1) fail("init_process_group: world_size must be at least 1, got {}", size);
  if (rank < 0 || rank >= size) fail("init_process_group: rank {} is outside [0, {}) for world_size {}", rank, size, size);
  // CHORUS_TIMEOUT_S replaces the default timeout (a program that set its own keeps it): how long a
  // rank waits for a dead or unreachable peer before every collective fails with an error.
  if (options.timeout == InitOptions{}.timeout) {
    if (const char* t = std::getenv("CHORUS_TIMEOUT_S"); t != nullptr && *t != '\0') {
      char* end = nullptr;
      const double seconds = std::strtod(t, &end);
      if (*end != '\0' || !(seconds > 0) || seconds > 1e7)
        fail("init_process_group: CHORUS_TIMEOUT_S='{}': expected a number of seconds > 0", t);
      options.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    }
  }
  // A malformed spec fails before any connection is made. With a device backend, LOCAL_RANK (set
  // by chorusrun) picks this process's device, as torchrun users do with set_device(LOCAL_RANK).
  for (const auto& [type, name] : parse_backend(options.backend).devices) {
    if (launch.local_rank < 0 || device_count(type) == 0) continue;
    const int index = launch.local_rank;
    if (index < device_count(type)) set_device(Device(type, index));
  }
  // Read before connecting, so that a malformed setting fails at once.
  const std::optional<HeartbeatOptions> heartbeat = size > 1 ? Heartbeat::from_env() : std::nullopt;
  std::function<std::shared_ptr<Store>()> heartbeat_connect;
  // A timed-out collective's rank waits for the others' records (flight_recorder.h): a heartbeat
  // answers within one interval; without heartbeats only ranks that time out too answer. Shorter
  // than the heartbeat's window (misses x interval): a peer cut off at the collective's start is
  // reported by this rank's heartbeat (which ends the process) that long after, and the
  // collective's error, report included, must be out by then (hosts_test's dead link found it).
  const auto exchange_wait = heartbeat ? heartbeat->interval + std::chrono::milliseconds(1000)
                                       : std::chrono::milliseconds(5000);
  std::function<std::shared_ptr<Store>()> flight_connect;
  std::shared_ptr<Store> store = options.store;
  if (!store) {
    const std::string& method = options.init_method;
    if (method == "env://" || method.empty() || method.rfind("tcp://", 0) == 0) {
      std::string host;
      int port = 0;
      if (method.rfind("tcp://", 0) == 0) {
        parse_host_port(method.substr(6), host, port);
      } else {
        if (launch.master_addr.empty()) {
          fail("init_process_group: environment variable MASTER_ADDR is not set (launch with chorusrun, or set "
               "MASTER_ADDR and MASTER_PORT{})",
               launch.launcher == "openmpi" ? "; with mpirun: -x MASTER_ADDR=<first host>" : "");
        }
        host = launch.master_addr;
        port = launch.master_port >= 0 ? launch.master_port : env_int("MASTER_PORT");
      }
      if (port <= 0 || port > 65535) fail("init_process_group: master port {} is outside 1..65535", port);
      // The job token (job_token.h): rank 0's store lets in only the processes that hold it, and
      // everything the backends exchange to connect (Gloo's addresses, NCCL's unique id) goes
      // through that store.
      const std::string token = job_token_from_env();
      store = std::make_shared<TCPStore>(host, port,
                                         TCPStoreOptions{.is_server = rank == 0,
                                                         .num_workers = size,
                                                         .timeout = options.timeout,
                                                         .job_token = token});
      flight_connect = [host, port, token, exchange_wait] {
        return std::make_shared<TCPStore>(
            host, port, TCPStoreOptions{.is_server = false, .timeout = exchange_wait, .job_token = token});
      };
      // The heartbeat's own connections (heartbeat.h): requests that time out after one interval.
      if (heartbeat) {
        heartbeat_connect = [host, port, token, interval = heartbeat->interval] {
          return std::make_shared<TCPStore>(
              host, port, TCPStoreOptions{.is_server = false, .timeout = interval, .job_token = token});
        };
      }
    } else if (method.rfind("file://", 0) == 0) {
      store = std::make_shared<FileStore>(method.substr(7), options.timeout);
    } else {
      fail("init_process_group: init_method '{}' is not one of env://, tcp://host:port, file:///path", method);
    }
  }
  // Every rank counts its inits alike: the names of this job's groups and flight-recorder keys
  // differ from an earlier job's in the same processes (over the same store).
  const int init = ++s.inits;
  const std::string suffix = init > 1 ? fmt::format("@{}", init) : "";
  FlightRecorder& recorder = FlightRecorder::global();
  recorder.set_job(rank, size,
                   FlightExchange{.store = store, .connect = flight_connect,
                                  .prefix = fmt::format("chorus_flight/{}", init), .id = rank, .wait = exchange_wait});
  recorder.install_dump_signal();
  std::vector<int> everyone(size);
  for (int r = 0; r < size; ++r) everyone[r] = r;
  s.group = make_group(options.backend, std::make_shared<PrefixStore>("default_pg", store), rank, size, options.timeout,
                       "default_pg" + suffix, everyone);
  if (heartbeat_connect) {
    HeartbeatOptions o = *heartbeat;
    o.prefix = fmt::format("heartbeat/{}", s.heartbeats_started++);
    o.on_beat = [](Store& connection) { FlightRecorder::global().answer_request(connection); };
    s.heartbeat = std::make_unique<Heartbeat>(heartbeat_connect, rank, size, o);
  }
  s.store = store;
  s.timeout = options.timeout;
  s.backend = options.backend;
  s.groups_created = 0;
  return s.group;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().group != nullptr;
}

std::shared_ptr<ProcessGroup> default_group() {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (!state().group) fail("distributed: the default process group is not initialized (call init_process_group first)");
  return state().group;
}

int get_rank() { return default_group()->rank(); }
int get_world_size() { return default_group()->size(); }

std::shared_ptr<Store> default_store() {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (!state().store) fail("distributed: the default process group is not initialized (call init_process_group first)");
  return state().store;
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().heartbeat.reset();  // marks this rank as left before the store can go
  FlightRecorder::global().clear_job();
  state().group.reset();
  state().store.reset();
}

std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, std::optional<std::chrono::milliseconds> timeout) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  if (!s.group) fail("new_group: the default process group is not initialized (call init_process_group first)");
  const int world = s.group->size(), me = s.group->rank();
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) fail("new_group: ranks must not be empty");
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) fail("new_group: ranks contain a duplicate");
  if (ranks.front() < 0 || ranks.back() >= world) {
    fail("new_group: ranks must be in [0, {}) (the default group's size), got {} .. {}", world, ranks.front(), ranks.back());
  }
  // Every rank counts the call, members or not, so group ids agree across ranks.
  const int id = ++s.groups_created;
  auto it = std::find(ranks.begin(), ranks.end(), me);
  if (it == ranks.end()) return nullptr;
  auto store = std::make_shared<PrefixStore>("group_" + std::to_string(id), s.store);
  const std::string backend = s.backend;
  const auto t = timeout.value_or(s.timeout);
  const std::string name = fmt::format("group_{}{}", id, s.inits > 1 ? fmt::format("@{}", s.inits) : "");
  lock.unlock();
  return make_group(backend, store, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), t, name, ranks);
}

}  // namespace chorus::distributed
