// The stream-order sanitizer: finds device work that reads or writes memory another stream may
// still be using, as PyTorch's CUDA Sanitizer (TORCH_CUDA_SANITIZER) does, at chorus's seams
// (kernel dispatch, copies, collectives, events, synchronizations, the caching allocator), so it
// checks sim and cuda alike.
//
// The model (vector clocks, one component per stream):
// - Every launch on stream S (a kernel, a copy, a collective) is an epoch of S: S's own component
//   counts them. An access records (S, epoch, byte range, read or write, op name).
// - Event::record on S captures S's clock; stream.wait(event) merges the captured clock into the
//   stream's (at the call, as CUDA captures the latest record). A host synchronization (stream,
//   event, device; a query that returned "done") merges what it observed into the calling thread's
//   clock, and every later launch from that thread merges it first: work a thread issues after it
//   saw work finish is ordered after it. (Per thread: a watchdog's successful query orders nothing
//   the training thread issues, so verdicts follow the program's synchronizations, not timing.)
// - A launch on S that touches a range another stream T wrote (or, for a write, read) at epoch e is
//   ordered only if S's clock has T's component >= e. Otherwise: a report.
// - Memory is tracked per caching-allocator block. A freed block keeps its accesses; when the
//   allocator hands the memory out again on stream S, every access of the old block by another
//   stream must be ordered before S's clock (record_stream + the allocator's event queries do that;
//   so does an event wait). Otherwise: a report ("freed and reused while ... may still use it").
//
// A report names both accesses (op, stream, device, range) and the block, goes to stderr, and is
// thrown as a chorus::Error from the host call that issued the unordered work (the launch does not
// happen). CHORUS_STREAM_SANITIZER: unset = on for sim, off for cuda; 1 = on for both; 0 = off.
// What it cannot see: accesses inside a kernel beyond the tensors it was given, NCCL's and cuDNN's
// internals, and host threads touching pinned memory (docs/gpu.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/device.h"
#include "tensor/runtime.h"

namespace chorus {
class Tensor;
}

namespace chorus::stream_sanitizer {

// Whether the sanitizer checks work on devices of `type` (cheap: one atomic load).
bool active(DeviceType type);
// Turns it on or off for `type` in this process (tests), overriding CHORUS_STREAM_SANITIZER.
void set_active(DeviceType type, bool on);
// Reports so far in this process.
uint64_t reports();

struct Access {
  const void* ptr = nullptr;
  size_t bytes = 0;
  bool write = false;
};
// The bytes a tensor's elements span (a view's extent within its storage); bytes 0 when empty.
Access access_of(const Tensor& t, bool write);

// `op` is launched on `stream` of `device` and touches `accesses` (ranges outside every block the
// allocator handed out are ignored). Throws chorus::Error after reporting an unordered access.
void on_launch(const char* op, Device device, StreamHandle stream, const std::vector<Access>& accesses);
// The same check without recording anything: for work whose launch may still be refused after the
// check (a collective group its communicator takes op by op), so that a report stops it before any
// of it runs; on_launch records it once it was launched.
void check_launch(const char* op, Device device, StreamHandle stream, const std::vector<Access>& accesses);
void on_record(EventHandle event, Device device, StreamHandle stream);
void on_wait(StreamHandle stream, Device device, EventHandle event);
// The host saw the event's latest record complete (a query that returned true, a synchronize).
void on_event_done(EventHandle event);
void on_event_destroyed(EventHandle event);
// The host saw all work submitted to the stream so far complete. Streams are known by device and
// handle: on CUDA every device's default stream is the one handle 0.
void on_stream_done(StreamHandle stream, Device device);
void on_device_done(Device device);
// The caching allocator handed `bytes` at `ptr` out on `stream`, or took the block at `ptr` back.
void on_allocate(Device device, const void* ptr, size_t bytes, StreamHandle stream);
void on_free(Device device, const void* ptr);

}  // namespace chorus::stream_sanitizer
