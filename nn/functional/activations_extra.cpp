// More activations, composed of differentiable ops: leaky_relu, elu, softplus, hardswish, mish,
// prelu. Branches that would overflow (exp of a large input) get a clamped input, so an unused
// branch cannot put inf * 0 = NaN into the gradient.
#include "nn/functional/basic.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

Tensor leaky_relu(const Tensor& input, double negative_slope) {
  return where(gt(input, 0), input, mul(input, negative_slope));
}

Tensor elu(const Tensor& input, double alpha) {
  return where(gt(input, 0), input, mul(expm1(clamp(input, std::nullopt, 0.0)), alpha));
}

Tensor softplus(const Tensor& input, double beta, double threshold) {
  if (!(beta > 0)) fail("softplus: beta is {}; expected a positive number", beta);
  const Tensor scaled = mul(input, beta);
  const Tensor soft = div(log1p(exp(clamp(scaled, std::nullopt, threshold))), beta);
  return where(gt(scaled, threshold), input, soft);
}

Tensor hardswish(const Tensor& input) { return div(mul(input, clamp(add(input, 3.0), 0.0, 6.0)), 6.0); }

Tensor mish(const Tensor& input) { return mul(input, chorus::tanh(softplus(input))); }

Tensor prelu(const Tensor& input, const Tensor& weight) {
  if (!weight.defined() || weight.dim() != 1) fail("prelu: expected a 1-D weight, got {}", weight.defined() ? shape_str(weight.sizes()) : "undefined");
  Tensor w = weight;
  if (weight.size(0) != 1) {
    if (input.dim() < 2 || input.size(1) != weight.size(0)) {
      fail("prelu: weight has {} values; expected 1 or the input's channels (dim 1 of {})", weight.size(0),
           shape_str(input.sizes()));
    }
    Shape s(input.dim(), 1);
    s[1] = weight.size(0);
    w = weight.reshape(s);
  }
  return where(gt(input, 0), input, mul(input, w));
}

}  // namespace chorus::nn::functional
