// group_norm and instance_norm through batch_norm's fused kernel, as PyTorch's CPU implementation
// of instance_norm does: the input viewed as [1, N*G, ...] (groups) or [1, N*C, ...] (instances)
// makes every group or instance a batch_norm channel, so the statistics, the normalization and its
// backward are batch_norm's. The per-channel affine is applied afterwards (group_norm: a group
// holds several channels with their own weights) or passed in repeated N times (instance_norm).
#include "autograd/grad_mode.h"
#include "autograd/ops/common.h"
#include "nn/functional/normalization.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

namespace {

// weight/bias of shape [C] (or undefined) for an input with C channels in dim 1.
void check_affine(const char* op, const Tensor& input, const Tensor& t, const char* what) {
  if (t.defined() && (t.dim() != 1 || t.size(0) != input.size(1))) {
    fail("{}: {} must have shape [{}] (the input's channel dim, input shape {}), got {}", op, what, input.size(1),
         shape_str(input.sizes()), shape_str(t.sizes()));
  }
}

// [C] -> [1, C, 1, ...] to broadcast over an input of `dims` dims.
Tensor per_channel(const Tensor& t, int64_t dims) {
  Shape s(static_cast<size_t>(dims), 1);
  s[1] = t.size(0);
  return reshape(t, s);
}

}  // namespace

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  // float32 under autocast (PyTorch's list); it came from batch_norm's widening before batch_norm
  // took half inputs as stored, which instance_norm now does too (PyTorch lists no instance_norm).
  if (auto f32 = autocast::full_precision({&input, &weight, &bias})) {
    return group_norm(autocast::cast(input, *f32), num_groups, autocast::cast(weight, *f32),
                      autocast::cast(bias, *f32), eps);
  }
  ops::check_defined(input, "group_norm", "input");
  if (input.dim() < 2) {
    fail("group_norm: expected an input of at least 2 dims [N, C, ...], got shape {}", shape_str(input.sizes()));
  }
  const int64_t n = input.size(0), channels = input.size(1);
  if (num_groups <= 0 || channels % num_groups != 0) {
    fail("group_norm: the {} channels of the input (shape {}) must be divisible by num_groups ({})", channels,
         shape_str(input.sizes()), num_groups);
  }
  check_affine("group_norm", input, weight, "weight");
  check_affine("group_norm", input, bias, "bias");
  if (input.numel() == 0) return mul(input, 1.0);
  // Each group holds (C / G) * spatial values; batch_norm needs more than one to form a variance.
  Tensor grouped = reshape(input, {1, n * num_groups, -1});
  if (grouped.size(2) <= 1) {
    fail("group_norm: each group needs more than one value to normalize, got {} (input shape {}, {} groups)",
         grouped.size(2), shape_str(input.sizes()), num_groups);
  }
  Tensor y = reshape(batch_norm(grouped, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.0, eps), input.sizes());
  if (weight.defined()) y = mul(y, per_channel(weight, input.dim()));
  if (bias.defined()) y = add(y, per_channel(bias, input.dim()));
  return y;
}

Tensor instance_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                     const Tensor& bias, bool use_input_stats, double momentum, double eps) {
  ops::check_defined(input, "instance_norm", "input");
  if (input.dim() < 3) {
    fail("instance_norm: expected an input of at least 3 dims [N, C, ...], got shape {}", shape_str(input.sizes()));
  }
  const int64_t n = input.size(0), channels = input.size(1);
  check_affine("instance_norm", input, weight, "weight");
  check_affine("instance_norm", input, bias, "bias");
  check_affine("instance_norm", input, running_mean, "running_mean");
  check_affine("instance_norm", input, running_var, "running_var");
  if (running_mean.defined() != running_var.defined()) {
    fail("instance_norm: running_mean and running_var must be given together");
  }
  if (!use_input_stats && !running_mean.defined()) {
    fail("instance_norm: use_input_stats=false needs running_mean and running_var");
  }
  if (use_input_stats && input.numel() / std::max<int64_t>(1, n * channels) <= 1) {
    fail("instance_norm: expected more than 1 spatial element per instance when using input statistics, got "
         "input of shape {}",
         shape_str(input.sizes()));
  }
  Shape folded = input.sizes();
  folded[0] = 1;
  folded[1] = n * channels;
  // batch_norm updates these [N*C] copies in place; their mean over the batch becomes the new
  // running statistics, as PyTorch's instance_norm does.
  Tensor rm, rv;
  if (running_mean.defined()) {
    NoGradGuard no_grad;
    rm = repeat(running_mean.detach(), {n});
    rv = repeat(running_var.detach(), {n});
  }
  Tensor w = weight.defined() ? repeat(weight, {n}) : Tensor();
  Tensor b = bias.defined() ? repeat(bias, {n}) : Tensor();
  Tensor y = batch_norm(reshape(input, folded), rm, rv, w, b, use_input_stats, momentum, eps);
  if (use_input_stats && running_mean.defined()) {
    NoGradGuard no_grad;
    Tensor rm_out = running_mean, rv_out = running_var;
    rm_out.copy_(mean(rm.reshape({n, channels}), {0}));
    rv_out.copy_(mean(rv.reshape({n, channels}), {0}));
  }
  return reshape(y, input.sizes());
}

}  // namespace chorus::nn::functional
