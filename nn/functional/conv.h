// Convolution and pooling, functional forms (NCHW, float32/float64; float16/bfloat16 computed in
// float32). Each records its backward when an input requires grad. Shapes follow PyTorch:
// out = floor((in + 2*padding - dilation*(kernel-1) - 1) / stride) + 1.
#pragma once

#include <array>
#include <optional>

#include "tensor/tensor.h"

namespace chorus::nn::functional {

using Pair = std::array<int64_t, 2>;

// input [N, C_in, H, W], weight [C_out, C_in/groups, kH, kW], bias [C_out] or undefined.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), Pair stride = {1, 1},
              Pair padding = {0, 0}, Pair dilation = {1, 1}, int64_t groups = 1);
// input [N, C_in, L] or unbatched [C_in, L], weight [C_out, C_in/groups, k], bias [C_out] or
// undefined: conv2d over a height of 1 (conv1d.cpp), so it runs wherever conv2d does.
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// String padding, as PyTorch's padding="valid" / padding="same": Valid pads nothing; Same pads so
// the output has the input's length (stride 1 only): dilation * (kernel - 1) in all per dim, half
// before and the rest after (one more after when odd, as PyTorch).
enum class ConvPadding { Valid, Same };
const char* conv_padding_name(ConvPadding padding);  // "valid", "same"
// The (before, after) amounts of Same for one dim.
std::array<int64_t, 2> same_padding(int64_t kernel, int64_t dilation);
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair stride, ConvPadding padding,
              Pair dilation = {1, 1}, int64_t groups = 1);
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride, ConvPadding padding,
              int64_t dilation = 1, int64_t groups = 1);
// Transposed convolution, as PyTorch's: the gradient of conv2d with respect to its input, run with
// conv2d's own input-gradient kernel (conv.cpp). input [N, C_in, H, W] or [C_in, H, W],
// weight [C_in, C_out/groups, kH, kW], bias [C_out] or undefined;
// out = (in - 1)*stride - 2*padding + dilation*(kernel - 1) + output_padding + 1, where
// output_padding must be smaller than stride or dilation.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                        Pair stride = {1, 1}, Pair padding = {0, 0}, Pair output_padding = {0, 0},
                        int64_t groups = 1, Pair dilation = {1, 1});
// input [N, C_in, L] or [C_in, L], weight [C_in, C_out/groups, k]: conv_transpose2d over a height of 1.
Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
                        int64_t padding = 0, int64_t output_padding = 0, int64_t groups = 1, int64_t dilation = 1);
// stride defaults to kernel_size (as in PyTorch) when not given.
Tensor max_pool2d(const Tensor& input, Pair kernel_size, std::optional<Pair> stride = std::nullopt,
                  Pair padding = {0, 0}, Pair dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, Pair kernel_size, std::optional<Pair> stride = std::nullopt,
                  Pair padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size);

}  // namespace chorus::nn::functional
