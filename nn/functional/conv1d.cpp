// conv1d and conv_transpose1d as their 2-D forms over an inserted height-1 dim: the same kernels
// (oneDNN, im2col) and backward, with a kernel of height 1 so nothing is computed twice. The checks
// run here first, so a mistake is reported in 1-D terms (3-D shapes, single numbers), not 2-D ones.
#include "autograd/ops/common.h"
#include "nn/functional/conv.h"

namespace chorus::nn::functional {

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  ops::check_defined(input, "conv1d", "input");
  ops::check_defined(weight, "conv1d", "weight");
  if (input.dim() != 2 && input.dim() != 3) {
    fail("conv1d: expected a 2-D [C_in, L] or 3-D [N, C_in, L] input, got shape {}", shape_str(input.sizes()));
  }
  if (weight.dim() != 3) fail("conv1d: expected a 3-D weight [C_out, C_in/groups, k], got shape {}", shape_str(weight.sizes()));
  if (stride < 1 || dilation < 1 || padding < 0 || groups < 1) {
    fail("conv1d: expected stride >= 1, dilation >= 1, padding >= 0 and groups >= 1, got {}, {}, {} and {}", stride,
         dilation, padding, groups);
  }
  const int64_t channels = input.size(-2);
  if (channels != weight.size(1) * groups) {
    fail("conv1d: input of shape {} has {} channels, but weight of shape {} with groups={} expects {}",
         shape_str(input.sizes()), channels, shape_str(weight.sizes()), groups, weight.size(1) * groups);
  }
  if (weight.size(0) % groups != 0) {
    fail("conv1d: the {} output channels of weight {} must be divisible by groups={}", weight.size(0),
         shape_str(weight.sizes()), groups);
  }
  const int64_t span = dilation * (weight.size(2) - 1) + 1;
  if (input.size(-1) + 2 * padding < span) {
    fail("conv1d: input length {} (padded: {}) is shorter than the kernel's span {} (kernel {}, dilation {})",
         input.size(-1), input.size(-1) + 2 * padding, span, weight.size(2), dilation);
  }
  Tensor out = conv2d(unsqueeze(input, -2), unsqueeze(weight, 2), bias, {1, stride}, {0, padding}, {1, dilation}, groups);
  return squeeze(out, -2);
}

}  // namespace chorus::nn::functional

namespace chorus::nn::functional {

Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
                        int64_t output_padding, int64_t groups, int64_t dilation) {
  ops::check_defined(input, "conv_transpose1d", "input");
  ops::check_defined(weight, "conv_transpose1d", "weight");
  if (input.dim() != 2 && input.dim() != 3) {
    fail("conv_transpose1d: expected a 2-D [C_in, L] or 3-D [N, C_in, L] input, got shape {}",
         shape_str(input.sizes()));
  }
  if (weight.dim() != 3) {
    fail("conv_transpose1d: expected a 3-D weight [C_in, C_out/groups, k], got shape {}", shape_str(weight.sizes()));
  }
  if (stride < 1 || dilation < 1 || padding < 0 || output_padding < 0 || groups < 1) {
    fail("conv_transpose1d: expected stride >= 1, dilation >= 1, padding >= 0, output_padding >= 0 and groups >= 1, "
         "got {}, {}, {}, {} and {}",
         stride, dilation, padding, output_padding, groups);
  }
  if (output_padding >= stride && output_padding >= dilation) {
    fail("conv_transpose1d: output_padding {} must be smaller than either stride {} or dilation {}", output_padding,
         stride, dilation);
  }
  const int64_t channels = input.size(-2);
  if (channels != weight.size(0)) {
    fail("conv_transpose1d: input of shape {} has {} channels, but weight of shape {} expects {} (weight is "
         "[C_in, C_out/groups, k])",
         shape_str(input.sizes()), channels, shape_str(weight.sizes()), weight.size(0));
  }
  if (channels % groups != 0) {
    fail("conv_transpose1d: input channels {} must be divisible by groups {}", channels, groups);
  }
  Tensor out = conv_transpose2d(unsqueeze(input, -2), unsqueeze(weight, 2), bias, {1, stride}, {0, padding},
                                {0, output_padding}, groups, {1, dilation});
  return squeeze(out, -2);
}

}  // namespace chorus::nn::functional
