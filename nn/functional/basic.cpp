// linear, activations, dropout and embedding. Most are compositions of differentiable ops; dropout
// and embedding record their own, simpler backward.
#include "nn/functional/basic.h"

#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "autograd/ops/common.h"
#include "kernels/dispatch.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace chorus::autograd {
// autograd/engine.cpp: [Gradient into the pending sum] ([No header]: declared where it is used).
Tensor* pending_gradient(size_t input, const Shape& shape, DType dtype, Device device);
}  // namespace chorus::autograd

namespace chorus::nn::functional {

using autograd::SavedTensor;

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  if (auto low = autocast::lower_precision({&input, &weight, &bias})) {
    return linear(autocast::cast(input, *low), autocast::cast(weight, *low), autocast::cast(bias, *low));
  }
  ops::check_defined(input, "linear", "input");
  ops::check_defined(weight, "linear", "weight");
  if (weight.dim() != 2) fail("linear: weight must be 2-D [out_features, in_features], got shape {}", shape_str(weight.sizes()));
  if (input.dim() == 0 || input.size(-1) != weight.size(1)) {
    fail("linear: input of shape {} does not match in_features={} of weight {} (expected [..., {}])",
         shape_str(input.sizes()), weight.size(1), shape_str(weight.sizes()), weight.size(1));
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    fail("linear: bias of shape {} does not match out_features={}", shape_str(bias.sizes()), weight.size(0));
  }
  // 2-D input with a bias: one fused GEMM (bias broadcast into the output, then += x @ W^T). A
  // dense [..., in] input is the same GEMM over its rows (a transformer's [B, T, H]): one pass over
  // the output fewer than matmul then add. The result is a view of the 2-D product (PyTorch returns
  // an _unsafe_view, which chorus has not): an in-place op on it later goes through the view's
  // rebasing, correct but with the copies that implies.
  if (input.dim() == 2 && bias.defined()) return addmm(bias, input, weight.t());
  if (input.dim() > 2 && bias.defined() && input.is_contiguous()) {
    Shape out_shape = input.sizes();
    out_shape.back() = weight.size(0);
    return addmm(bias, input.reshape({-1, input.size(-1)}), weight.t()).reshape(out_shape);
  }
  Tensor out = matmul(input, weight.t());
  return bias.defined() ? add(out, bias) : out;
}

Tensor relu(const Tensor& input) { return chorus::relu(input); }
Tensor gelu(const Tensor& input, const std::string& approximate) { return chorus::gelu(input, approximate); }
Tensor silu(const Tensor& input) { return mul(input, chorus::sigmoid(input)); }
Tensor tanh(const Tensor& input) { return chorus::tanh(input); }
Tensor sigmoid(const Tensor& input) { return chorus::sigmoid(input); }
Tensor softmax(const Tensor& input, int64_t dim) { return chorus::softmax(input, dim); }
Tensor log_softmax(const Tensor& input, int64_t dim) { return chorus::log_softmax(input, dim); }

// [Dropout mask in one pass] The float32 draws are lo + span * u, u on a grid in [0, 1). Drawn with
// lo = -q and span = 1, q the float just below float(p), each value is u - q rounded once, which is
// positive exactly when u > q, that is u >= float(p): the same draws and the same mask as ge(u, p),
// but one pass (ReluBackward: 1/(1-p) where the draw is positive, else 0) instead of a compare, a
// cast from bool and a multiply. 0 < p < 1. The fused CPU attention draws its weights' dropout here
// too (nn/functional/attention.cpp, [No header]), so it takes the composite's draws.
Tensor dropout_multipliers(const Shape& shape, double p, Generator* generator, Device device) {
  const double q = std::nextafter(static_cast<float>(p), -std::numeric_limits<float>::infinity());
  Tensor mask = empty(shape, {.dtype = kFloat32, .device = device});
  ops::random_fill(kernels::RandomKind::Uniform, mask, -q, 1.0 - q, generator ? *generator : default_generator());
  kernels::binary(kernels::BinaryOp::ReluBackward, mask, ops::scalar_to_tensor(1.0 / (1.0 - p), kFloat32, device), mask);
  return mask;
}

Tensor dropout(const Tensor& input, double p, bool training, Generator* generator) {
  ops::check_defined(input, "dropout", "input");
  if (p < 0.0 || p > 1.0) fail("dropout: probability has to be between 0 and 1, but got {}", p);
  if (!training || p == 0.0) return input;
  if (!input.is_floating_point()) fail("dropout: expected a floating-point input, got {}", dtype_name(input.dtype()));
  if (p == 1.0) return mul(input, 0.0);
  // mask holds 0 or 1/(1-p): one multiply forward, the same multiply backward. An element is kept
  // when its uniform draw u satisfies u >= p, compared in the draw's dtype (as ge(u, p) would).
  const double scale = 1.0 / (1.0 - p);
  Tensor mask;
  if (input.dtype() == kFloat64) {
    NoGradGuard no_grad;
    const Tensor u = rand(input.sizes(), {.dtype = kFloat64, .device = input.device()}, generator);
    mask = mul(ge(u, p).to(kFloat64), scale);
  } else {
    mask = dropout_multipliers(input.sizes(), p, generator, input.device());
    if (input.dtype() != kFloat32) mask = mask.to(input.dtype());
  }
  // [Dropout's saved mask] On the CPU the backward keeps the mask itself, in the input's dtype, as
  // libtorch's CPU dropout keeps its noise tensor. On a device (cuda, and sim, which stands in for
  // it) it keeps one byte per element, which elements were kept, as PyTorch's CUDA native_dropout
  // does: 2x less than a bfloat16 mask and 4x less than a float32 one held from forward to backward
  // (BERT-base in bf16: 12 layers of an attention-probability mask and two hidden-state masks). The
  // gradient is the same bits: g * kept is exact, then one multiply by the mask's own value.
  if (input.device().is_cpu() || !autograd::any_requires_grad({&input})) return mul(input, mask);
  Tensor out, kept, scale_value;  // scale_value: the mask's one nonzero value, in its dtype (its bits)
  {
    NoGradGuard no_grad;
    out = mul(input, mask);
    kept = ne(mask, 0.0);
    scale_value = input.dtype() == kFloat64
                      ? ops::scalar_to_tensor(scale, kFloat64, input.device())
                      : ops::scalar_to_tensor(scale, kFloat32, input.device()).to(input.dtype());
  }
  autograd::record("NativeDropoutBackward", {input}, {out}, [kept, scale_value](const TensorList& g) -> TensorList {
    return {mul(mul(g[0], kept), scale_value)};
  });
  return out;
}

namespace {

// One uniform draw per (sample, channel), broadcast over the spatial dims: the mask multiply's
// backward applies the same mask to the gradient.
Tensor channel_dropout(const Tensor& input, double p, bool training, Generator* generator, int64_t spatial_dims,
                       const char* op) {
  ops::check_defined(input, op, "input");
  if (p < 0.0 || p > 1.0) fail("{}: probability has to be between 0 and 1, but got {}", op, p);
  const int64_t batched = spatial_dims + 2;
  if (input.dim() != batched && input.dim() != batched - 1) {
    fail("{}: expected a {}-D (batched) or {}-D (unbatched) input, got shape {}", op, batched, batched - 1,
         shape_str(input.sizes()));
  }
  if (!training || p == 0.0) return input;
  if (!input.is_floating_point()) fail("{}: expected a floating-point input, got {}", op, dtype_name(input.dtype()));
  if (p == 1.0) return mul(input, 0.0);
  Shape mask_shape = input.sizes();
  for (int64_t d = input.dim() - spatial_dims; d < input.dim(); ++d) mask_shape[static_cast<size_t>(d)] = 1;
  Tensor u = rand(mask_shape, {.dtype = input.dtype() == kFloat64 ? kFloat64 : kFloat32, .device = input.device()},
                  generator);
  Tensor mask;
  {
    NoGradGuard no_grad;
    mask = mul(ge(u, p).to(input.dtype()), 1.0 / (1.0 - p));
  }
  return mul(input, mask);
}

}  // namespace

Tensor dropout1d(const Tensor& input, double p, bool training, Generator* generator) {
  return channel_dropout(input, p, training, generator, 1, "dropout1d");
}

Tensor dropout2d(const Tensor& input, double p, bool training, Generator* generator) {
  return channel_dropout(input, p, training, generator, 2, "dropout2d");
}

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  ops::check_defined(indices, "embedding", "indices");
  ops::check_defined(weight, "embedding", "weight");
  if (weight.dim() != 2) fail("embedding: weight must be 2-D [num_embeddings, dim], got {}", shape_str(weight.sizes()));
  if (indices.dtype() != kInt64 && indices.dtype() != kInt32) {
    fail("embedding: expected int64 or int32 indices, got {}", dtype_name(indices.dtype()));
  }
  const int64_t num = weight.size(0);
  std::optional<int64_t> pad = padding_idx;
  if (pad && *pad < 0) *pad += num;
  if (pad && (*pad < 0 || *pad >= num)) fail("embedding: padding_idx {} must be within the {} embeddings", *padding_idx, num);
  Tensor flat = indices.to(kInt64).contiguous().reshape({-1});
  {
    // As PyTorch's embedding: indices in [0, num), negative ones refused too (index_select below
    // would wrap -1 to the last row, and the backward's index_add, given the unwrapped -1, wrote
    // before the gradient's first row: heap or device memory not its own).
    const Tensor host = flat.cpu();
    const int64_t* p = host.data_ptr<int64_t>();
    for (int64_t i = 0; i < host.numel(); ++i) {
      if (p[i] < 0 || p[i] >= num) {
        fail("embedding: index {} is out of range for a weight of {} embeddings (expected indices in [0, {}))", p[i],
             num, num);
      }
    }
  }
  Tensor rows;
  {
    NoGradGuard no_grad;  // the gradient is recorded below with padding handled
    rows = index_select(weight, 0, flat);
  }
  Shape shape = indices.sizes();
  shape.push_back(weight.size(1));
  Tensor out = ops::reshaped_result(rows, shape);
  if (autograd::any_requires_grad({&weight})) {
    const Shape wshape = weight.sizes();
    // The indices are saved with their version: `flat` may share the caller's storage (a contiguous
    // int64 tensor), and indices changed in place before backward (a reused batch buffer) would
    // send the gradient's rows elsewhere, out of range even (the check above ran in the forward).
    autograd::record("EmbeddingBackward", {weight}, {out},
                     [saved = autograd::SavedTensor(flat), pad, wshape](const TensorList& g) -> TensorList {
      const Tensor flat = saved.unpack("embedding");
      Tensor g2 = g[0].contiguous().reshape({-1, wshape[1]});
      if (pad) g2 = masked_fill(g2, eq(flat, *pad).unsqueeze(1), 0);
      // [Gradient into the pending sum] A tied weight (BERT's and GPT's word embeddings, also their
      // output projection) has its other gradient waiting in the engine already: the rows go into
      // it, in place of a zero table, the rows added to it, and a sum of two tables (BERT-mini: 31 MB
      // zeroed and 94 MB read or written a step).
      if (Tensor* pending = autograd::pending_gradient(0, wshape, g2.dtype(), g2.device())) {
        kernels::index_add(*pending, 0, flat, g2);
        return {Tensor()};
      }
      Tensor gw = zeros(wshape, g2.options());
      kernels::index_add(gw, 0, flat, g2);
      return {gw};
    });
  }
  return out;
}

}  // namespace chorus::nn::functional
