// GroupNorm and InstanceNorm1d/2d, as torch.nn's: GroupNorm has weight (ones) and bias (zeros) of
// [num_channels] when affine; InstanceNorm has them only with affine=true (default false), and the
// buffers running_mean, running_var and num_batches_tracked only with track_running_stats=true
// (default false), which eval() then normalizes with. BatchNorm is nn/batchnorm.h.
#pragma once

#include "nn/batchnorm.h"
#include "nn/module.h"

namespace chorus::nn {

// Input [N, C, ...] with C = num_channels.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& input) override;
  void reset_parameters();

  int64_t num_groups, num_channels;
  double eps;
  bool affine;
  Tensor weight, bias;

 protected:
  std::string extra_repr() const override;
};

class InstanceNormBase : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  void reset_running_stats();
  void reset_parameters();

  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  InstanceNormBase(const char* name, int64_t num_features, double eps, double momentum, bool affine,
                   bool track_running_stats, int64_t spatial_dims);
  std::string extra_repr() const override;

 private:
  NormState state() { return {weight, bias, running_mean, running_var, num_batches_tracked}; }
  int64_t spatial_dims_;
};

// Input [N, C, L] or unbatched [C, L].
class InstanceNorm1d : public InstanceNormBase {
 public:
  explicit InstanceNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = false,
                          bool track_running_stats = false)
      : InstanceNormBase("InstanceNorm1d", num_features, eps, momentum, affine, track_running_stats, 1) {}
};

// Input [N, C, H, W] or unbatched [C, H, W].
class InstanceNorm2d : public InstanceNormBase {
 public:
  explicit InstanceNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = false,
                          bool track_running_stats = false)
      : InstanceNormBase("InstanceNorm2d", num_features, eps, momentum, affine, track_running_stats, 2) {}
};

}  // namespace chorus::nn
