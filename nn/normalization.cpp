#include "nn/normalization.h"

#include "autograd/grad_mode.h"
#include "nn/functional/normalization.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::nn {

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine_)
    : Module("GroupNorm"), num_groups(groups), num_channels(channels), eps(eps_), affine(affine_) {
  if (groups <= 0 || channels <= 0 || channels % groups != 0) {
    fail("GroupNorm: num_channels ({}) must be positive and divisible by num_groups ({})", channels, groups);
  }
  if (affine) {
    weight = register_parameter("weight", empty({channels}));
    bias = register_parameter("bias", empty({channels}));
  }
  reset_parameters();
}

void GroupNorm::reset_parameters() {
  if (!affine) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor GroupNorm::forward(const Tensor& input) {
  if (input.dim() < 2 || input.size(1) != num_channels) {
    fail("GroupNorm: expected an input [N, {}, ...] ({} channels in dim 1), got shape {}", num_channels, num_channels,
         shape_str(input.sizes()));
  }
  return functional::group_norm(input, num_groups, weight, bias, eps);
}

std::string GroupNorm::extra_repr() const {
  return fmt::format("{}, {}, eps={}, affine={}", num_groups, num_channels, eps, affine);
}

InstanceNormBase::InstanceNormBase(const char* name, int64_t features, double eps_, double momentum_, bool affine_,
                                   bool track, int64_t spatial_dims)
    : Module(name),
      num_features(features),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track),
      spatial_dims_(spatial_dims) {
  if (features <= 0) fail("{}: num_features must be positive, got {}", name, features);
  state().register_on(*this, features, affine, track);
  reset_parameters();
}

void InstanceNormBase::reset_running_stats() { state().reset_running_stats(track_running_stats); }

void InstanceNormBase::reset_parameters() { state().reset_parameters(affine, track_running_stats); }

Tensor InstanceNormBase::forward(const Tensor& input) {
  const int64_t batched = spatial_dims_ + 2;
  if (input.dim() != batched && input.dim() != batched - 1) {
    fail("{}: expected a {}-D (batched) or {}-D (unbatched) input, got shape {}", type_name(), batched, batched - 1,
         shape_str(input.sizes()));
  }
  const bool unbatched = input.dim() == batched - 1;
  const Tensor x = unbatched ? unsqueeze(input, 0) : input;
  if (x.size(1) != num_features) {
    fail("{}: expected input with {} channels (dim {}), got shape {}", type_name(), num_features, unbatched ? 0 : 1,
         shape_str(input.sizes()));
  }
  // PyTorch's _InstanceNorm leaves num_batches_tracked alone: it is there for state_dict parity only.
  Tensor y = functional::instance_norm(x, running_mean, running_var, weight, bias,
                                       is_training() || !track_running_stats, momentum, eps);
  return unbatched ? squeeze(y, 0) : y;
}

std::string InstanceNormBase::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features, eps, momentum, affine,
                     track_running_stats);
}

}  // namespace chorus::nn
