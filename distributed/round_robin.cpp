#include "distributed/round_robin.h"

#include <numeric>

#include "distributed/init.h"
#include "tensor/error.h"

namespace chorus::distributed {

namespace {

int checked_rank(const std::vector<std::shared_ptr<ProcessGroup>>& groups) {
  if (groups.empty()) fail("RoundRobinProcessGroup: no groups; expected at least one");
  for (size_t i = 0; i < groups.size(); ++i) {
    if (!groups[i]) fail("RoundRobinProcessGroup: group {} is null (this rank is not in it)", i);
    if (groups[i]->size() != groups[0]->size() || groups[i]->rank() != groups[0]->rank()) {
      fail("RoundRobinProcessGroup: group {} has this process at rank {} of {}, group 0 at rank {} of {}; expected "
           "groups over the same ranks",
           i, groups[i]->rank(), groups[i]->size(), groups[0]->rank(), groups[0]->size());
    }
  }
  return groups[0]->rank();
}

}  // namespace

RoundRobinProcessGroup::RoundRobinProcessGroup(std::vector<std::shared_ptr<ProcessGroup>> groups)
    : ProcessGroup(checked_rank(groups), groups.front()->size()), groups_(std::move(groups)) {}

std::string RoundRobinProcessGroup::backend_name() const {
  return fmt::format("round_robin({} x {})", groups_.size(), groups_[0]->backend_name());
}

ProcessGroup& RoundRobinProcessGroup::next() {
  ProcessGroup& g = *groups_[turn_];
  turn_ = (turn_ + 1) % groups_.size();
  return g;
}

std::shared_ptr<Work> RoundRobinProcessGroup::allreduce(const TensorList& tensors, ReduceOp op) {
  return track(next().allreduce(tensors, op));
}
std::shared_ptr<Work> RoundRobinProcessGroup::broadcast(const TensorList& tensors, int root) {
  return track(next().broadcast(tensors, root));
}
std::shared_ptr<Work> RoundRobinProcessGroup::allgather(const TensorList& outputs, const Tensor& input) {
  return track(next().allgather(outputs, input));
}
std::shared_ptr<Work> RoundRobinProcessGroup::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op) {
  return track(next().reduce_scatter(output, inputs, op));
}
std::shared_ptr<Work> RoundRobinProcessGroup::all_to_all(const TensorList& outputs, const TensorList& inputs) {
  return track(next().all_to_all(outputs, inputs));
}
std::shared_ptr<Work> RoundRobinProcessGroup::barrier() {
  std::vector<std::shared_ptr<Work>> parts;
  for (auto& g : groups_) parts.push_back(g->barrier());
  return track(joined_work(fmt::format("barrier over {} round-robin groups", groups_.size()), std::move(parts)));
}
std::shared_ptr<Work> RoundRobinProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  return track(groups_[0]->send(tensor, dst, tag));
}
std::shared_ptr<Work> RoundRobinProcessGroup::recv(const Tensor& tensor, int src, int tag) {
  return track(groups_[0]->recv(tensor, src, tag));
}

std::shared_ptr<ProcessGroup> round_robin_process_groups(int count) {
  if (count < 1) fail("round_robin_process_groups: {} groups; expected at least 1", count);
  auto world = default_group();
  if (!world) fail("round_robin_process_groups: no default group (call init_process_group first)");
  std::vector<int> ranks(static_cast<size_t>(world->size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  for (int i = 0; i < count; ++i) groups.push_back(new_group(ranks));
  return std::make_shared<RoundRobinProcessGroup>(std::move(groups));
}

}  // namespace chorus::distributed
