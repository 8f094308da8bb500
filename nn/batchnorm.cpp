#include "nn/batchnorm.h"

#include "autograd/grad_mode.h"
#include "nn/functional/normalization.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::nn {

BatchNormBase::BatchNormBase(const char* name, int64_t features, double eps_, std::optional<double> momentum_,
                             bool affine_, bool track)
    : Module(name), num_features(features), eps(eps_), momentum(momentum_), affine(affine_), track_running_stats(track) {
  if (features <= 0) fail("{}: num_features must be positive, got {}", name, features);
  state().register_on(*this, features, affine, track);
  reset_parameters();
}

void NormState::register_on(Module& m, int64_t features, bool affine, bool track) {
  if (affine) {
    weight = m.register_parameter("weight", empty({features}));
    bias = m.register_parameter("bias", empty({features}));
  }
  if (track) {
    running_mean = m.register_buffer("running_mean", zeros({features}));
    running_var = m.register_buffer("running_var", ones({features}));
    num_batches_tracked = m.register_buffer("num_batches_tracked", zeros({}, TensorOptions{.dtype = kInt64}));
  }
}

void NormState::reset_running_stats(bool track) {
  if (!track) return;
  NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void NormState::reset_parameters(bool affine, bool track) {
  reset_running_stats(track);
  if (affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

void BatchNormBase::reset_running_stats() { state().reset_running_stats(track_running_stats); }

void BatchNormBase::reset_parameters() { state().reset_parameters(affine, track_running_stats); }

Tensor BatchNormBase::forward(const Tensor& input) {
  check_input_dim(input);
  if (input.dim() >= 2 && input.size(1) != num_features) {
    fail("{}: expected input with {} channels (dim 1), got shape {}", type_name(), num_features,
         shape_str(input.sizes()));
  }
  double factor = momentum.value_or(0.0);
  if (is_training() && track_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    if (!momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  // Without running statistics, eval also normalizes with batch statistics (as PyTorch).
  const bool use_batch_stats = is_training() || !track_running_stats;
  if (is_training() && sync_ && sync_->world_size() > 1) {
    return functional::sync_batch_norm(input, running_mean, running_var, weight, bias, factor, eps, sync_);
  }
  return functional::batch_norm(input, running_mean, running_var, weight, bias, use_batch_stats, factor, eps);
}

std::string BatchNormBase::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features, eps,
                     momentum ? fmt::format("{}", *momentum) : "None", affine, track_running_stats);
}

void BatchNorm1d::check_input_dim(const Tensor& input) const {
  if (input.dim() != 2 && input.dim() != 3) {
    fail("BatchNorm1d: expected a 2-D [N, C] or 3-D [N, C, L] input, got shape {}", shape_str(input.sizes()));
  }
}

void BatchNorm2d::check_input_dim(const Tensor& input) const {
  if (input.dim() != 4) fail("BatchNorm2d: expected a 4-D [N, C, H, W] input, got shape {}", shape_str(input.sizes()));
}

}  // namespace chorus::nn
