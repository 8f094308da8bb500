// Batch normalization layers, as torch.nn.BatchNorm1d/2d: weight (ones) and bias (zeros) when
// affine; buffers running_mean (zeros), running_var (ones) and num_batches_tracked (int64) when
// track_running_stats. Training normalizes with batch statistics and updates the running ones
// (momentum, or a cumulative average when momentum is not given); eval uses the running ones.
#pragma once

#include <optional>

#include "nn/module.h"

namespace chorus::nn {

// Sums tensors over the processes of a data-parallel job. nn knows nothing of process groups:
// distributed::convert_sync_batchnorm installs one built on a ProcessGroup, which turns every
// BatchNorm into a synchronized one (PyTorch's SyncBatchNorm).
class CrossReplicaSum {
 public:
  virtual ~CrossReplicaSum() = default;
  virtual void all_reduce_sum(Tensor& t) = 0;  // in place, float64
  virtual int world_size() const = 0;
};

// The affine parameters and running statistics every normalization layer with PyTorch's names
// has (BatchNorm*, InstanceNorm*): registered on `m` as weight/bias (when affine) and
// running_mean/running_var/num_batches_tracked (when track), and reset to 1/0 and 0/1/0.
struct NormState {
  Tensor& weight;
  Tensor& bias;
  Tensor& running_mean;
  Tensor& running_var;
  Tensor& num_batches_tracked;
  void register_on(Module& m, int64_t features, bool affine, bool track);
  void reset_running_stats(bool track);
  void reset_parameters(bool affine, bool track);
};

class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  // With a CrossReplicaSum over more than one process, training uses the statistics of the whole
  // job's batch (and the input gradient accounts for every process's loss); eval is unchanged.
  void set_sync(std::shared_ptr<CrossReplicaSum> sync) { sync_ = std::move(sync); }
  const std::shared_ptr<CrossReplicaSum>& sync() const { return sync_; }
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

 private:
  NormState state() { return {weight, bias, running_mean, running_var, num_batches_tracked}; }
  std::shared_ptr<CrossReplicaSum> sync_;
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
