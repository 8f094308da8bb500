#include "distributed/sync_batchnorm.h"

#include "nn/batchnorm.h"

namespace chorus::distributed {
namespace {

class GroupSum final : public nn::CrossReplicaSum {
 public:
  explicit GroupSum(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}
  void all_reduce_sum(Tensor& t) override { group_->allreduce({t}, ReduceOp::Sum)->wait(); }
  int world_size() const override { return group_->size(); }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

int64_t convert_sync_batchnorm(nn::Module& module, std::shared_ptr<ProcessGroup> group) {
  if (!group) fail("convert_sync_batchnorm: the process group is null");
  auto sum = std::make_shared<GroupSum>(std::move(group));
  int64_t converted = 0;
  module.apply([&](nn::Module& m) {
    if (auto* bn = dynamic_cast<nn::BatchNormBase*>(&m)) {
      bn->set_sync(sum);
      ++converted;
    }
  });
  return converted;
}

}  // namespace chorus::distributed
