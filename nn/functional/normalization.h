// Normalization, functional forms. batch_norm normalizes over every dim but dim 1 (channels);
// layer_norm over the trailing `normalized_shape` dims. Both fused: one pass for statistics, one for
// the output, and a fused backward.
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

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace chorus::nn::functional
