// The cuDNN batch-norm call plan, in plain numbers: which kernel runs a batch_norm /
// batch_norm_backward of the cuda table (cuDNN or chorus's own, and why), and the descriptors cuDNN
// gets (x as 4-D NCHW or NHWC, the derived [1, C, 1, 1] parameter tensor, the mode). Plain C++ with no
// CUDA types, so it is built and tested on every machine (tests/kernels/cuda:cudnn_bn_plan_test);
// kernels/cuda/cudnn_bn.cpp turns a plan into cuDNN descriptors and calls.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cuda/cudnn_plan.h"
#include "tensor/dtype.h"

namespace chorus::kernels::cudnn_plan {

// cudnnTensorFormat_t of the x descriptor.
enum class TensorFormat { NCHW, NHWC };
// cudnnBatchNormMode_t members chorus uses.
enum class BatchNormMode { Spatial, SpatialPersistent };
// CUDNN_BN_MIN_EPSILON of cuDNN 9 (cudnn_ops.h); cudnn_bn.cpp static_asserts that they agree.
inline constexpr double kBatchNormMinEpsilon = 0.0;

struct BatchNormTensor {
  DataType type = DataType::Float;
  TensorFormat format = TensorFormat::NCHW;
  std::array<int, 4> dims{};     // N, C, H, W (always in this order, whatever the format)
  std::array<int, 4> strides{};  // in elements, as cudnnSetTensor4dDescriptor derives them from the format
};

struct BatchNormPlan {
  BatchNormTensor x;       // x, y, dy and dx share it
  BatchNormTensor params;  // [1, C, 1, 1]: what cudnnDeriveBNTensorDescriptor gives for x and the mode
  BatchNormMode mode = BatchNormMode::Spatial;
};

// Which cuDNN call a batch_norm kernel would make. Eval-mode backward has none: cuDNN's backward always
// differentiates through the batch statistics, eval's gradient is the affine one (PyTorch also runs
// its own kernel there).
enum class BatchNormPass { ForwardTraining, ForwardInference, BackwardTraining, BackwardEval };

struct BatchNormCall {
  BatchNormPass pass = BatchNormPass::ForwardTraining;
  bool cudnn_enabled = true;  // chorus::cuda::cudnn_enabled()
  DType x_dtype = DType::Float32;
  int64_t n = 0, c = 0, s = 0;  // x viewed as [n, c, s] (s == 1: channels-last rows, see nn/functional/batch_norm.cpp)
  double eps = 1e-5;            // forward only
};

// Why chorus's own kernel runs this call instead of cuDNN ("cuDNN is disabled ...", "eps 0 is below
// ..."), or nullopt when cuDNN takes it. Rows of channels (s == 1: channels-last images, BatchNorm1d's
// [N, C]) always run chorus's rows kernels (nn.cu, batch_norm_rows): through cuDNN's legacy (non-Ex)
// API, channels-last ResNet-50's [128, 256, 56, 56] took 25.7 ms a training step against 1.17 ms in
// NCHW on an H200 (2026-11-30, docs/data/gpu_run_2026-11-30_h200_call1_summary.txt), described as
// one-pixel images or as whole ones alike; PyTorch runs its own channels-last kernels there too.
// plan_batch_norm still describes rows for cuDNN, for the day the Ex API (whose reserve space the
// kernel table has no slot for) is tried. A call that is simply wrong (parameters of the wrong dtype)
// is not a fallback: the plan (or the kernel) raises.
std::optional<std::string> batch_norm_fallback_reason(const BatchNormCall& call);

// The descriptors for x viewed as [n, c, s] (dense, n-major): NCHW [n, c, s, 1] when s > 1; when
// s == 1 the memory is the same in NCHW and NHWC, and it is described as NHWC [n, c, 1, 1], which
// selects cuDNN's channels-last kernels. `param_dtype` must be float32 for a float16/bfloat16 x, else
// x's dtype (cuDNN's rule for the derived descriptor, and chorus's for batch_norm). Training with
// NHWC data other than float64 uses CUDNN_BATCHNORM_SPATIAL_PERSISTENT (as PyTorch does for
// channels-last); everything else CUDNN_BATCHNORM_SPATIAL. chorus::Error for a dtype cuDNN has no type for,
// parameters of the wrong dtype, or sizes that are empty or beyond cuDNN's int.
// (batch_norm_fallback_reason sends rows to chorus's kernels: cuDNN's legacy API ran them 20x
// slower than NCHW as one-pixel images, and slower still described as whole NHWC images.)
BatchNormPlan plan_batch_norm(int64_t n, int64_t c, int64_t s, DType x_dtype, DType param_dtype, bool training);

// "training float16 NHWC x[8192,64,1,1] params float32 spatial-persistent" (logs, errors).
std::string describe(const BatchNormPlan& plan, bool training);

}  // namespace chorus::kernels::cudnn_plan
