// interpolate and pixel (un)shuffle. interpolate resizes one spatial dim at a time: the source
// positions and weights of a dim depend only on its sizes and scale, so they are computed on the
// host (with PyTorch's formulas and precision: float for nearest, the input's for the linear
// modes, so the rounding matches) and applied with index_select; linear modes blend two gathers. index_select's
// backward (index_add) sums the gradients of every output that read an input element.
#include "nn/functional/upsample.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "autograd/ops/common.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

const char* interpolate_mode_name(InterpolateMode mode) {
  switch (mode) {
    case InterpolateMode::Nearest: return "nearest";
    case InterpolateMode::Linear: return "linear";
    case InterpolateMode::Bilinear: return "bilinear";
    case InterpolateMode::Trilinear: return "trilinear";
    case InterpolateMode::Bicubic: return "bicubic";
    case InterpolateMode::Area: return "area";
  }
  return "?";
}

namespace {

template <typename V>
std::string list_str(const std::vector<V>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt::format("{}", v[i]);
  return s + "}";
}

// Source step per output position: 1 / scale_factor when one is used, else in / out (PyTorch's
// compute_scales_value), in the computation type T.
template <typename T>
T size_ratio(int64_t in, int64_t out, std::optional<double> scale) {
  return scale && *scale > 0 ? static_cast<T>(1.0 / *scale) : static_cast<T>(in) / static_cast<T>(out);
}

// In float for every dtype, as PyTorch's nearest kernels.
std::vector<int64_t> nearest_indices(int64_t in, int64_t out, std::optional<double> scale) {
  std::vector<int64_t> idx(static_cast<size_t>(out));
  const float ratio = size_ratio<float>(in, out, scale);
  for (int64_t j = 0; j < out; ++j) {
    // PyTorch's shortcuts for equal and doubled sizes give the same index as the formula would in
    // exact arithmetic; taking them avoids the float rounding of j * ratio near integers.
    if (out == in) idx[j] = j;
    else if (out == 2 * in) idx[j] = j >> 1;
    else idx[j] = std::min(static_cast<int64_t>(std::floor(static_cast<float>(j) * ratio)), in - 1);
  }
  return idx;
}

struct LinearTaps {
  std::vector<int64_t> lo, hi;
  std::vector<double> w_lo, w_hi;
};

template <typename T>
LinearTaps linear_taps(int64_t in, int64_t out, std::optional<double> scale, bool align_corners) {
  LinearTaps t;
  const T ratio = align_corners ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0))
                                : size_ratio<T>(in, out, scale);
  for (int64_t j = 0; j < out; ++j) {
    T src = align_corners ? ratio * static_cast<T>(j) : ratio * (static_cast<T>(j) + T(0.5)) - T(0.5);
    if (src < 0) src = 0;
    const int64_t i0 = static_cast<int64_t>(src);
    const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
    const T l1 = std::min(std::max(src - static_cast<T>(i0), T(0)), T(1));
    t.lo.push_back(i0);
    t.hi.push_back(i1);
    t.w_lo.push_back(static_cast<double>(T(1) - l1));
    t.w_hi.push_back(static_cast<double>(l1));
  }
  return t;
}

// Four taps per output for bicubic: source indices floor(src) - 1 .. floor(src) + 2, clamped to the
// input, with the cubic-convolution weights of the fraction (A = -0.75). The source position is not
// clamped at 0 (PyTorch's area_pixel_compute_source_index with cubic = true).
struct CubicTaps {
  std::array<std::vector<int64_t>, 4> idx;
  std::array<std::vector<double>, 4> w;
};

template <typename T>
CubicTaps cubic_taps(int64_t in, int64_t out, std::optional<double> scale, bool align_corners) {
  constexpr T A = T(-0.75);
  // The kernel for |x| <= 1 and for 1 < |x| < 2.
  auto near = [](T x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  auto far = [](T x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  CubicTaps t;
  const T ratio = align_corners ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0))
                                : size_ratio<T>(in, out, scale);
  for (int64_t j = 0; j < out; ++j) {
    const T src = align_corners ? ratio * static_cast<T>(j) : ratio * (static_cast<T>(j) + T(0.5)) - T(0.5);
    const T floor_src = std::floor(src);
    const auto i0 = static_cast<int64_t>(floor_src);
    const T f = src - floor_src;
    const std::array<T, 4> w = {far(f + 1), near(f), near(1 - f), far(2 - f)};
    for (int k = 0; k < 4; ++k) {
      t.idx[k].push_back(std::clamp<int64_t>(i0 - 1 + k, 0, in - 1));
      t.w[k].push_back(static_cast<double>(w[k]));
    }
  }
  return t;
}

// Area: the [out, in] averaging matrix of adaptive average pooling along one dim (output j
// averages inputs floor(j * in / out) .. ceil((j + 1) * in / out) - 1).
std::vector<double> area_matrix(int64_t in, int64_t out) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  for (int64_t j = 0; j < out; ++j) {
    const int64_t start = (j * in) / out, end = ((j + 1) * in + out - 1) / out;
    for (int64_t i = start; i < end; ++i) m[static_cast<size_t>(j * in + i)] = 1.0 / static_cast<double>(end - start);
  }
  return m;
}

// The weights as a tensor of the input's dtype shaped to broadcast along `dim` of an n-D tensor.
Tensor weights_along(const std::vector<double>& w, int64_t dim, int64_t ndim, const Tensor& like) {
  Shape s(static_cast<size_t>(ndim), 1);
  s[static_cast<size_t>(dim)] = static_cast<int64_t>(w.size());
  return tensor(w).to(like.dtype()).reshape(s).to(like.device());
}

Tensor gather(const Tensor& x, int64_t dim, const std::vector<int64_t>& idx) {
  return index_select(x, dim, tensor(idx).to(x.device()));
}

}  // namespace

Tensor interpolate(const Tensor& input, const InterpolateOptions& o) {
  ops::check_defined(input, "interpolate", "input");
  const char* mname = interpolate_mode_name(o.mode);
  const bool any_dims = o.mode == InterpolateMode::Nearest || o.mode == InterpolateMode::Area;
  const int64_t want_dim = o.mode == InterpolateMode::Linear                                         ? 3
                           : o.mode == InterpolateMode::Bilinear || o.mode == InterpolateMode::Bicubic ? 4
                                                                                                      : 5;
  if (any_dims ? (input.dim() < 3 || input.dim() > 5) : input.dim() != want_dim) {
    fail("interpolate: mode {} expects {} input [N, C, spatial...], got shape {}", mname,
         any_dims ? std::string("a 3-D to 5-D") : fmt::format("a {}-D", want_dim), shape_str(input.sizes()));
  }
  if (!input.is_floating_point()) fail("interpolate: expected a floating-point input, got {}", dtype_name(input.dtype()));
  const int64_t spatial = input.dim() - 2;
  if (o.size.empty() == o.scale_factor.empty()) {
    fail("interpolate: give exactly one of size ({}) and scale_factor ({})", list_str(o.size), list_str(o.scale_factor));
  }
  const size_t given = o.size.empty() ? o.scale_factor.size() : o.size.size();
  if (given != 1 && given != static_cast<size_t>(spatial)) {
    fail("interpolate: {} {} must have 1 or {} values for the {} spatial dims of input shape {}",
         o.size.empty() ? "scale_factor" : "size", o.size.empty() ? list_str(o.scale_factor) : list_str(o.size),
         spatial, spatial, shape_str(input.sizes()));
  }
  if (any_dims && o.align_corners) {
    fail("interpolate: align_corners only applies to the linear and cubic modes, not {}", mname);
  }
  const bool align = o.align_corners.value_or(false);
  const bool f64 = input.dtype() == kFloat64;
  Tensor y = input;
  for (int64_t d = 0; d < spatial; ++d) {
    const int64_t dim = 2 + d, in = input.size(dim);
    const size_t k = given == 1 ? 0 : static_cast<size_t>(d);
    int64_t out;
    std::optional<double> scale;
    if (!o.size.empty()) {
      out = o.size[k];
    } else {
      const double sf = o.scale_factor[k];
      if (!(sf > 0) || !std::isfinite(sf)) fail("interpolate: scale_factor {} must be positive and finite", list_str(o.scale_factor));
      out = static_cast<int64_t>(std::floor(static_cast<double>(in) * sf));
      if (!o.recompute_scale_factor) scale = sf;
    }
    if (out <= 0 || in <= 0) {
      fail("interpolate: input shape {} and output size {} along dim {} must both be positive", shape_str(input.sizes()),
           out, dim);
    }
    if (o.mode == InterpolateMode::Nearest) {
      y = gather(y, dim, nearest_indices(in, out, scale));
    } else if (o.mode == InterpolateMode::Bicubic) {
      const CubicTaps t = f64 ? cubic_taps<double>(in, out, scale, align) : cubic_taps<float>(in, out, scale, align);
      Tensor sum_of_taps;
      for (int k = 0; k < 4; ++k) {
        const Tensor term = mul(gather(y, dim, t.idx[k]), weights_along(t.w[k], dim, y.dim(), y));
        sum_of_taps = k == 0 ? term : add(sum_of_taps, term);
      }
      y = sum_of_taps;
    } else if (o.mode == InterpolateMode::Area) {
      // dim swapped with the last, times the averaging matrix transposed, and swapped back.
      const Tensor m = tensor(area_matrix(in, out), Shape{out, in}).to(y.dtype()).to(y.device());
      y = transpose(matmul(transpose(y, dim, -1), m.t()), dim, -1);
    } else {
      const LinearTaps t = f64 ? linear_taps<double>(in, out, scale, align) : linear_taps<float>(in, out, scale, align);
      y = add(mul(gather(y, dim, t.lo), weights_along(t.w_lo, dim, y.dim(), y)),
              mul(gather(y, dim, t.hi), weights_along(t.w_hi, dim, y.dim(), y)));
    }
  }
  return y;
}

namespace {

void check_shuffle(const Tensor& input, int64_t factor, const char* op, const char* what) {
  ops::check_defined(input, op, "input");
  if (input.dim() < 3) fail("{}: expected an input of at least 3 dims [*, C, H, W], got shape {}", op, shape_str(input.sizes()));
  if (factor <= 0) fail("{}: {} must be positive, got {}", op, what, factor);
}

}  // namespace

Tensor pixel_shuffle(const Tensor& input, int64_t r) {
  check_shuffle(input, r, "pixel_shuffle", "upscale_factor");
  const int64_t n = input.dim(), c = input.size(n - 3), h = input.size(n - 2), w = input.size(n - 1);
  if (c % (r * r) != 0) {
    fail("pixel_shuffle: the {} channels of input shape {} must be divisible by upscale_factor^2 = {}", c,
         shape_str(input.sizes()), r * r);
  }
  Shape lead(input.sizes().begin(), input.sizes().end() - 3);
  const int64_t batch = numel_of(lead);
  Tensor x = reshape(input, {batch, c / (r * r), r, r, h, w});
  x = permute(x, {0, 1, 4, 2, 5, 3});  // [B, C, H, r, W, r]
  Shape out = lead;
  for (int64_t s : {c / (r * r), h * r, w * r}) out.push_back(s);
  return reshape(x, out);
}

Tensor pixel_unshuffle(const Tensor& input, int64_t r) {
  check_shuffle(input, r, "pixel_unshuffle", "downscale_factor");
  const int64_t n = input.dim(), c = input.size(n - 3), h = input.size(n - 2), w = input.size(n - 1);
  if (h % r != 0 || w % r != 0) {
    fail("pixel_unshuffle: height and width of input shape {} must be divisible by downscale_factor {}",
         shape_str(input.sizes()), r);
  }
  Shape lead(input.sizes().begin(), input.sizes().end() - 3);
  const int64_t batch = numel_of(lead);
  Tensor x = reshape(input, {batch, c, h / r, r, w / r, r});
  x = permute(x, {0, 1, 3, 5, 2, 4});  // [B, C, r, r, H/r, W/r]
  Shape out = lead;
  for (int64_t s : {c * r * r, h / r, w / r}) out.push_back(s);
  return reshape(x, out);
}

}  // namespace chorus::nn::functional
