// The cuDNN pooling call plan, in plain numbers: which kernel runs a max_pool2d / avg_pool2d /
// adaptive_avg_pool2d (or its backward) of the cuda table (cuDNN or chorus's own, and why), and what
// cuDNN gets (the pooling mode, window, padding, stride, NaN propagation, and x and y as 4-D dims and
// strides, NCHW or NHWC). Plain C++ with no CUDA types, so it is built and tested on every machine
// (tests/kernels/cuda:cudnn_pool_plan_test); kernels/cuda/cudnn_pool.cpp turns a plan into cuDNN
// descriptors and calls.
//
// [cuDNN pooling semantics] (what the plan relies on to match chorus's kernels, kernels/cpu/conv.cpp):
// - cuDNN's output extent is the floor formula with symmetric padding, 1 + (in + 2 pad - window) /
//   stride. A ceil_mode window that runs past the input gives chorus's Window2d one more output row or
//   column: those calls fall back. When the extents agree, every window lies inside the padded input,
//   so PyTorch's count_include_pad divisor (the window clipped to the padded input) is the full
//   kernel_h * kernel_w, which is cuDNN's AVERAGE_COUNT_INCLUDE_PADDING; count_include_pad=false is
//   AVERAGE_COUNT_EXCLUDE_PADDING (the window clipped to the input) in every case.
// - Adaptive average pooling with in % out == 0 in both dims has equal, touching windows: an average
//   pool with kernel = stride = in / out and no padding (the global [1, 1] output is in / 1). Other
//   sizes have windows of two lengths that overlap, which no single cuDNN window describes.
// - Max pooling propagates NaN (CUDNN_PROPAGATE_NAN), as PyTorch's. cuDNN returns no indices: its
//   backward recomputes the arg-max from x, y and dy, so a call that wants (or gives) indices runs
//   chorus's kernel, and the op layer saves x and y instead of indices (nn/functional/conv.cpp).
// - float64 goes to cuDNN too (its pooling supports CUDNN_DATA_DOUBLE, with double alpha/beta); a
//   CUDNN_STATUS_NOT_SUPPORTED answer still sends the call to chorus's kernels (cudnn_pool.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cuda/cudnn_plan.h"
#include "kernels/kernel_types.h"
#include "tensor/dtype.h"

namespace chorus::kernels::cudnn_plan {

// Which pooling a kernel of the cuda table computes.
enum class PoolKind { Max, AvgIncludePad, AvgExcludePad, AdaptiveAvg };
// cudnnPoolingMode_t. MaxDeterministic when chorus::cuda::cudnn_deterministic() is set: plain MAX's
// backward may add overlapping windows' gradients in any order.
enum class PoolingMode { Max, MaxDeterministic, AverageCountIncludePadding, AverageCountExcludePadding };
// The layout every operand of the call (x, y, and dy, dx in backward) is dense in. Mixed: not all
// the same, or not dense: the kernel wrapper makes NCHW copies for chorus's kernels.
enum class PoolLayout { NCHW, NHWC, Mixed };

struct PoolCall {
  PoolKind kind = PoolKind::Max;
  bool cudnn_enabled = true;   // chorus::cuda::cudnn_enabled()
  bool deterministic = false;  // chorus::cuda::cudnn_deterministic()
  bool indices = false;        // max pooling that writes (forward) or scatters by (backward) indices
  DType dtype = DType::Float32;
  PoolLayout layout = PoolLayout::NCHW;
  int64_t n = 0, c = 0;
  // The geometry; for AdaptiveAvg only in_h, in_w, out_h, out_w are read (the rest follows from them).
  Window2d window;
};

struct PoolPlan {
  PoolingMode mode = PoolingMode::Max;
  bool propagate_nan = true;  // CUDNN_PROPAGATE_NAN (only max pooling reads it)
  std::array<int, 2> window{}, pad{}, stride{};  // h, w
  bool channels_last = false;                    // x and y described NHWC (cudnnSetTensor4dDescriptorEx strides)
  TensorDesc x, y;                               // dx shares x's descriptor, dy y's
};

// Why chorus's own kernel runs this call instead of cuDNN ("cuDNN is disabled ...", "dilation (2, 1)
// ..."), or nullopt when cuDNN takes it.
std::optional<std::string> pool_fallback_reason(const PoolCall& call);

// The plan of a call pool_fallback_reason accepts; chorus::Error (with the reason) for one it refuses.
PoolPlan plan_pool2d(const PoolCall& call);

// "max float32 NHWC x[8,64,112,112] y[8,64,56,56] window 3x3 pad 1x1 stride 2x2" (logs, errors).
std::string describe(const PoolPlan& plan);

}  // namespace chorus::kernels::cudnn_plan
