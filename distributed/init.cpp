#include "distributed/init.h"
#include "distributed/stream_group.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "distributed/debug.h"
#include "distributed/gloo.h"
#include "distributed/gloo_communicator.h"

namespace chorus::distributed {
namespace {

struct State {
  std::mutex mutex;
  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<Store> store;
  std::chrono::milliseconds timeout{300000};
  std::string backend;
  int groups_created = 0;
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

std::shared_ptr<ProcessGroup> make_group(const std::string& backend, std::shared_ptr<Store> store, int rank, int size,
                                         std::chrono::milliseconds timeout) {
  const BackendSpec spec = parse_backend(backend);
  // CPU tensors (and device tensors of device types mapped to gloo) go to one Gloo group; every other
  // device backend gets its own communicator over a store prefix of its name.
  GlooOptions gloo;
  gloo.timeout = timeout;
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

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    fail("init_process_group: environment variable {} is not set (launch with chorusrun, which sets RANK, "
         "WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or pass InitOptions)",
         name);
  }
  try {
    size_t used = 0;
    const int value = std::stoi(v, &used);
    if (used != std::string(v).size()) throw std::invalid_argument(v);
    return value;
  } catch (const std::exception&) {
    fail("init_process_group: environment variable {}='{}' is not an integer", name, v);
  }
}

std::shared_ptr<ProcessGroup> init_process_group(InitOptions options) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.group) fail("init_process_group: the default process group is already initialized (call destroy_process_group first)");
  const int rank = options.rank >= 0 ? options.rank : env_int("RANK");
  const int size = options.world_size >= 0 ? options.world_size : env_int("WORLD_SIZE");
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
    const char* local = std::getenv("LOCAL_RANK");
    if (local == nullptr || *local == '\0' || device_count(type) == 0) continue;
    const int index = env_int("LOCAL_RANK");
    if (index < device_count(type)) set_device(Device(type, index));
  }
  std::shared_ptr<Store> store = options.store;
  if (!store) {
    const std::string& method = options.init_method;
    if (method == "env://" || method.empty() || method.rfind("tcp://", 0) == 0) {
      std::string host;
      int port = 0;
      if (method.rfind("tcp://", 0) == 0) {
        parse_host_port(method.substr(6), host, port);
      } else {
        const char* addr = std::getenv("MASTER_ADDR");
        if (addr == nullptr || *addr == '\0') {
          fail("init_process_group: environment variable MASTER_ADDR is not set (launch with chorusrun, or set "
               "MASTER_ADDR and MASTER_PORT)");
        }
        host = addr;
        port = env_int("MASTER_PORT");
      }
      if (port <= 0 || port > 65535) fail("init_process_group: master port {} is outside 1..65535", port);
      store = std::make_shared<TCPStore>(
          host, port, TCPStoreOptions{.is_server = rank == 0, .num_workers = size, .timeout = options.timeout});
    } else if (method.rfind("file://", 0) == 0) {
      store = std::make_shared<FileStore>(method.substr(7), options.timeout);
    } else {
      fail("init_process_group: init_method '{}' is not one of env://, tcp://host:port, file:///path", method);
    }
  }
  s.group = make_group(options.backend, std::make_shared<PrefixStore>("default_pg", store), rank, size, options.timeout);
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
  lock.unlock();
  return make_group(backend, store, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), t);
}

}  // namespace chorus::distributed
