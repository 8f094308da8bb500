#include "tensor/fault.h"

#include <atomic>

namespace chorus::fault {
namespace {
std::atomic<Source> g_source{nullptr};
std::atomic<StreamFailureSource> g_stream_failure_source{nullptr};
}

const char* name(Point p) {
  switch (p) {
    case Point::kReadyWait: return "ready_wait";
    case Point::kEndWait: return "end_wait";
    case Point::kGroupRecordStream: return "group_record_stream";
    case Point::kAllocatorRecordStream: return "allocator_record_stream";
    case Point::kCallerStream: return "caller_stream";
    case Point::kTiedGradientSum: return "tied_gradient_sum";
    case Point::kFsdpGatherWait: return "fsdp_gather_wait";
    case Point::kFsdpPreBackwardGather: return "fsdp_pre_backward_gather";
    case Point::kHostFunctionThread: return "host_function_thread";
    case Point::kGlooReadyFlag: return "gloo_ready_flag";
    case Point::kGlooDoneFlag: return "gloo_done_flag";
    case Point::kSimFreeWaits: return "sim_free_waits";
    case Point::kSimStreamNoDeviceCalls: return "sim_stream_no_device_calls";
    case Point::kSimMallocBarrier: return "sim_malloc_barrier";
    case Point::kStreamDeviceGuard: return "stream_device_guard";
    case Point::kSimPageableCopyWaits: return "sim_pageable_copy_waits";
    case Point::kSimSharedQueues: return "sim_shared_queues";
    case Point::kSimHostFreeWaits: return "sim_host_free_waits";
    case Point::kSimNewStreamBarrier: return "sim_new_stream_barrier";
    case Point::kSimFreeHoldsDriver: return "sim_free_holds_driver";
    case Point::kSimFailedEventWait: return "sim_failed_event_wait";
    case Point::kGlooCollectiveOrder: return "gloo_collective_order";
    case Point::kGlooStagingReuse: return "gloo_staging_reuse";
    case Point::kSimNcclOrder: return "sim_nccl_order";
    case Point::kBucketCopyStreams: return "bucket_copy_streams";
    case Point::kAutogradStreams: return "autograd_streams";
    case Point::kFsdpReductionsBeforeGather: return "fsdp_reductions_before_gather";
    case Point::kFsdpReduceOutStream: return "fsdp_reduce_out_stream";
    case Point::kSimRecvReady: return "sim_recv_ready";
    case Point::kSimProcessFault: return "sim_process_fault";
    case Point::kPinnedCopyWaits: return "pinned_copy_waits";
    case Point::kDdpBucketRecordStream: return "ddp_bucket_record_stream";
    case Point::kDdpBucketFillOrder: return "ddp_bucket_fill_order";
    case Point::kGroupDestroyAborts: return "group_destroy_aborts";
    case Point::kSimLibraryHandle: return "sim_library_handle";
    case Point::kCount: break;
  }
  return "?";
}

bool removed(Point p) {
  const Source s = g_source.load(std::memory_order_relaxed);
  return s != nullptr && s(p);
}

void install_source(Source s) { g_source.store(s); }

bool take_stream_failure(const void* stream) {
  const StreamFailureSource s = g_stream_failure_source.load(std::memory_order_relaxed);
  return s != nullptr && s(stream);
}

void install_stream_failure_source(StreamFailureSource s) { g_stream_failure_source.store(s); }

}  // namespace chorus::fault
