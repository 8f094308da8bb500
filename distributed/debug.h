// Debug mode (CHORUS_DISTRIBUTED_DEBUG=DETAIL): a ProcessGroup wrapper that, before each collective,
// has every rank share a fingerprint of what it is about to run (op, sequence number, shapes,
// dtypes, root) and compares them. A mismatch — ranks calling different collectives, or the same
// one with different shapes — becomes a chorus::Error naming the ranks and both fingerprints,
// instead of a hang or silently corrupted data. It costs one small allgather per collective.
#pragma once

#include <memory>

#include "distributed/process_group.h"

namespace chorus::distributed {

class ProcessGroupDebug : public ProcessGroup {
 public:
  explicit ProcessGroupDebug(std::shared_ptr<ProcessGroup> inner);
  std::string backend_name() const override { return inner_->backend_name() + "+debug"; }

  std::shared_ptr<Work> allreduce(const TensorList& tensors, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const TensorList& tensors, int root) override;
  std::shared_ptr<Work> allgather(const TensorList& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_to_all(const TensorList& outputs, const TensorList& inputs) override;
  std::shared_ptr<Work> barrier() override;
  void start_coalescing() override { inner_->start_coalescing(); }
  std::shared_ptr<Work> end_coalescing() override { return inner_->end_coalescing(); }
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) override;
  const std::shared_ptr<ProcessGroup>& inner() const { return inner_; }

 private:
  void check(const std::string& fingerprint);
  std::shared_ptr<ProcessGroup> inner_;
  uint64_t sequence_ = 0;
};

// True when CHORUS_DISTRIBUTED_DEBUG is DETAIL.
bool debug_mode_enabled();

}  // namespace chorus::distributed
