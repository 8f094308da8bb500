#include "distributed/init.h"
#include "distributed/stream_group.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "distributed/debug.h"
#include "distributed/gloo.h"

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
std::map<std::string, BackendFactory>& backends() {
  static auto* b = new std::map<std::string, BackendFactory>();
  return *b;
}
BackendFactory registered_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(backends_mutex());
  auto it = backends().find(name);
  return it == backends().end() ? BackendFactory() : it->second;
}

std::shared_ptr<ProcessGroup> make_group(const std::string& backend, std::shared_ptr<Store> store, int rank, int size,
                                         std::chrono::milliseconds timeout) {
  std::shared_ptr<ProcessGroup> group;
  if (backend == "gloo") {
    GlooOptions gloo;
    gloo.timeout = timeout;
    // Device tensors (sim) go through the communication stream; CPU tensors straight to Gloo.
    group = std::make_shared<StreamOrderedGroup>(std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, gloo));
  } else if (BackendFactory factory = registered_backend(backend)) {
    group = factory(std::move(store), rank, size, timeout);
  } else if (backend == "nccl") {
    fail("init_process_group: backend 'nccl' is not available in this program: link //distributed:nccl (built "
         "where a CUDA toolkit with NCCL is found), or use backend 'gloo', which also runs on CPU and sim tensors");
  } else {
    fail("init_process_group: unknown backend '{}' (expected 'gloo' or 'nccl')", backend);
  }
  if (debug_mode_enabled()) group = std::make_shared<ProcessGroupDebug>(group);
  return group;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory factory) {
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
  if (options.backend != "gloo" && options.backend != "nccl") {
    fail("init_process_group: unknown backend '{}' (expected 'gloo' or 'nccl')", options.backend);
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
