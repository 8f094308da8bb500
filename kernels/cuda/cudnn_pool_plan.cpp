#include "kernels/cuda/cudnn_pool_plan.h"

#include <fmt/format.h>

#include <climits>

#include "tensor/error.h"

namespace chorus::kernels::cudnn_plan {
namespace {

bool fits_int(int64_t v) { return v >= 1 && v <= INT_MAX; }

const char* kind_name(PoolKind k) {
  switch (k) {
    case PoolKind::Max: return "max";
    case PoolKind::AvgIncludePad: return "avg (count_include_pad)";
    case PoolKind::AvgExcludePad: return "avg (count_include_pad=false)";
    case PoolKind::AdaptiveAvg: return "adaptive avg";
  }
  return "?";
}

std::optional<DataType> pool_data_type(DType d) {
  switch (d) {
    case DType::Float32: return DataType::Float;
    case DType::Float64: return DataType::Double;
    case DType::Float16: return DataType::Half;
    case DType::BFloat16: return DataType::BFloat16;
    default: return std::nullopt;
  }
}

// cuDNN's pooling output extent (cudnnGetPooling2dForwardOutputDim).
int64_t cudnn_extent(int64_t in, int64_t window, int64_t pad, int64_t stride) {
  return 1 + (in + 2 * pad - window) / stride;
}

// The geometry cuDNN runs: the call's window, or the uniform adaptive one (kernel = stride = in / out).
struct Geometry {
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
};
Geometry geometry(const PoolCall& call) {
  const Window2d& w = call.window;
  if (call.kind == PoolKind::AdaptiveAvg) {
    const int64_t kh = w.in_h / w.out_h, kw = w.in_w / w.out_w;
    return {kh, kw, kh, kw, 0, 0};
  }
  return {w.kernel_h, w.kernel_w, w.stride_h, w.stride_w, w.pad_h, w.pad_w};
}

// Dense 4-D strides of dims {n, c, h, w} in the layout.
std::array<int, 4> dense_strides(const std::array<int, 4>& d, bool channels_last) {
  if (channels_last) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

}  // namespace

std::optional<std::string> pool_fallback_reason(const PoolCall& call) {
  if (!call.cudnn_enabled) return std::string("cuDNN is disabled (chorus::cuda::set_cudnn_enabled(false))");
  if (call.kind == PoolKind::Max && call.indices) {
    return std::string("max pooling with indices: cuDNN computes none (its backward recomputes the arg-max from x and y)");
  }
  if (!pool_data_type(call.dtype)) return fmt::format("dtype {} has no cuDNN pooling", dtype_name(call.dtype));
  if (call.layout == PoolLayout::Mixed) {
    return std::string("the operands are not all dense NCHW or all dense NHWC");
  }
  const Window2d& w = call.window;
  if (call.n == 0 || call.c == 0 || w.in_h == 0 || w.in_w == 0 || w.out_h == 0 || w.out_w == 0) {
    return fmt::format("empty pooling: [n={}, c={}] input {}x{} output {}x{}", call.n, call.c, w.in_h, w.in_w, w.out_h,
                       w.out_w);
  }
  if (call.kind == PoolKind::AdaptiveAvg) {
    if (w.in_h % w.out_h != 0 || w.in_w % w.out_w != 0) {
      return fmt::format("adaptive pooling of {}x{} to {}x{} has windows of different sizes (cuDNN's are uniform)",
                         w.in_h, w.in_w, w.out_h, w.out_w);
    }
  } else {
    if (w.dilation_h != 1 || w.dilation_w != 1) {
      return fmt::format("dilation ({}, {}): cuDNN pooling has no dilation", w.dilation_h, w.dilation_w);
    }
    const int64_t floor_h = cudnn_extent(w.in_h, w.kernel_h, w.pad_h, w.stride_h);
    const int64_t floor_w = cudnn_extent(w.in_w, w.kernel_w, w.pad_w, w.stride_w);
    if (w.out_h != floor_h || w.out_w != floor_w) {
      // ceil_mode's extra window reaches past the padded input: cuDNN has no such window, and for
      // count_include_pad PyTorch divides it by its clipped size, which no cuDNN mode does.
      return fmt::format("ceil_mode output {}x{} has windows past the input (cuDNN's extent is {}x{})", w.out_h,
                         w.out_w, floor_h, floor_w);
    }
  }
  const int64_t nums[] = {call.n, call.c, w.in_h, w.in_w, w.out_h, w.out_w};
  for (int64_t v : nums) {
    if (!fits_int(v)) return fmt::format("a size of [n={}, c={}] {}x{} does not fit cuDNN's int", call.n, call.c, w.in_h, w.in_w);
  }
  // The batch stride, and the element count cuDNN's legacy kernels index with int.
  const int64_t x_numel = call.n * call.c * w.in_h * w.in_w;
  if (x_numel > INT_MAX || call.c * w.in_h * w.in_w > INT_MAX) {
    return fmt::format("input [{}, {}, {}, {}] has more than {} elements (cuDNN's int)", call.n, call.c, w.in_h,
                       w.in_w, INT_MAX);
  }
  const Geometry g = geometry(call);
  const int64_t geo[] = {g.kernel_h, g.kernel_w, g.stride_h, g.stride_w};
  for (int64_t v : geo) {
    if (!fits_int(v)) {
      return fmt::format("window {}x{} stride {}x{} does not fit cuDNN's int", g.kernel_h, g.kernel_w, g.stride_h,
                         g.stride_w);
    }
  }
  return std::nullopt;
}

PoolPlan plan_pool2d(const PoolCall& call) {
  if (auto reason = pool_fallback_reason(call)) fail("cudnn {} pooling: no cuDNN plan: {}", kind_name(call.kind), *reason);
  const Window2d& w = call.window;
  const Geometry g = geometry(call);
  PoolPlan p;
  switch (call.kind) {
    case PoolKind::Max: p.mode = call.deterministic ? PoolingMode::MaxDeterministic : PoolingMode::Max; break;
    case PoolKind::AvgIncludePad: p.mode = PoolingMode::AverageCountIncludePadding; break;
    case PoolKind::AvgExcludePad: p.mode = PoolingMode::AverageCountExcludePadding; break;
    // No padding: both average modes divide by the window; include-padding is the plain one.
    case PoolKind::AdaptiveAvg: p.mode = PoolingMode::AverageCountIncludePadding; break;
  }
  p.propagate_nan = true;
  p.window = {static_cast<int>(g.kernel_h), static_cast<int>(g.kernel_w)};
  p.pad = {static_cast<int>(g.pad_h), static_cast<int>(g.pad_w)};
  p.stride = {static_cast<int>(g.stride_h), static_cast<int>(g.stride_w)};
  p.channels_last = call.layout == PoolLayout::NHWC;
  const DataType type = *pool_data_type(call.dtype);
  const int n = static_cast<int>(call.n), c = static_cast<int>(call.c);
  p.x.type = p.y.type = type;
  p.x.dims = {n, c, static_cast<int>(w.in_h), static_cast<int>(w.in_w)};
  p.y.dims = {n, c, static_cast<int>(w.out_h), static_cast<int>(w.out_w)};
  p.x.strides = dense_strides(p.x.dims, p.channels_last);
  p.y.strides = dense_strides(p.y.dims, p.channels_last);
  return p;
}

std::string describe(const PoolPlan& p) {
  const char* mode = "max";
  switch (p.mode) {
    case PoolingMode::Max: mode = "max"; break;
    case PoolingMode::MaxDeterministic: mode = "max-deterministic"; break;
    case PoolingMode::AverageCountIncludePadding: mode = "avg-include-padding"; break;
    case PoolingMode::AverageCountExcludePadding: mode = "avg-exclude-padding"; break;
  }
  return fmt::format("{} {} {} x[{}] y[{}] window {}x{} pad {}x{} stride {}x{}", mode, type_name(p.x.type),
                     p.channels_last ? "NHWC" : "NCHW", fmt::join(p.x.dims, ","), fmt::join(p.y.dims, ","),
                     p.window[0], p.window[1], p.pad[0], p.pad[1], p.stride[0], p.stride[1]);
}

}  // namespace chorus::kernels::cudnn_plan
