// Ordering points (and the pipeline's tied-gradient sum) a test may remove, to prove that a test catches their absence (negative
// controls, docs/gpu.md). Release builds cannot remove any: removed() is false unless the process
// links //tensor:test_faults (testonly), which reads CHORUS_TEST_FAULT (names, comma-separated)
// and lets a test switch points in process (tensor/test_faults.h).
#pragma once

namespace chorus::fault {

enum class Point : int {
  kReadyWait,               // the communication stream waits for the caller's ready event (stream_group)
  kEndWait,                 // Work::wait makes the caller's stream wait for the end event (stream_group)
  kGroupRecordStream,       // the process group's record_stream of a collective's tensors (stream_group)
  kAllocatorRecordStream,   // the caching allocator's deferred reuse of blocks used on other streams
  kCallerStream,            // ready recorded on, end waited from, the caller's current stream (not the default)
  kTiedGradientSum,         // a pipeline sums tied parameters' gradients over their stages (pipeline)
  kFsdpGatherWait,          // FSDP waits for a unit's all-gather before copying it out (fsdp)
  kFsdpPreBackwardGather,   // FSDP full_shard gathers a unit again before its backward (fsdp)
  kCount
};
const char* name(Point p);

// True when a test has removed `p`.
bool removed(Point p);

// For //tensor:test_faults only.
using Source = bool (*)(Point);
void install_source(Source s);

}  // namespace chorus::fault
