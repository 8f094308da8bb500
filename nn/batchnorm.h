// Batch normalization layers, as torch.nn.BatchNorm1d/2d: weight (ones) and bias (zeros) when
// affine; buffers running_mean (zeros), running_var (ones) and num_batches_tracked (int64) when
// track_running_stats. Training normalizes with batch statistics and updates the running ones
// (momentum, or a cumulative average when momentum is not given); eval uses the running ones.
#pragma once

#include <optional>

#include "nn/module.h"

namespace chorus::nn {

class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  void reset_running_stats();
  void reset_parameters();

  int64_t num_features;
  double eps;
  std::optional<double> momentum;  // nullopt: cumulative moving average (1 / num_batches_tracked)
  bool affine, track_running_stats;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  BatchNormBase(const char* name, int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                bool track_running_stats);
  virtual void check_input_dim(const Tensor& input) const = 0;
  std::string extra_repr() const override;
};

// Input [N, C] or [N, C, L].
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNormBase("BatchNorm1d", num_features, eps, momentum, affine, track_running_stats) {}

 protected:
  void check_input_dim(const Tensor& input) const override;
};

// Input [N, C, H, W].
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNormBase("BatchNorm2d", num_features, eps, momentum, affine, track_running_stats) {}

 protected:
  void check_input_dim(const Tensor& input) const override;
};

}  // namespace chorus::nn
