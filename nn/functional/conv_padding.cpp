// conv1d and conv2d with padding="valid" / "same": Valid is the unpadded convolution; Same is the
// convolution with half the needed padding on each side, after a zero pad of one more element at
// the end of each dim whose total is odd (PyTorch's arithmetic, so results agree element for element).
#include "autograd/ops/common.h"
#include "nn/functional/conv.h"
#include "nn/functional/pad.h"

namespace chorus::nn::functional {

const char* conv_padding_name(ConvPadding padding) { return padding == ConvPadding::Same ? "same" : "valid"; }

std::array<int64_t, 2> same_padding(int64_t kernel, int64_t dilation) {
  const int64_t total = dilation * (kernel - 1);
  return {total / 2, total - total / 2};
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair stride, ConvPadding padding,
              Pair dilation, int64_t groups) {
  if (padding == ConvPadding::Valid) return conv2d(input, weight, bias, stride, Pair{0, 0}, dilation, groups);
  ops::check_defined(weight, "conv2d", "weight");
  if (stride != Pair{1, 1}) {
    fail("conv2d: padding=\"same\" is not supported for strided convolutions, got stride ({}, {}); expected (1, 1)",
         stride[0], stride[1]);
  }
  if (weight.dim() != 4) fail("conv2d: expected a 4-D weight [C_out, C_in/groups, kH, kW], got shape {}", shape_str(weight.sizes()));
  const auto h = same_padding(weight.size(2), dilation[0]), w = same_padding(weight.size(3), dilation[1]);
  const Tensor padded = h[1] == h[0] && w[1] == w[0] ? input : pad(input, {0, w[1] - w[0], 0, h[1] - h[0]});
  return conv2d(padded, weight, bias, stride, Pair{h[0], w[0]}, dilation, groups);
}

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride, ConvPadding padding,
              int64_t dilation, int64_t groups) {
  if (padding == ConvPadding::Valid) return conv1d(input, weight, bias, stride, int64_t{0}, dilation, groups);
  ops::check_defined(weight, "conv1d", "weight");
  if (stride != 1) fail("conv1d: padding=\"same\" is not supported for strided convolutions, got stride {}; expected 1", stride);
  if (weight.dim() != 3) fail("conv1d: expected a 3-D weight [C_out, C_in/groups, k], got shape {}", shape_str(weight.sizes()));
  const auto l = same_padding(weight.size(2), dilation);
  const Tensor padded = l[1] == l[0] ? input : pad(input, {0, l[1] - l[0]});
  return conv1d(padded, weight, bias, stride, l[0], dilation, groups);
}

}  // namespace chorus::nn::functional
