// layer_norm: a fused forward (per-row mean and rstd, then the affine output) and a fused backward.
#include "autograd/node.h"
#include "autograd/ops/common.h"
#include "kernels/dispatch.h"
#include "nn/functional/normalization.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

using autograd::SavedTensor;

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (auto f32 = autocast::full_precision({&input, &weight, &bias})) {
    return layer_norm(autocast::cast(input, *f32), normalized_shape, autocast::cast(weight, *f32),
                      autocast::cast(bias, *f32), eps);
  }
  ops::check_defined(input, "layer_norm", "input");
  ops::check_kernels(input, "layer_norm");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  if (k == 0 || k > input.dim() ||
      !std::equal(normalized_shape.begin(), normalized_shape.end(), input.sizes().end() - k)) {
    fail("layer_norm: normalized_shape {} must match the trailing dims of the input's shape {}",
         shape_str(normalized_shape), shape_str(input.sizes()));
  }
  for (const Tensor* p : {&weight, &bias}) {
    if (p->defined() && p->sizes() != normalized_shape) {
      fail("layer_norm: weight/bias of shape {} must have normalized_shape {}", shape_str(p->sizes()),
           shape_str(normalized_shape));
    }
  }
  if (!input.is_floating_point()) fail("layer_norm: expected a floating-point input, got {}", dtype_name(input.dtype()));
  // float16/bfloat16 x stays in its storage (the kernels compute each row at float); weight, bias
  // and the saved per-row statistics are in the compute dtype (float32 then), as PyTorch's mixed
  // layer norm.
  const DType cd = compute_dtype(input.dtype());
  const int64_t cols = numel_of(normalized_shape);
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  Tensor x = alias_without_history(input).contiguous();
  Tensor w = weight.defined() ? ops::cast(alias_without_history(weight), cd).contiguous() : Tensor();
  Tensor b = bias.defined() ? ops::cast(alias_without_history(bias), cd).contiguous() : Tensor();
  Tensor out = make_tensor(input.sizes(), input.dtype(), input.device());
  Tensor mean = make_tensor({rows}, cd, input.device());
  Tensor rstd = make_tensor({rows}, cd, input.device());
  kernels::layer_norm(out, mean, rstd, x, w, b, rows, cols, eps);
  if (autograd::any_requires_grad({&input, &weight, &bias})) {
    const bool need_x = input.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    const DType w_dtype = weight.defined() ? weight.dtype() : cd, b_dtype = bias.defined() ? bias.dtype() : cd;
    SavedTensor sx(x), sw(w);
    const Shape in_shape = input.sizes(), nshape = normalized_shape;
    autograd::record("LayerNormBackward", {input, weight, bias}, {out},
                     [=](const TensorList& g) -> TensorList {
                       Tensor xv = sx.unpack("layer_norm");
                       Tensor wv = sw.unpack("layer_norm");
                       Tensor gv = ops::cast(g[0], xv.dtype()).contiguous();
                       Tensor gx = need_x ? make_tensor(in_shape, xv.dtype(), xv.device()) : Tensor();
                       Tensor gw = need_w ? make_tensor(nshape, cd, xv.device()) : Tensor();
                       Tensor gb = need_b ? make_tensor(nshape, cd, xv.device()) : Tensor();
                       kernels::layer_norm_backward(gx, gw, gb, gv, xv, mean, rstd, wv, rows, cols);
                       return {gx, need_w ? ops::cast(gw, w_dtype) : gw, need_b ? ops::cast(gb, b_dtype) : gb};
                     });
  }
  return out;
}

}  // namespace chorus::nn::functional
