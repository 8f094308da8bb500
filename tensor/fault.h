// Ordering points (and the pipeline's tied-gradient sum) a test may remove, to prove that a test catches their absence (negative
// controls, docs/gpu.md), and device faults a test may inject (a failing stream task on sim).
// Release builds can do neither: removed() and take_stream_failure() are false unless the process
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
  kHostFunctionThread,      // sim runs every stream's host functions on one thread, as CUDA may (sim)
  kGlooReadyFlag,           // the Gloo lane worker waits for its stream's `ready` word before a group that reads (gloo_communicator)
  kGlooDoneFlag,            // the stream waits for the lane worker's `done` word before copying back (gloo_communicator)
  kSimFreeWaits,            // sim's free blocks the host until the device's streams have passed it, as cudaFree (sim)
  kSimStreamNoDeviceCalls,  // sim's stream tasks run where the runtime and the caching allocator refuse (sim)
  kSimMallocBarrier,        // sim's device allocation orders later work after earlier work, as cudaMalloc (sim)
  kStreamDeviceGuard,       // a call on a stream makes the stream's device current first (runtime, copies)
  kSimPageableCopyWaits,    // sim's copy from pageable host memory waits for its stream first, as CUDA's may (sim)
  kSimSharedQueues,         // sim's streams share hardware queues, where a wait holds up later work, as a GPU's (sim)
  kSimHostFreeWaits,        // sim's host_free blocks the host until every stream has passed it, as cudaFreeHost (sim)
  kSimNewStreamBarrier,     // a stream made after an allocation's barrier starts after the work it held back (sim)
  kSimFreeHoldsDriver,      // sim's free and host_free hold the driver lock while they wait, as cuMemFree's writer lock (sim)
  kSimFailedEventWait,      // a wait for an event recorded on a failed device fails the waiting device too (sim)
  kGlooCollectiveOrder,     // the Gloo lanes post collectives in the order they were issued, across streams (gloo_communicator)
  kGlooStagingReuse,        // a group's page-locked staging blocks are reused only once its stream has passed it (gloo_communicator)
  kSimNcclOrder,            // sim runs each device's Gloo groups one after another, as NCCL a communicator's operations (gloo_communicator)
  kBucketCopyStreams,       // DDP's bucket and FSDP's flat collective wait for every stream their gradients were copied on (reducer, fsdp)
  kAutogradStreams,         // backward ops run on their forward's streams, ordered after the streams that made their gradients (engine)
  kFsdpReductionsBeforeGather,  // FSDP full_shard issues later blocks' reduce-scatters before a block's all-gathers in backward (fsdp)
  kFsdpReduceOutStream,     // FSDP record_streams a reduction's buffers on the stream that reads them after backward (fsdp)
  kSimRecvReady,            // on sim with NCCL's order, a receive is posted only once its stream reaches it, as NCCL's kernel (gloo_communicator)
  kSimProcessFault,         // sim's first device error fails every device of the process, as CUDA documents a kernel fault (sim)
  kPinnedCopyWaits,         // a copy to a device from page-locked host memory waits for its stream before returning (to, copy_)
  kDdpBucketRecordStream,   // DDP record_streams its buckets on the streams that copied into and out of them (reducer)
  kDdpBucketFillOrder,      // a stream's first copy into DDP's buckets waits for their fill on the stream they were made on (reducer)
  kGroupDestroyAborts,      // a destroyed stream-ordered group fails and aborts works past its timeout or with a communicator error (stream_group)
  kSimLibraryHandle,        // sim makes a thread's first product or cuDNN op on a device an allocation and a blocking copy, as cublasCreate/cudnnCreate (kernels/sim)
  kCount
};
const char* name(Point p);

// True when a test has removed `p`.
bool removed(Point p);

// For //tensor:test_faults only.
using Source = bool (*)(Point);
void install_source(Source s);

// Injected device faults (docs/reliability.md, "Device faults"). The sim device asks this for every
// task it is given to run (a kernel, a copy, a host function; not an event record or wait): true,
// once, for the first such task submitted to `stream` after a test armed it
// (fault::fail_next_stream_task in tensor/test_faults.h). That task then fails on the device as a
// CUDA kernel fault does, and the error is sticky for the device (tensor/sim/sim.h).
bool take_stream_failure(const void* stream);
using StreamFailureSource = bool (*)(const void*);
void install_stream_failure_source(StreamFailureSource s);

}  // namespace chorus::fault
