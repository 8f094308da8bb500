#include "kernels/cuda/cudnn_bn_plan.h"

#include <fmt/format.h>

#include <climits>

#include "tensor/error.h"

namespace chorus::kernels::cudnn_plan {
namespace {

bool is_half(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

bool has_cudnn_type(DType d) {
  return d == DType::Float32 || d == DType::Float64 || d == DType::Float16 || d == DType::BFloat16;
}

DataType bn_data_type(DType d) {
  switch (d) {
    case DType::Float32: return DataType::Float;
    case DType::Float64: return DataType::Double;
    case DType::Float16: return DataType::Half;
    case DType::BFloat16: return DataType::BFloat16;
    default:
      fail("cudnn batch_norm: dtype {} has no cuDNN type; expected float32, float64, float16 or bfloat16",
           dtype_name(d));
  }
}

int bn_int(int64_t v, const char* what, int64_t n, int64_t c, int64_t s) {
  if (v < 1 || v > INT_MAX) {
    fail("cudnn batch_norm: {} = {} (x viewed as [n={}, c={}, s={}]) must be between 1 and {} for cuDNN", what, v, n,
         c, s, INT_MAX);
  }
  return static_cast<int>(v);
}

bool fits_int(int64_t v) { return v >= 1 && v <= INT_MAX; }

}  // namespace

std::optional<std::string> batch_norm_fallback_reason(const BatchNormCall& call) {
  if (!call.cudnn_enabled) return std::string("cuDNN is disabled (chorus::cuda::set_cudnn_enabled(false))");
  if (call.pass == BatchNormPass::BackwardEval) {
    return std::string("eval-mode backward is the affine gradient; cuDNN's backward always uses batch statistics");
  }
  if (!has_cudnn_type(call.x_dtype)) {
    return fmt::format("dtype {} has no cuDNN batch norm", dtype_name(call.x_dtype));
  }
  if (call.n == 0 || call.c == 0 || call.s == 0) {
    return fmt::format("empty input [n={}, c={}, s={}]", call.n, call.c, call.s);
  }
  if (!fits_int(call.n) || !fits_int(call.c) || !fits_int(call.s)) {
    return fmt::format("[n={}, c={}, s={}] does not fit cuDNN's int dims", call.n, call.c, call.s);
  }
  // cuDNN's tensor descriptors take at most 2^31 - 1 elements (cudnnSetTensorNdDescriptor answers
  // NOT_SUPPORTED past it): float32 [64, 64, 512, 1024] is 2^31, 8 GiB, and fits an H200.
  if (call.c * call.s > INT_MAX || call.n > INT_MAX / (call.c * call.s)) {
    return fmt::format("[n={}, c={}, s={}] has more elements than cuDNN's 2^31 - 1 per tensor", call.n, call.c, call.s);
  }
  if (call.s == 1) {
    return std::string(
        "x is rows of channels (channels-last, or one position per channel): chorus's rows kernels; cuDNN's "
        "legacy batch norm ran channels-last [128, 256, 56, 56] training at 25.7 ms against 1.17 ms NCHW on an H200");
  }
  const bool forward = call.pass == BatchNormPass::ForwardTraining || call.pass == BatchNormPass::ForwardInference;
  if (forward && !(call.eps >= kBatchNormMinEpsilon)) {  // also catches NaN
    return fmt::format("eps {} is below cuDNN's minimum (CUDNN_BN_MIN_EPSILON = {})", call.eps, kBatchNormMinEpsilon);
  }
  return std::nullopt;
}

BatchNormPlan plan_batch_norm(int64_t n, int64_t c, int64_t s, DType x_dtype, DType param_dtype, bool training) {
  const DataType type = bn_data_type(x_dtype);
  const DType want_param = is_half(x_dtype) ? DType::Float32 : x_dtype;
  if (param_dtype != want_param) {
    fail("cudnn batch_norm: a {} input takes {} weight, bias and statistics, got {}", dtype_name(x_dtype),
         dtype_name(want_param), dtype_name(param_dtype));
  }
  BatchNormPlan p;
  const int in = bn_int(n, "n", n, c, s), ic = bn_int(c, "c", n, c, s), is = bn_int(s, "s", n, c, s);
  if (static_cast<int64_t>(ic) * is > INT_MAX) {
    fail("cudnn batch_norm: c * s = {} (x viewed as [n={}, c={}, s={}]) must fit cuDNN's int strides", c * s, n, c, s);
  }
  p.x.type = type;
  if (s == 1) {
    // Rows of c channels: identical memory in both formats; NHWC picks cuDNN's channels-last kernels.
    p.x.format = TensorFormat::NHWC;
    p.x.dims = {in, ic, 1, 1};
    p.x.strides = {ic, 1, ic, ic};
  } else {
    p.x.format = TensorFormat::NCHW;
    p.x.dims = {in, ic, is, 1};
    p.x.strides = {ic * is, is, 1, 1};
  }
  p.params.type = type == DataType::Double ? DataType::Double : DataType::Float;
  p.params.format = TensorFormat::NCHW;
  p.params.dims = {1, ic, 1, 1};
  p.params.strides = {ic, 1, 1, 1};
  // Persistent kernels for channels-last training, as PyTorch chooses them (getCudnnBatchNormMode:
  // training and channels-last, whatever the dtype); it "imposes some limits on the range of values"
  // (cudnn_ops.h). NCHW, inference and float64 keep the plain spatial mode. float32 NHWC training
  // took the plain mode until 2026-11-26, when ResNet-50 channels-last in float32 ran 12x slower than
  // NCHW on an H100 (this is the suspected cause; not yet measured).
  p.mode = training && s == 1 && x_dtype != DType::Float64 ? BatchNormMode::SpatialPersistent : BatchNormMode::Spatial;
  return p;
}

std::string describe(const BatchNormPlan& p, bool training) {
  return fmt::format("{} {} {} x[{}] params {} {}", training ? "training" : "inference", type_name(p.x.type),
                     p.x.format == TensorFormat::NHWC ? "NHWC" : "NCHW", fmt::join(p.x.dims, ","),
                     type_name(p.params.type),
                     p.mode == BatchNormMode::SpatialPersistent ? "spatial-persistent" : "spatial");
}

}  // namespace chorus::kernels::cudnn_plan
