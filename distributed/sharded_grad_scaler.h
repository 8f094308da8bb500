// GradScaler where each process's optimizer holds only part of the model (PyTorch's
// ShardedGradScaler): FSDP's shards, a pipeline stage's parameters. An overflow lands in one rank's
// shard after the reduce-scatter; with a plain GradScaler that rank alone skips its step and backs
// its scale off, and from then on the ranks scale the loss differently and their summed gradients
// are wrong. Here unscale_ agrees over `group` (a MAX allreduce of the found-inf flag, a CPU
// tensor): every rank skips or steps together and keeps the same scale. Every rank must call
// unscale_ (or step) for the same optimizers in the same order, as it must call the collectives.
//
//   distributed::ShardedGradScaler scaler(group);           // GradScalerOptions as the second argument
//   scaler.scale(loss).backward();  scaler.step(opt);  scaler.update();
#pragma once

#include <memory>

#include "distributed/process_group.h"
#include "optim/grad_scaler.h"

namespace chorus::distributed {

class ShardedGradScaler : public optim::GradScaler {
 public:
  explicit ShardedGradScaler(std::shared_ptr<ProcessGroup> group, optim::GradScalerOptions options = {});

 protected:
  bool combine_found_inf(bool found_inf) override;

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace chorus::distributed
