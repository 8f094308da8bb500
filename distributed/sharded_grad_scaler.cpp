#include "distributed/sharded_grad_scaler.h"

#include <utility>

#include "tensor/ops.h"

namespace chorus::distributed {

ShardedGradScaler::ShardedGradScaler(std::shared_ptr<ProcessGroup> group, optim::GradScalerOptions options)
    : optim::GradScaler(options), group_(std::move(group)) {
  if (!group_) fail("ShardedGradScaler: the process group is null");
}

bool ShardedGradScaler::combine_found_inf(bool found_inf) {
  Tensor flag = full({1}, found_inf ? 1 : 0, {.dtype = kInt32});
  group_->allreduce({flag}, ReduceOp::Max)->wait();
  return flag.data_ptr<int32_t>()[0] != 0;
}

}  // namespace chorus::distributed
