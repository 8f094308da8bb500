// Several process groups over the same ranks, used in turn: each collective goes to the next group,
// so that more than one collective can be in flight at once and the links stay busy (the DDP
// paper's round-robin process groups; PyTorch's _round_robin_process_groups). Give it to DDP as its
// group: its buckets' allreduces then go to the groups in turn.
//
//   auto rr = distributed::round_robin_process_groups(2);   // every rank calls it, in the same order
//   DistributedDataParallel ddp(model, rr);
//
// Each group runs its collectives in issue order, and every rank issues the same sequence, so the
// k-th collective lands in the same group on every rank and pairs up. Point-to-point operations
// always use the first group (a send and its receive are counted on different ranks, so a turn
// counter could not pair them); a barrier passes through every group.
#pragma once

#include <memory>
#include <vector>

#include "distributed/process_group.h"

namespace chorus::distributed {

class RoundRobinProcessGroup : public ProcessGroup {
 public:
  // At least one group; all of the same size, with this process at the same rank in each.
  explicit RoundRobinProcessGroup(std::vector<std::shared_ptr<ProcessGroup>> groups);
  std::string backend_name() const override;

  std::shared_ptr<Work> allreduce(const TensorList& tensors, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const TensorList& tensors, int root) override;
  std::shared_ptr<Work> allgather(const TensorList& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_to_all(const TensorList& outputs, const TensorList& inputs) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) override;

  const std::vector<std::shared_ptr<ProcessGroup>>& groups() const { return groups_; }

 private:
  ProcessGroup& next();
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
  size_t turn_ = 0;
};

// `count` new groups over every rank of the default group (new_group; every rank calls it, in the
// same order), wrapped in one RoundRobinProcessGroup.
std::shared_ptr<ProcessGroup> round_robin_process_groups(int count);

}  // namespace chorus::distributed
