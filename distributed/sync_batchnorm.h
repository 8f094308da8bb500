// SyncBatchNorm, as torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm1d/2d inside a
// module computes its training statistics over the whole job's batch (one allreduce of
// per-channel sums in forward, one of the gradient sums in backward) through `group`. Parameters,
// buffers and names are unchanged, so checkpoints load either way; eval is plain BatchNorm. Under
// DDP the weight and bias gradients are this rank's and DDP's averaging makes them the full batch's.
#pragma once

#include <memory>

#include "distributed/process_group.h"
#include "nn/module.h"

namespace chorus::distributed {

// Returns how many BatchNorm modules now synchronize. A group of one changes nothing in results.
int64_t convert_sync_batchnorm(nn::Module& module, std::shared_ptr<ProcessGroup> group);

}  // namespace chorus::distributed
