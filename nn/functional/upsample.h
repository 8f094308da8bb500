// Resizing images and feature maps, as torch.nn.functional.interpolate, pixel_shuffle and
// pixel_unshuffle. Composites of differentiable ops (index_select, multiplies, reshape/permute),
// so every device runs them and autograd derives the backward.
#pragma once

#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::nn::functional {

// Nearest: PyTorch's "nearest" (floor of dst * scale, not "nearest-exact"); 3-D to 5-D input.
// Linear, Bilinear, Trilinear: 3-D, 4-D and 5-D input respectively.
// Bicubic: 4-D input; cubic convolution (A = -0.75) over 4 taps per dim, edges clamped, as PyTorch.
// Area: 3-D to 5-D input; each output averages the input cells its region covers (PyTorch's
// adaptive average pooling to the output size; a given scale_factor only sets the size).
enum class InterpolateMode { Nearest, Linear, Bilinear, Trilinear, Bicubic, Area };

// Exactly one of size and scale_factor; each holds one value for every spatial dim or one per dim
// (`{.size = {32, 48}}`, `{.scale_factor = {2.0}}`). The output size is floor(in * scale_factor).
// As PyTorch, the given scale_factor (not the rounded size ratio) decides the source positions
// unless recompute_scale_factor; with align_corners the corner pixels' centres line up instead
// and only the sizes matter. align_corners is refused for Nearest and Area, as PyTorch.
struct InterpolateOptions {
  std::vector<int64_t> size = {};
  std::vector<double> scale_factor = {};
  InterpolateMode mode = InterpolateMode::Nearest;
  std::optional<bool> align_corners = std::nullopt;  // unset: false
  bool recompute_scale_factor = false;
};

Tensor interpolate(const Tensor& input, const InterpolateOptions& options);

// [*, C * r^2, H, W] -> [*, C, H * r, W * r], and its inverse.
Tensor pixel_shuffle(const Tensor& input, int64_t upscale_factor);
Tensor pixel_unshuffle(const Tensor& input, int64_t downscale_factor);

const char* interpolate_mode_name(InterpolateMode mode);

}  // namespace chorus::nn::functional
