// A stream-ordered process group: collectives on device tensors run on a dedicated, high-priority
// communication stream, ordered against the compute stream by events, so the host never blocks
// inside a training step. Written once over the device runtime (tensor/runtime.h) and a host
// communicator: here the Gloo group, run by the communication stream's worker on the device buffer
// (the sim device, in CI); ProcessGroupNCCL will put NCCL under the same ordering.
//
// [Sync Streams] For each collective: record `ready` on the caller's current stream; the
// communication stream waits on it (so the collective reads what the compute stream wrote, e.g. a
// bucket DDP filled), runs the collective, and records `end`. Work::wait() makes the caller's
// current stream wait on `end` (no host block: later kernels, e.g. DDP's copy back to .grad, run
// after the collective); Work::synchronize() blocks the host. The task holds its tensors, so their
// memory lives until the collective has run; the caching allocator also gets record_stream(comm),
// so a tensor freed by the host is not reused by the compute stream before the collective is done.
// CPU tensors go straight to the host group, as before.
//
// CUDA tensors cannot be read by Gloo: they are staged through pinned host memory on the
// communication stream (copy to host, the collective on the host copies, copy back, then the end
// event), so several ranks can share one GPU (NCCL refuses that). The pinned buffers are freed once
// the end event has passed. CI runs this path on sim tensors with stage_through_host_for_testing.
#pragma once

#include <memory>
#include <string>

#include "distributed/process_group.h"
#include "tensor/runtime.h"

namespace chorus::distributed {

// A Work whose completion is an event on a communication stream.
class StreamWork : public Work {
 public:
  StreamWork(std::string description, Device device, TensorList outputs);
  // Orders the caller's current stream after the collective; raises its error if it has failed.
  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt) override;
  // Blocks the host until the collective has finished (and rethrows its error).
  void synchronize();
  const TensorList& result() const override { return outputs_; }
  Event& end_event() { return end_; }

 private:
  Device device_;
  TensorList outputs_;
  Event end_;
};

class StreamOrderedGroup final : public ProcessGroup {
 public:
  explicit StreamOrderedGroup(std::shared_ptr<ProcessGroup> host);
  ~StreamOrderedGroup() override;

  std::string backend_name() const override { return host_->backend_name(); }
  std::shared_ptr<Work> allreduce(const TensorList& tensors, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const TensorList& tensors, int root) override;
  std::shared_ptr<Work> allgather(const TensorList& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const TensorList& inputs,
                                       ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) override;

  const std::shared_ptr<ProcessGroup>& host_group() const { return host_; }
  // The communication streams of `device` for this group (high priority, from the device's pool):
  // one for collectives, and one each for sends and receives, so that a send waiting for its
  // peer's receive (a ring: isend then irecv) never holds up this rank's receive.
  enum class Lane { Collective, Send, Recv };
  Stream comm_stream(Device device, Lane lane = Lane::Collective);

  // Test-only: leave out both event waits of [Sync Streams], so a test can show that without them
  // the results go wrong (with the sim device's delays).
  static void skip_stream_waits_for_testing(bool skip);
  // Test-only: stage sim tensors through pinned host memory as CUDA tensors always are, so CI runs
  // that path (see ordered()).
  static void stage_through_host_for_testing(bool stage);

 private:
  // Runs `collective` (over CPU-device aliases of the device tensors) on the communication stream.
  std::shared_ptr<Work> ordered(const std::string& name, const TensorList& tensors, TensorList outputs,
                                std::function<std::shared_ptr<Work>(ProcessGroup&, const TensorList&)> collective,
                                Lane lane = Lane::Collective, bool writes = true);
  // Frees the pinned staging buffers whose collectives have finished (all of them, waiting, when
  // `all`).
  void release_staging(bool all);

  // A collective that failed on a communication stream (a dead or stuck peer: the host
  // communicator's timeout ends it) is raised on the caller's thread at its next call into the
  // group, naming the collective, its sequence number and the error, as PyTorch's NCCL watchdog
  // does; nothing hangs, since the failed collective still completes its end event.
  void raise_async_error();
  // Collectives reach the host communicator in the order the caller issued them, on every rank: a
  // CPU collective issued after device collectives waits (on the host) until the communication
  // streams have handed those to the communicator; otherwise ranks whose streams run at different
  // speeds would pair different collectives.
  struct IssueOrder;
  void wait_until_issued();

  std::shared_ptr<ProcessGroup> host_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<StreamWork>> in_flight_;
  struct Staging {
    Device device;
    std::shared_ptr<StreamWork> work;  // its end event passes after the copies back
    std::vector<void*> buffers;
  };
  std::vector<Staging> staging_;
  std::shared_ptr<IssueOrder> issue_order_;
  std::vector<std::pair<std::pair<Device, Lane>, Stream>> comm_streams_;
  uint64_t sequence_ = 0;
};

}  // namespace chorus::distributed
