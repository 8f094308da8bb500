// batch_norm and batch_norm_backward of the cuda kernel table through cuDNN's batch norm
// (cudnnBatchNormalizationForwardTraining / ForwardInference / Backward), following the plan of
// kernels/cuda/cudnn_bn_plan.h; chorus's own kernels (nn.cu, batch_norm_direct) run whatever the plan
// sends back (cuDNN off, eval-mode backward, eps below cuDNN's minimum, empty or oversized inputs) and
// whatever cuDNN answers CUDNN_STATUS_NOT_SUPPORTED.
//
// [cuDNN batch-norm semantics] (what chorus's kernels do, kernels/cpu/conv.cpp):
// - resultSaveMean / resultSaveInvVariance are the batch mean and 1/sqrt(biased var + eps): chorus's
//   save_mean / save_rstd, which the backward takes as given (savedMean / savedInvVariance).
// - exponentialAverageFactor is chorus's momentum as it is: running = (1 - m) * running + m * batch,
//   with the unbiased (n - 1) variance going into running_var (PyTorch's cuDNN path passes momentum
//   the same way and its tests compare running_var with its native kernel's).
// - Inference normalizes with the running statistics and writes no save_mean/save_rstd; chorus's eval
//   forward defines them (= running_mean, 1/sqrt(running_var + eps)) for its affine backward, so a
//   small kernel (batch_norm_inference_stats) fills them.
// - The plain (non-Ex) calls are used: the Ex ones hand a reserve space from forward to backward,
//   which the kernel table has no slot for.
// These have not been checked on a GPU yet (docs/gpu.md): tests/kernels/cuda:cudnn_gpu_test does.
#include <cuda_runtime.h>
#include <cudnn.h>

#include "kernels/cuda/cudnn_bn_plan.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/kernels.h"
#include "tensor/error.h"
#include "tensor/runtime.h"

// cuDNN 9 marks its batch-norm API deprecated in favour of the graph API; PyTorch still calls it, and
// it is what the legacy descriptors above drive. Only this file uses it.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace chorus::kernels::cuda_impl {
namespace {

namespace cp = ::chorus::kernels::cudnn_plan;

static_assert(cp::kBatchNormMinEpsilon == CUDNN_BN_MIN_EPSILON,
              "kernels/cuda/cudnn_bn_plan.h's kBatchNormMinEpsilon must be this cuDNN's CUDNN_BN_MIN_EPSILON");

// The backward's epsilon: chorus's backward kernel has no eps argument, and cuDNN only needs it when
// savedMean/savedInvVariance are null (it recomputes them); they are always given here.
constexpr double kBackwardEpsilon = 1e-5;

cudnnBatchNormMode_t cudnn_mode(cp::BatchNormMode m) {
  return m == cp::BatchNormMode::SpatialPersistent ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
}

// A status that sends the call to chorus's kernels (cuDNN checks its arguments before it launches
// anything, so nothing has been written yet) or raises.
bool supported(cudnnStatus_t status, const char* what, const cp::BatchNormPlan& plan, bool training) {
  if (status == CUDNN_STATUS_NOT_SUPPORTED) return false;
  if (status != CUDNN_STATUS_SUCCESS) {
    fail("cuDNN {} ({}): {} ({})", what, cp::describe(plan, training), cudnnGetErrorString(status),
         static_cast<int>(status));
  }
  return true;
}

// x's descriptor and the derived [1, C, 1, 1] one, checked against the plan (a plan that mispredicts
// what cuDNN derives fails here, on the first GPU run, not as wrong numbers).
struct Descriptors {
  TensorDescriptor x, params;
  explicit Descriptors(const cp::BatchNormPlan& p) {
    const auto& d = p.x.dims;
    check_cudnn(cudnnSetTensor4dDescriptor(x.d, p.x.format == cp::TensorFormat::NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                           cudnn_type(p.x.type), d[0], d[1], d[2], d[3]),
                "cudnnSetTensor4dDescriptor (batch norm x)");
    check_cudnn(cudnnDeriveBNTensorDescriptor(params.d, x.d, cudnn_mode(p.mode)), "cudnnDeriveBNTensorDescriptor");
    cudnnDataType_t type;
    int n, c, h, w, sn, sc, sh, sw;
    check_cudnn(cudnnGetTensor4dDescriptor(params.d, &type, &n, &c, &h, &w, &sn, &sc, &sh, &sw),
                "cudnnGetTensor4dDescriptor (batch norm parameters)");
    CHORUS_CHECK(type == cudnn_type(p.params.type) && n == 1 && c == p.params.dims[1] && h == 1 && w == 1,
                 "cuDNN derived batch-norm parameters of type {} [{}, {}, {}, {}], the plan expected [1, {}, 1, 1] of "
                 "type {}",
                 static_cast<int>(type), n, c, h, w, p.params.dims[1], static_cast<int>(cudnn_type(p.params.type)));
  }
};

// cuDNN wants a scale and a bias: a layer without affine parameters gets ones and zeros.
Tensor param_or(const Tensor& t, double value, int64_t c, DType dtype, Device device) {
  if (t.defined()) return t;
  Tensor f = make_tensor({c}, dtype, device);
  fill(f, Scalar(value));
  return f;
}
// An output cuDNN always writes that the caller did not ask for.
Tensor output_or_scratch(const Tensor& t, int64_t numel, DType dtype, Device device) {
  return t.defined() ? t : make_tensor({numel}, dtype, device);
}

void* ptr(const Tensor& t) { return t.defined() ? t.raw_data_ptr() : nullptr; }


bool cudnn_forward(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                   const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                   bool training, double momentum, double eps, int64_t n, int64_t c, int64_t s) {
  const Device device = x.device();
  DeviceGuard guard(device);
  const cp::BatchNormPlan plan = cp::plan_batch_norm(n, c, s, x.dtype(), save_mean.dtype(), training);
  Descriptors desc(plan);
  const Scalars k(plan.x.type);
  cudnnHandle_t h = handle_on_current_stream(device);
  const DType pd = save_mean.dtype();
  const Tensor w = param_or(weight, 1.0, c, pd, device), b = param_or(bias, 0.0, c, pd, device);
  if (training) {
    return supported(cudnnBatchNormalizationForwardTraining(
                         h, cudnn_mode(plan.mode), k.one(), k.zero(), desc.x.d, x.raw_data_ptr(), desc.x.d,
                         out.raw_data_ptr(), desc.params.d, w.raw_data_ptr(), b.raw_data_ptr(), momentum,
                         ptr(running_mean), ptr(running_var), eps, save_mean.raw_data_ptr(), save_rstd.raw_data_ptr()),
                     "cudnnBatchNormalizationForwardTraining", plan, true);
  }
  if (!supported(cudnnBatchNormalizationForwardInference(h, cudnn_mode(plan.mode), k.one(), k.zero(), desc.x.d,
                                                         x.raw_data_ptr(), desc.x.d, out.raw_data_ptr(), desc.params.d,
                                                         w.raw_data_ptr(), b.raw_data_ptr(),
                                                         running_mean.raw_data_ptr(), running_var.raw_data_ptr(), eps),
                 "cudnnBatchNormalizationForwardInference", plan, false)) {
    return false;
  }
  batch_norm_inference_stats(save_mean, save_rstd, running_mean, running_var, eps, c);
  return true;
}

bool cudnn_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                    const Tensor& x, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& weight, int64_t n,
                    int64_t c, int64_t s) {
  const Device device = x.device();
  DeviceGuard guard(device);
  const cp::BatchNormPlan plan = cp::plan_batch_norm(n, c, s, x.dtype(), save_mean.dtype(), true);
  Descriptors desc(plan);
  const Scalars k(plan.x.type);
  cudnnHandle_t h = handle_on_current_stream(device);
  const DType pd = save_mean.dtype();
  const Tensor w = param_or(weight, 1.0, c, pd, device);
  const Tensor gx = output_or_scratch(grad_x, x.numel(), x.dtype(), device);
  const Tensor gw = output_or_scratch(grad_weight, c, pd, device), gb = output_or_scratch(grad_bias, c, pd, device);
  return supported(cudnnBatchNormalizationBackward(h, cudnn_mode(plan.mode), k.one(), k.zero(), k.one(), k.zero(),
                                                   desc.x.d, x.raw_data_ptr(), desc.x.d, grad_out.raw_data_ptr(),
                                                   desc.x.d, gx.raw_data_ptr(), desc.params.d, w.raw_data_ptr(),
                                                   gw.raw_data_ptr(), gb.raw_data_ptr(), kBackwardEpsilon,
                                                   save_mean.raw_data_ptr(), save_rstd.raw_data_ptr()),
                   "cudnnBatchNormalizationBackward", plan, true);
}

}  // namespace

void batch_norm(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                bool use_batch_stats, double momentum, double eps, int64_t n, int64_t c, int64_t s) {
  if (c == 0) return;
  const cp::BatchNormCall call{
      .pass = use_batch_stats ? cp::BatchNormPass::ForwardTraining : cp::BatchNormPass::ForwardInference,
      .cudnn_enabled = ::chorus::cuda::cudnn_enabled(),
      .x_dtype = x.dtype(),
      .n = n,
      .c = c,
      .s = s,
      .eps = eps,
  };
  if (!cp::batch_norm_fallback_reason(call) &&
      cudnn_forward(out, save_mean, save_rstd, x, weight, bias, running_mean, running_var, use_batch_stats, momentum,
                    eps, n, c, s)) {
    return;
  }
  batch_norm_direct(out, save_mean, save_rstd, x, weight, bias, running_mean, running_var, use_batch_stats, momentum,
                    eps, n, c, s);
}

void batch_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         const Tensor& grad_out, const Tensor& x, const Tensor& save_mean, const Tensor& save_rstd,
                         const Tensor& weight, bool use_batch_stats, int64_t n, int64_t c, int64_t s) {
  if (c == 0) return;
  const cp::BatchNormCall call{
      .pass = use_batch_stats ? cp::BatchNormPass::BackwardTraining : cp::BatchNormPass::BackwardEval,
      .cudnn_enabled = ::chorus::cuda::cudnn_enabled(),
      .x_dtype = x.dtype(),
      .n = n,
      .c = c,
      .s = s,
  };
  if (!cp::batch_norm_fallback_reason(call) &&
      cudnn_backward(grad_x, grad_weight, grad_bias, grad_out, x, save_mean, save_rstd, weight, n, c, s)) {
    return;
  }
  batch_norm_backward_direct(grad_x, grad_weight, grad_bias, grad_out, x, save_mean, save_rstd, weight,
                             use_batch_stats, n, c, s);
}

}  // namespace chorus::kernels::cuda_impl
