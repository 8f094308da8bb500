// Normalization, functional forms. batch_norm normalizes over every dim but dim 1 (channels);
// layer_norm over the trailing `normalized_shape` dims. Both fused: one pass for statistics, one for
// the output, and a fused backward. group_norm and instance_norm run through batch_norm's kernel.
#pragma once

#include <memory>

#include "tensor/tensor.h"

namespace chorus::nn {
class CrossReplicaSum;  // nn/batchnorm.h
}

namespace chorus::nn::functional {

// In training, uses batch statistics and (when running_mean/var are defined) updates them in place:
// running = (1 - momentum) * running + momentum * batch_stat, with the unbiased batch variance, as
// PyTorch. In eval, normalizes with the running statistics. weight/bias may be undefined.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);

// batch_norm in training with statistics summed over every process through `sync` (SyncBatchNorm):
// mean and biased variance of the job's whole batch; the running statistics get the unbiased one.
// Backward sums the per-channel gradient terms across processes too.
Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<CrossReplicaSum>& sync);

// Normalizes each group of num_groups consecutive channels of each sample ([N, C, ...], C divisible
// by num_groups) with its own mean and biased variance, then applies a per-channel weight [C] and
// bias [C] when given. No running statistics: training and eval compute the same.
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// Normalizes each (sample, channel) of [N, C, ...] over its spatial dims. With use_input_stats the
// instance's own statistics are used and, when running_mean/var are given, their batch mean updates
// them as in batch_norm (momentum, unbiased variance); without, the running statistics normalize.
Tensor instance_norm(const Tensor& input, const Tensor& running_mean = Tensor(), const Tensor& running_var = Tensor(),
                     const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool use_input_stats = true,
                     double momentum = 0.1, double eps = 1e-5);

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace chorus::nn::functional
