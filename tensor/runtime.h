// The device runtime: the one place chorus touches a device's runtime (memory, copies, streams,
// events, synchronization). `DeviceRuntime` is the narrow interface a backend implements (cuda: thin
// over cudart, kernels/cuda/runtime.cu; sim: the simulated device, tensor/sim/). Everything above it
// — Stream, Event, current streams, the stream pool, guards, the caching allocator, the
// stream-ordered process group — is written once over the interface and runs on both.
//
// Semantics are CUDA's: work on one stream runs in order; streams run concurrently; an event
// captures the work submitted to a stream before record(); stream.wait(event) orders later work on
// the stream after that captured work (a later record() of the same event does not affect an
// earlier wait); the host blocks only in synchronize() calls and in copies between the host and a
// device (to(), copy_: one from pageable host memory may wait for its stream, as sim's always does),
// all of which are counted (host_sync_count), so a test can assert that a training step never blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tensor/device.h"

namespace chorus {

using StreamHandle = void*;  // cudaStream_t on cuda, the simulated stream on sim
using EventHandle = void*;   // cudaEvent_t on cuda

enum class CopyKind : uint8_t { HostToDevice, DeviceToHost, DeviceToDevice };

// What a backend implements. Device indices are already validated by the callers in runtime.cpp.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType type() const = 0;
  // Number of devices; 0 when there is none (never throws).
  virtual int device_count() = 0;
  // Why there is no device (e.g. the driver's error), for the "no CUDA device" message.
  virtual std::string unavailable_reason() { return "no device"; }
  virtual void set_device(int device) = 0;

  // Raw device memory, uncached (the caching allocator sits above). nullptr when out of memory.
  virtual void* malloc(int device, size_t nbytes) = 0;
  virtual void free(int device, void* ptr) = 0;
  virtual size_t total_memory(int device) = 0;
  // Page-locked host memory, the only host memory an asynchronous copy may read or write.
  virtual void* host_malloc(size_t nbytes) = 0;
  virtual void host_free(void* ptr) = 0;
  // Whether `ptr` is in page-locked host memory (host_malloc's, or another's the runtime knows): a
  // copy from it returns before it is read (copy_across_devices then waits for it, as PyTorch's
  // blocking copy does). No device call: a lookup (cudaPointerGetAttributes on cuda).
  virtual bool is_page_locked(const void* /*ptr*/) { return false; }

  virtual StreamHandle create_stream(int device, bool high_priority) = 0;
  virtual StreamHandle default_stream(int device) = 0;
  virtual bool query_stream(StreamHandle stream) = 0;
  virtual void synchronize_stream(StreamHandle stream) = 0;
  virtual void synchronize_device(int device) = 0;

  // Copies nbytes, ordered on `stream`. Host memory should be pinned for the copy to overlap.
  virtual void memcpy_async(void* dst, const void* src, size_t nbytes, CopyKind kind, StreamHandle stream) = 0;

  // Runs `fn` on the host, in order on `stream` (the sim device runs every kernel this way;
  // `device_buffers` are the device pointers the task reads or writes, which the sim device makes
  // accessible for the task's duration). cuda: cudaLaunchHostFunc, which must not touch device
  // memory, so cuda kernels never come this way.
  virtual void launch_host_task(StreamHandle stream, std::function<void()> fn,
                                std::vector<const void*> device_buffers) = 0;

  // Stream memory operations on a 32-bit word of page-locked host memory (host_malloc): they order
  // a stream after host work with no host function and no CUDA call on the host side
  // (distributed/gloo_communicator.cpp). write_value stores `value` once the stream gets there,
  // after its earlier work, whose writes a host thread that reads the value (acquire) also sees;
  // wait_value holds the stream's later work until the word, as the host stores it (release), is
  // >= value (compared as (int32_t)(word - value) >= 0, so counters may wrap). Neither blocks the
  // host. cuda: cuStreamWriteValue32 / cuStreamWaitValue32 (GEQ).
  virtual void stream_write_value(StreamHandle stream, uint32_t* word, uint32_t value) = 0;
  virtual void stream_wait_value(StreamHandle stream, const uint32_t* word, uint32_t value) = 0;

  // Fills nbytes at a block the caching allocator hands out again with a NaN pattern, ordered on
  // `stream` (sim does; cuda does nothing): an early reuse then gives wrong numbers.
  virtual void poison(void* /*ptr*/, size_t /*nbytes*/, StreamHandle /*stream*/) {}

  virtual EventHandle create_event(int device, bool enable_timing) = 0;
  virtual void destroy_event(EventHandle event) = 0;
  virtual void record_event(EventHandle event, StreamHandle stream) = 0;
  virtual void stream_wait_event(StreamHandle stream, EventHandle event) = 0;
  virtual bool query_event(EventHandle event) = 0;
  virtual void synchronize_event(EventHandle event) = 0;
  // Milliseconds between two completed, timing-enabled events.
  virtual double elapsed_ms(EventHandle start, EventHandle end) = 0;
};

// Backends register at static-initialization time (sim always; cuda when built with a toolkit).
void register_runtime(DeviceType type, DeviceRuntime* runtime);
bool has_runtime(DeviceType type);
// The runtime of `device`'s type, checked: its index must name an existing device. Throws a
// chorus::Error naming `what`, the device and the reason ("no CUDA device: ...") otherwise.
DeviceRuntime& runtime_for(Device device, const char* what);
// Number of devices of `type` (0 when chorus has no such backend or the machine no such device).
int device_count(DeviceType type);

// Host-blocking waits since the process started: every Stream/Event/device synchronize and every
// blocking device-to-host copy adds one. DDP tests assert a step adds none.
uint64_t host_sync_count();
void note_host_sync();

// A thread that device work waits for (Gloo's lane worker: its stream waits for the worker's flag
// word) must make no device call: on CUDA, another thread's blocking copy to pageable memory holds
// the driver lock while it waits for the stream, so such a call deadlocks the process, and only
// now and then. While a guard lives on a thread, runtime_for and the caching allocator (taking or
// releasing device memory, which may record events) throw a chorus::Error naming `who`: a call
// made there fails at once, on sim in CI, instead of as a rare hang. (Releasing the last reference
// to a device tensor there is the same mistake, and is caught only when that thread's reference
// happens to be the last.)
class NoDeviceCallsGuard {
 public:
  explicit NoDeviceCallsGuard(const char* who);
  ~NoDeviceCallsGuard();
  NoDeviceCallsGuard(const NoDeviceCallsGuard&) = delete;
  NoDeviceCallsGuard& operator=(const NoDeviceCallsGuard&) = delete;

 private:
  const char* previous_;
};
// Throws the error above when this thread holds a NoDeviceCallsGuard; `what` names the call.
void check_device_calls_allowed(const char* what);

class Event;

// A stream of one device. Cheap to copy; streams live as long as the process (as CUDA's pools).
class Stream {
 public:
  Stream(Device device, StreamHandle handle) : device_(device), handle_(handle) {}
  Device device() const { return device_; }
  StreamHandle handle() const { return handle_; }
  // True when all work submitted so far has completed.
  bool query() const;
  void synchronize() const;
  // Later work on this stream waits for the work `event` captured (no host block).
  void wait(const Event& event) const;
  bool operator==(const Stream& other) const = default;

 private:
  Device device_;
  StreamHandle handle_;
};

// A device event. Created lazily at the first record (on the recording stream's device).
class Event {
 public:
  explicit Event(bool enable_timing = false) : enable_timing_(enable_timing) {}
  // Captures the work submitted to `stream` so far.
  void record(const Stream& stream);
  void record();  // on the current stream of the device recorded last, or cpu error if never
  // Makes `stream` wait for the captured work (no-op when never recorded, as CUDA).
  void block(const Stream& stream) const;
  bool query() const;  // true when never recorded or the captured work completed
  void synchronize() const;
  // Milliseconds from this event to `end`; both recorded with timing and completed.
  double elapsed_time(const Event& end) const;
  bool recorded() const { return state_ != nullptr; }
  Device device() const;
  EventHandle handle() const;

 private:
  struct State;
  bool enable_timing_;
  std::shared_ptr<State> state_;
};

// The stream work on `device` goes to from this thread (initially the device's default stream).
Stream current_stream(Device device);
void set_current_stream(const Stream& stream);
Stream default_stream(Device device);
// A stream from the device's pool (round-robin over a fixed set, as PyTorch's), high priority for
// communication.
Stream stream_from_pool(Device device, bool high_priority = false);
// Blocks until all work on every stream of `device` has completed.
void synchronize(Device device);

// The device of `type` this thread works on (DeviceGuard sets it; 0 at first).
int current_device_index(DeviceType type);
// Makes `device` current for its type on this thread until changed (torch.cuda.set_device); a
// device that does not exist is a chorus::Error.
void set_device(Device device);

// Makes `stream` current for its device (and its device current) while in scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  int previous_device_;
};

// Makes `device` current for its type while in scope (a no-op for the CPU).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  DeviceType type_;
  int previous_ = -1;
};

// [A stream's device is current] Makes `stream`'s device current while in scope, for a runtime call
// on the stream: on CUDA every device's default stream is the null stream, which names the current
// device's (a copy or wait given cuda:1's default stream while cuda:0 is current goes to cuda:0's; an
// event of cuda:1 recorded there is refused), and a kernel launches only on a stream of the current
// device. PyTorch's CUDAGuard in its event record and copies does the same. Stream, Event and the
// cross-device copies use it; the sim device refuses the call otherwise (tensor/sim/sim.cpp, [The
// default stream is the current device's]). fault::Point::kStreamDeviceGuard removes it (the negative
// control, sim_runtime_test).
class StreamDeviceGuard {
 public:
  explicit StreamDeviceGuard(const Stream& stream);
  StreamDeviceGuard(const StreamDeviceGuard&) = delete;
  StreamDeviceGuard& operator=(const StreamDeviceGuard&) = delete;

 private:
  std::optional<DeviceGuard> guard_;
};

}  // namespace chorus
