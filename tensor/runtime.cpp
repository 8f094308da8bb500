// Stream, Event, current streams, the stream pool and guards over the registered DeviceRuntimes.
// Written once for every device type; the backends only implement DeviceRuntime.
#include "tensor/runtime.h"

#include <array>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "tensor/error.h"
#include "tensor/fault.h"
#include "tensor/stream_sanitizer.h"

namespace chorus {
namespace {

constexpr int kTypes = 3;
constexpr int kPoolSize = 8;  // per device and priority; streams are reused round-robin

struct PerDevice {
  std::once_flag pool_once;
  std::array<StreamHandle, kPoolSize> pool[2]{};  // [0] normal, [1] high priority
  std::atomic<uint32_t> next[2]{0, 0};
};

struct Registry {
  std::mutex mutex;
  DeviceRuntime* runtimes[kTypes] = {nullptr, nullptr, nullptr};
  std::unordered_map<int, std::unique_ptr<PerDevice>> devices[kTypes];
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked: streams outlive static destruction order
  return *r;
}

std::atomic<uint64_t> g_host_syncs{0};

// The registered runtime of `type` or nullptr, read under the lock (registration may race with use).
DeviceRuntime* registered_runtime(DeviceType type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.runtimes[static_cast<int>(type)];
}

PerDevice& per_device(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& slot = r.devices[static_cast<int>(device.type)][device.index];
  if (!slot) slot = std::make_unique<PerDevice>();
  return *slot;
}

// The thread's current stream per device, as handles (null: the default stream).
struct ThreadState {
  std::unordered_map<int, StreamHandle> current[kTypes];
  int device[kTypes] = {0, 0, 0};
};
thread_local ThreadState t_state;

void check_not_cpu(Device device, const char* what) {
  if (device.is_cpu()) fail("{}: the CPU has no streams or events (got device cpu)", what);
}

}  // namespace

void register_runtime(DeviceType type, DeviceRuntime* runtime) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.runtimes[static_cast<int>(type)] = runtime;
}

bool has_runtime(DeviceType type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.runtimes[static_cast<int>(type)] != nullptr;
}

int device_count(DeviceType type) {
  if (type == DeviceType::CPU) return 1;
  DeviceRuntime* rt = nullptr;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    rt = r.runtimes[static_cast<int>(type)];
  }
  return rt ? rt->device_count() : 0;
}

DeviceRuntime& runtime_for(Device device, const char* what) {
  check_not_cpu(device, what);
  check_device_calls_allowed(what);
  DeviceRuntime* rt = nullptr;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    rt = r.runtimes[static_cast<int>(device.type)];
  }
  if (rt == nullptr) {
    fail("{}: no {} device: this build of chorus has no {} backend (device {} requested; CUDA needs chorus "
         "built where a CUDA toolkit is installed)",
         what, device_type_name(device.type), device_type_name(device.type), device.str());
  }
  const int count = rt->device_count();
  if (count == 0) {
    fail("{}: no {} device: {} (device {} requested)", what, device_type_name(device.type), rt->unavailable_reason(),
         device.str());
  }
  if (device.index < 0 || device.index >= count) {
    fail("{}: device {} does not exist: this machine has {} {} device(s), indices 0..{}", what, device.str(), count,
         device_type_name(device.type), count - 1);
  }
  return *rt;
}

namespace {
thread_local const char* t_no_device_calls = nullptr;  // who forbade them, or null
}  // namespace

NoDeviceCallsGuard::NoDeviceCallsGuard(const char* who) : previous_(t_no_device_calls) { t_no_device_calls = who; }
NoDeviceCallsGuard::~NoDeviceCallsGuard() { t_no_device_calls = previous_; }

void check_device_calls_allowed(const char* what) {
  if (t_no_device_calls == nullptr) return;
  fail("{}: a device call on {}, a thread that device work waits for; it must make none (a blocking copy on "
       "another thread holds the driver lock while it waits for the device, so this call could deadlock)",
       what, t_no_device_calls);
}

uint64_t host_sync_count() { return g_host_syncs.load(std::memory_order_relaxed); }
void note_host_sync() { g_host_syncs.fetch_add(1, std::memory_order_relaxed); }

// ---- Stream ------------------------------------------------------------------------------------

bool Stream::query() const {
  DeviceRuntime& rt = runtime_for(device_, "Stream::query");
  const StreamDeviceGuard on_device(*this);
  const bool done = rt.query_stream(handle_);
  if (done && stream_sanitizer::active(device_.type)) stream_sanitizer::on_stream_done(handle_, device_);
  return done;
}

void Stream::synchronize() const {
  note_host_sync();
  DeviceRuntime& rt = runtime_for(device_, "Stream::synchronize");
  const StreamDeviceGuard on_device(*this);
  rt.synchronize_stream(handle_);
  if (stream_sanitizer::active(device_.type)) stream_sanitizer::on_stream_done(handle_, device_);
}

void Stream::wait(const Event& event) const { event.block(*this); }

Stream default_stream(Device device) {
  return Stream(device, runtime_for(device, "default_stream").default_stream(device.index));
}

Stream current_stream(Device device) {
  DeviceRuntime& rt = runtime_for(device, "current_stream");
  auto& map = t_state.current[static_cast<int>(device.type)];
  auto it = map.find(device.index);
  if (it == map.end() || it->second == nullptr) return Stream(device, rt.default_stream(device.index));
  return Stream(device, it->second);
}

void set_current_stream(const Stream& stream) {
  runtime_for(stream.device(), "set_current_stream");
  t_state.current[static_cast<int>(stream.device().type)][stream.device().index] = stream.handle();
}

Stream stream_from_pool(Device device, bool high_priority) {
  DeviceRuntime& rt = runtime_for(device, "stream_from_pool");
  PerDevice& pd = per_device(device);
  std::call_once(pd.pool_once, [&] {
    for (int p = 0; p < 2; ++p)
      for (auto& s : pd.pool[p]) s = rt.create_stream(device.index, p == 1);
  });
  const int p = high_priority ? 1 : 0;
  const uint32_t i = pd.next[p].fetch_add(1, std::memory_order_relaxed) % kPoolSize;
  return Stream(device, pd.pool[p][i]);
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
  note_host_sync();
  runtime_for(device, "synchronize").synchronize_device(device.index);
  if (stream_sanitizer::active(device.type)) stream_sanitizer::on_device_done(device);
}

int current_device_index(DeviceType type) { return t_state.device[static_cast<int>(type)]; }

void set_device(Device device) {
  if (device.is_cpu()) return;
  DeviceRuntime& rt = runtime_for(device, "set_device");
  const int n = rt.device_count();
  if (device.index < 0 || device.index >= n) {
    fail("set_device: {} does not exist (this machine has {} {} device(s))", device.str(), n, device_type_name(device.type));
  }
  rt.set_device(device.index);
  t_state.device[static_cast<int>(device.type)] = device.index;
}

// ---- Event -------------------------------------------------------------------------------------

// Owns the runtime event: built in place and never copied (a copy's destructor would destroy the
// handle the original still uses).
struct Event::State {
  State(Device d, DeviceRuntime* rt, EventHandle h) : device(d), runtime(rt), handle(h) {}
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (stream_sanitizer::active(device.type)) stream_sanitizer::on_event_destroyed(handle);
    runtime->destroy_event(handle);
  }
  Device device;
  DeviceRuntime* runtime;
  EventHandle handle;
};

void Event::record(const Stream& stream) {
  DeviceRuntime& rt = runtime_for(stream.device(), "Event::record");
  if (state_ && state_->device != stream.device()) {
    fail("Event::record: the event belongs to {} but the stream to {}", state_->device.str(), stream.device().str());
  }
  if (!state_) {
    state_ = std::make_shared<State>(stream.device(), &rt, rt.create_event(stream.device().index, enable_timing_));
  }
  const StreamDeviceGuard on_device(stream);
  rt.record_event(state_->handle, stream.handle());
  if (stream_sanitizer::active(stream.device().type)) {
    stream_sanitizer::on_record(state_->handle, stream.device(), stream.handle());
  }
}

void Event::record() {
  if (!state_) fail("Event::record(): an event never recorded has no device; call record(stream) first");
  record(current_stream(state_->device));
}

void Event::block(const Stream& stream) const {
  if (!state_) return;
  if (state_->device.type != stream.device().type) {
    fail("Event::block: event of {} cannot order a stream of {}", state_->device.str(), stream.device().str());
  }
  DeviceRuntime& rt = runtime_for(stream.device(), "Stream::wait");
  const StreamDeviceGuard on_device(stream);
  rt.stream_wait_event(stream.handle(), state_->handle);
  if (stream_sanitizer::active(stream.device().type)) {
    stream_sanitizer::on_wait(stream.handle(), stream.device(), state_->handle);
  }
}

bool Event::query() const {
  if (!state_) return true;
  check_device_calls_allowed("Event::query");
  const bool done = state_->runtime->query_event(state_->handle);
  if (done && stream_sanitizer::active(state_->device.type)) stream_sanitizer::on_event_done(state_->handle);
  return done;
}

void Event::synchronize() const {
  if (!state_) return;
  check_device_calls_allowed("Event::synchronize");
  note_host_sync();
  state_->runtime->synchronize_event(state_->handle);
  if (stream_sanitizer::active(state_->device.type)) stream_sanitizer::on_event_done(state_->handle);
}

double Event::elapsed_time(const Event& end) const {
  if (!enable_timing_ || !end.enable_timing_) {
    fail("Event::elapsed_time: both events need Event(/*enable_timing=*/true)");
  }
  if (!state_ || !end.state_) fail("Event::elapsed_time: both events must have been recorded");
  if (!query() || !end.query()) fail("Event::elapsed_time: both events must have completed (synchronize first)");
  return state_->runtime->elapsed_ms(state_->handle, end.state_->handle);
}

Device Event::device() const {
  if (!state_) fail("Event::device: the event was never recorded");
  return state_->device;
}

EventHandle Event::handle() const { return state_ ? state_->handle : nullptr; }

// ---- Guards ------------------------------------------------------------------------------------

namespace {
// A guard's destructor gives the previous device back without throwing (a destructor that throws
// ends the process): cudaSetDevice may return the sticky error of an earlier kernel fault, and a
// process exiting (sim and CUDA unloaded) refuses it; that error surfaces at the next device call
// instead, as PyTorch's uncheckedSetDevice leaves it. False when refused: the thread stays on the
// device it is on (sim's refused set_device changes nothing), and the caller's record must say so.
bool restore_device(DeviceType type, int device) noexcept {
  DeviceRuntime* rt = registered_runtime(type);
  if (rt == nullptr) return true;
  try {
    rt->set_device(device);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}
}  // namespace

StreamGuard::StreamGuard(const Stream& stream)
    : previous_(current_stream(stream.device())),
      previous_device_(current_device_index(stream.device().type)) {
  // The runtime first: if it refuses, no destructor runs, and the record must still match it.
  runtime_for(stream.device(), "StreamGuard").set_device(stream.device().index);
  t_state.device[static_cast<int>(stream.device().type)] = stream.device().index;
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  t_state.current[static_cast<int>(previous_.device().type)][previous_.device().index] = previous_.handle();
  if (restore_device(previous_.device().type, previous_device_)) {
    t_state.device[static_cast<int>(previous_.device().type)] = previous_device_;
  }
}

DeviceGuard::DeviceGuard(Device device) : type_(device.type) {
  if (device.is_cpu()) return;
  runtime_for(device, "DeviceGuard").set_device(device.index);
  previous_ = t_state.device[static_cast<int>(type_)];
  t_state.device[static_cast<int>(type_)] = device.index;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ < 0) return;
  if (restore_device(type_, previous_)) t_state.device[static_cast<int>(type_)] = previous_;
}

StreamDeviceGuard::StreamDeviceGuard(const Stream& stream) {
  if (stream.device().is_cpu() || fault::removed(fault::Point::kStreamDeviceGuard)) return;
  guard_.emplace(stream.device());
}

}  // namespace chorus
