// batch_norm: fused per-channel statistics and affine output, running-statistics update, and a fused
// backward (training formula when batch statistics were used, the affine one in eval).
// A float16/bfloat16 input is normalized as it is stored, with float32 weight, bias and statistics (the
// kernel computes in float): cuDNN's and PyTorch's batch norm, which autocast leaves in the input's dtype.
#include "autograd/node.h"
#include "autograd/ops/common.h"
#include "autograd/grad_mode.h"
#include "kernels/dispatch.h"
#include "nn/batchnorm.h"
#include "nn/functional/normalization.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

using autograd::SavedTensor;

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  ops::check_defined(input, "batch_norm", "input");
  ops::check_kernels(input, "batch_norm");
  if (input.dim() < 2) {
    fail("batch_norm: expected an input of at least 2 dims [N, C, ...], got shape {}", shape_str(input.sizes()));
  }
  if (!input.is_floating_point()) {
    fail("batch_norm: expected a floating-point input, got {}", dtype_name(input.dtype()));
  }
  const int64_t n = input.size(0), c = input.size(1);
  const int64_t s = c == 0 || n == 0 ? 0 : input.numel() / (n * c);
  const Tensor* named[] = {&running_mean, &running_var, &weight, &bias};
  const char* names[] = {"running_mean", "running_var", "weight", "bias"};
  for (int i = 0; i < 4; ++i) {
    if (named[i]->defined() && (named[i]->dim() != 1 || named[i]->size(0) != c)) {
      fail("batch_norm: {} must have shape [{}] (the input's channel dim, input shape {}), got {}", names[i], c,
           shape_str(input.sizes()), shape_str(named[i]->sizes()));
    }
  }
  if (running_mean.defined() != running_var.defined()) {
    fail("batch_norm: running_mean and running_var must be given together");
  }
  if (!training && !running_mean.defined()) {
    fail("batch_norm: eval mode needs running_mean and running_var (a layer built with track_running_stats=false "
         "normalizes with batch statistics instead)");
  }
  if (training && n * s <= 1) {
    fail("batch_norm: expected more than 1 value per channel when training, got input of shape {}",
         shape_str(input.sizes()));
  }
  // The [C] tensors in the dtype the kernel computes in (float32 for a float16/bfloat16 input).
  const DType cd = compute_dtype(input.dtype());
  auto compute = [cd](const Tensor& t) {
    return t.defined() ? ops::cast(alias_without_history(t), cd).contiguous() : Tensor();
  };
  // A channels-last input stays channels-last: its memory is [N*H*W, C] rows, which the kernels take
  // as n = N*H*W samples of c channels with s = 1 position each.
  const MemoryFormat format = input.suggest_memory_format();
  const bool nhwc = format == MemoryFormat::ChannelsLast;
  const int64_t kn = nhwc ? n * s : n, ks = nhwc ? 1 : s;
  Tensor x = alias_without_history(input).contiguous(format), w = compute(weight), b = compute(bias);
  // The running statistics are updated in place; a float16 buffer goes through a float copy.
  Tensor rm = compute(running_mean), rv = compute(running_var);
  Tensor out = make_tensor(input.sizes(), input.dtype(), input.device(), format);
  Tensor save_mean = make_tensor({c}, cd, input.device());
  Tensor save_rstd = make_tensor({c}, cd, input.device());
  kernels::batch_norm(out, save_mean, save_rstd, x, w, b, rm, rv, training, momentum, eps, kn, c, ks);
  if (training && running_mean.defined()) {
    NoGradGuard no_grad;
    for (auto [buf, upd] : {std::pair{running_mean, rm}, std::pair{running_var, rv}}) {
      if (buf.raw_data_ptr() != upd.raw_data_ptr()) Tensor(buf).copy_(upd);  // bumps the version
      else buf.bump_version();
    }
  }
  if (autograd::any_requires_grad({&input, &weight, &bias})) {
    const bool need_x = input.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    SavedTensor sx(x), sw(w);
    autograd::record("NativeBatchNormBackward", {input, weight, bias}, {out},
                     [=](const TensorList& g) -> TensorList {
                       Tensor xv = sx.unpack("batch_norm"), wv = sw.unpack("batch_norm");
                       Tensor gv = ops::cast(g[0], xv.dtype()).contiguous(format);
                       Tensor gx = need_x ? make_tensor(xv.sizes(), xv.dtype(), xv.device(), format) : Tensor();
                       Tensor gw = need_w ? make_tensor({c}, cd, xv.device()) : Tensor();
                       Tensor gb = need_b ? make_tensor({c}, cd, xv.device()) : Tensor();
                       kernels::batch_norm_backward(gx, gw, gb, gv, xv, save_mean, save_rstd, wv, training,
                                                         kn, c, ks);
                       return {gx, gw, gb};
                     });
  }
  return out;
}

Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<CrossReplicaSum>& sync) {
  ops::check_defined(input, "sync_batch_norm", "input");
  if (!sync) fail("sync_batch_norm: no CrossReplicaSum given");
  if (input.dim() < 2) fail("sync_batch_norm: expected an input of at least 2 dims [N, C, ...], got {}", shape_str(input.sizes()));
  if (!input.is_floating_point()) {
    fail("sync_batch_norm: expected a floating-point input, got {}", dtype_name(input.dtype()));
  }
  const int64_t n = input.size(0), c = input.size(1);
  const int64_t s = c == 0 || n == 0 ? 0 : input.numel() / (n * c);
  // As batch_norm (and PyTorch's SyncBatchNorm): a float16/bfloat16 input is normalized as stored,
  // with weight, bias, statistics and parameter gradients in the compute dtype (float32 then); the
  // output, the saved input and the input gradient stay 16-bit.
  const DType cd = compute_dtype(input.dtype());
  Tensor x = alias_without_history(input).contiguous().reshape({n, c, s});
  // Per-channel sums over this process's batch (in float64, a temporary), then over every process.
  Tensor stats;
  {
    Tensor x64 = x.to(kFloat64);
    stats = cat({x64.sum({0, 2}), x64.mul(x64).sum({0, 2}),
                 full({1}, static_cast<double>(n * s), {.dtype = kFloat64, .device = x64.device()})});
  }
  sync->all_reduce_sum(stats);
  const double count = stats[2 * c].item<double>();
  if (count <= 1) fail("sync_batch_norm: expected more than 1 value per channel over all processes, got {}", count);
  Tensor mean = stats.narrow(0, 0, c) / count;
  Tensor var = (stats.narrow(0, c, c) / count - mean.mul(mean)).clamp_(Scalar(0.0), std::nullopt);
  if (running_mean.defined()) {
    NoGradGuard no_grad;
    Tensor rm = running_mean, rv = running_var;
    rm.copy_(rm.to(kFloat64) * (1 - momentum) + mean * momentum);
    rv.copy_(rv.to(kFloat64) * (1 - momentum) + var * (momentum * count / (count - 1)));
  }
  // Normalize with the job's statistics (the kernel's eval path takes them as given).
  Tensor mean_c = mean.to(cd), var_c = var.to(cd);
  Tensor w = weight.defined() ? ops::cast(alias_without_history(weight), cd).contiguous() : Tensor();
  Tensor b = bias.defined() ? ops::cast(alias_without_history(bias), cd).contiguous() : Tensor();
  Tensor out = make_tensor(input.sizes(), input.dtype(), input.device());
  Tensor save_mean = make_tensor({c}, cd, input.device()), save_rstd = make_tensor({c}, cd, input.device());
  kernels::batch_norm(out, save_mean, save_rstd, x, w, b, mean_c, var_c, false, 0.0, eps, n, c, s);
  if (autograd::any_requires_grad({&input, &weight, &bias})) {
    const bool need_x = input.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    const DType w_dtype = weight.defined() ? weight.dtype() : cd, b_dtype = bias.defined() ? bias.dtype() : cd;
    SavedTensor sx(x), sw(w);
    const Shape in_shape = input.sizes();
    autograd::record("SyncBatchNormBackward", {input, weight, bias}, {out}, [=](const TensorList& g) -> TensorList {
      Tensor xv = sx.unpack("sync_batch_norm"), wv = sw.unpack("sync_batch_norm");
      Tensor gv = ops::cast(g[0], xv.dtype()).contiguous().reshape({n, c, s});
      // This process's sum(g) and sum(g * xhat) per channel (the eval-mode kernel gives them as
      // the bias and weight gradients), then summed over every process for the input gradient.
      Tensor gw = make_tensor({c}, cd, xv.device()), gb = make_tensor({c}, cd, xv.device());
      kernels::batch_norm_backward(Tensor(), gw, gb, gv, xv, save_mean, save_rstd, wv, false, n, c, s);
      Tensor gx;
      if (need_x) {
        Tensor sums = cat({gb.to(kFloat64), gw.to(kFloat64)});
        sync->all_reduce_sum(sums);
        Tensor mean_g = (sums.narrow(0, 0, c) / count).to(cd).reshape({1, c, 1});
        Tensor mean_gxhat = (sums.narrow(0, c, c) / count).to(cd).reshape({1, c, 1});
        Tensor rstd = save_rstd.reshape({1, c, 1});
        // (16-bit g and x promote to float32 against the float32 statistics; rounded once at the end)
        Tensor xhat = (xv - save_mean.reshape({1, c, 1})) * rstd;
        Tensor scale = wv.defined() ? wv.reshape({1, c, 1}) * rstd : rstd;
        gx = ops::cast((gv - mean_g - xhat * mean_gxhat) * scale, xv.dtype()).reshape(in_shape);
      }
      return {gx, need_w ? ops::cast(gw, w_dtype) : Tensor(), need_b ? ops::cast(gb, b_dtype) : Tensor()};
    });
  }
  return out;
}

}  // namespace chorus::nn::functional
