// The Reducer: the machinery of the PyTorch DDP paper (Li et al., VLDB 2020). It groups gradients
// into flat buckets, copies each gradient into its bucket the moment autograd finishes it (a
// post-accumulate-grad hook), launches a bucket's allreduce as soon as all its gradients are in —
// strictly in bucket order, so every rank issues the same collectives in the same order — and waits
// for all of them in one engine callback at the end of backward. Backward keeps computing earlier
// layers while later layers' buckets are on the wire: that overlap is where the speed comes from.
#pragma once

#include <chrono>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/streams_seen.h"
#include "tensor/runtime.h"
#include "tensor/tensor.h"

namespace chorus::distributed {

struct Bucket {
  size_t index = 0;
  Tensor buffer;                      // flat, one dtype; gradients (pre-divided by world size)
  std::vector<size_t> params;         // indices into the reducer's parameter list
  std::vector<int64_t> offsets;       // element offset of each parameter in buffer
  std::vector<Tensor> views;          // buffer.narrow(...).view(param shape), one per parameter
  size_t pending = 0;                 // gradients not yet copied in this iteration
  std::shared_ptr<Work> work;         // the collective in flight
  StreamsSeen copied_on;              // on a device: the streams its gradients were copied on this iteration
  std::chrono::steady_clock::time_point first_ready, last_ready, launched, finished;
};

// A communication hook turns a full bucket into a Work whose result()[0] holds the reduced values
// (any dtype; the reducer copies them back into the bucket). The default allreduces in place.
using CommHook = std::function<std::shared_ptr<Work>(ProcessGroup& group, Bucket& bucket)>;
std::shared_ptr<Work> allreduce_hook(ProcessGroup& group, Bucket& bucket);
// Compress to float16 / bfloat16 for the wire, decompress on the way back.
std::shared_ptr<Work> fp16_compress_hook(ProcessGroup& group, Bucket& bucket);
std::shared_ptr<Work> bf16_compress_hook(ProcessGroup& group, Bucket& bucket);

struct ReducerOptions {
  int64_t bucket_cap_bytes = 25ll << 20;
  // The first bucket (the last layers, whose gradients come first) is small so communication
  // starts early instead of waiting for 25 MiB of gradients.
  int64_t first_bucket_cap_bytes = 1ll << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;
};

// Per-iteration timings (microseconds since the iteration's forward started). On the CPU they are
// host clock readings; on a device they come from timed events — the compute stream's (forward
// start and end, each bucket's first gradient and its launch, end of backward) and each bucket
// collective's own start and end events on the communication stream — so the spans show backward
// kernels and bucket allreduces overlapping as the device ran them. Device iterations are resolved
// once their events have passed (stats() waits for the last ones; nothing waits inside a step).
struct IterationStats {
  int64_t iteration = 0;
  double forward_ms = 0, backward_ms = 0, communication_ms = 0, overlapped_ms = 0;
  struct Span {
    std::string name;
    double start_us, end_us;
    int lane;  // 0: compute (backward), 1: communication
  };
  std::vector<Span> spans;
};

class Reducer {
 public:
  Reducer(std::vector<Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> group,
          ReducerOptions options);
  ~Reducer();

  // Called by DDP before each forward (checks the previous iteration finished) and after it
  // (outputs: to find parameters the forward did not reach, when find_unused_parameters).
  void prepare_for_forward();
  void prepare_for_backward(const TensorList& outputs);
  void set_require_sync(bool sync) { require_sync_ = sync; }
  bool require_sync() const { return require_sync_; }
  void register_comm_hook(CommHook hook);
  // join(): on a rank out of data, answers one iteration of the others' gradient collectives
  // (every bucket, in order, with zeros; and the unused-parameter allreduce) without touching .grad.
  void shadow_backward();
  bool rebuilt() const { return rebuilt_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Bucket layout as parameter indices per bucket (for tests and the scaling projection).
  std::vector<std::vector<size_t>> bucket_assignment() const;
  const std::vector<IterationStats>& stats();
  void set_forward_times(std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end);

 private:
  // comm_hook_ on `b`, its Work checked (a hook that returns none is an error naming the bucket).
  std::shared_ptr<Work> checked_hook(Bucket& b);
  void build_buckets(const std::vector<size_t>& order);
  void mark_ready(size_t param);
  // Copies parameter i's gradient into its bucket view, pre-divided by the world size.
  void copy_into_bucket(size_t i, Tensor view);
  void launch_ready_buckets();
  void finalize();
  std::string unready_parameter_names() const;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  std::vector<HookHandle> hooks_;
  CommHook comm_hook_;
  bool custom_hook_ = false;
  bool identity_reduction() const;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> location_;  // param -> (bucket, slot)
  size_t next_to_launch_ = 0;
  std::vector<bool> marked_;
  std::vector<bool> locally_used_;
  std::vector<bool> unused_this_iteration_;
  std::vector<size_t> arrival_order_;
  bool expect_hooks_ = false;        // between prepare_for_backward and finalize
  bool finalize_queued_ = false;
  bool require_sync_ = true;
  bool incomplete_ = false;          // last synced backward did not reduce every bucket
  bool rebuilt_ = false;
  bool static_unused_known_ = false;
  bool unused_pending_ = false;      // the unused parameters of this synced backward are not marked yet
  void mark_unused_ready();
  void queue_finalize();             // once per synced backward: finalize as the engine's callback
  int64_t iteration_ = 0;

  std::chrono::steady_clock::time_point forward_start_, forward_end_, first_ready_;
  std::vector<IterationStats> stats_;

  // Device timing (parameters on a device): the iteration being recorded and those whose events
  // have not all passed yet.
  struct DeviceTiming {
    int64_t iteration = 0;
    Event forward_start{true}, forward_end{true}, backward_end{true};
    std::vector<Event> first_ready, launched;  // per bucket, on the stream the gradients came from
    std::vector<std::shared_ptr<Work>> works;  // per bucket
    std::vector<std::string> names;
  };
  bool records_stats() const { return iteration_ < 10 || iteration_ % 100 == 0; }
  void resolve_device_stats(bool wait);
  std::optional<Device> device_;
  // On a device: recorded where the buckets were made (filled), and the streams ordered after it
  // since ([A bucket's first writes wait for its fill], reducer.cpp).
  Event buckets_made_;
  std::vector<Stream> ordered_after_made_;
  void order_after_buckets_made();
  std::unique_ptr<DeviceTiming> timing_;
  std::vector<DeviceTiming> unresolved_;
};

}  // namespace chorus::distributed
