// Removing ordering points in a test (tensor/fault.h): link //tensor:test_faults (testonly).
// CHORUS_TEST_FAULT=name,name... removes them from the start (an unknown name ends the process
// with a message listing the known ones); set_removed switches one in process.
#pragma once

#include "tensor/fault.h"
#include "tensor/runtime.h"

namespace chorus::fault {

void set_removed(Point p, bool removed);

// The next task submitted to `stream` (a sim stream) fails when it runs, as a CUDA kernel fault
// would, and the device's error is sticky from then on: every later call on that device fails
// (tensor/sim/sim.h). Only sim devices honour it; one arming fails one task.
void fail_next_stream_task(const Stream& stream);

// Removes `p` while in scope.
class RemovedScope {
 public:
  explicit RemovedScope(Point p) : p_(p) { set_removed(p, true); }
  ~RemovedScope() { set_removed(p_, false); }
  RemovedScope(const RemovedScope&) = delete;
  RemovedScope& operator=(const RemovedScope&) = delete;

 private:
  Point p_;
};

}  // namespace chorus::fault
