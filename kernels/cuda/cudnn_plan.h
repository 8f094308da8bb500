// The cuDNN convolution call plan, in plain numbers: the tensor, filter and convolution descriptors
// a conv2d (forward, backward-data, backward-filter) needs, from the tensors' sizes and strides, and
// the key its algorithm is cached under. Plain C++ with no CUDA types, so it is built and tested on
// every machine (tests/kernels/cuda:cudnn_plan_test); kernels/cuda/cudnn_conv.cpp turns a plan into
// cuDNN descriptors and calls. Also the cuDNN settings (chorus::cuda::set_cudnn_*), as PyTorch's
// torch.backends.cudnn flags.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/kernel_types.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace chorus::cuda {

// Whether conv2d on CUDA goes through cuDNN (default true); false: chorus's direct kernels.
void set_cudnn_enabled(bool enabled);
bool cudnn_enabled();
// Only algorithms cuDNN reports deterministic (bit-identical results run to run); default false.
void set_cudnn_deterministic(bool deterministic);
bool cudnn_deterministic();
// float32 convolutions may use TF32 tensor cores (default true, as PyTorch's cudnn.allow_tf32).
void set_cudnn_allow_tf32(bool allow);
bool cudnn_allow_tf32();
// The most workspace (bytes, from the caching allocator) an algorithm may use; default 1 GiB.
void set_cudnn_workspace_limit(int64_t bytes);
int64_t cudnn_workspace_limit();

}  // namespace chorus::cuda

namespace chorus::kernels::cudnn_plan {

// cudnnDataType_t's members chorus uses.
enum class DataType { Float, Double, Half, BFloat16 };
// cudnnTensorFormat_t for filters: NCHW (KCRS) or NHWC (KRSC).
enum class FilterFormat { NCHW, NHWC };

struct TensorDesc {
  DataType type = DataType::Float;
  std::array<int, 4> dims{};     // N, C, H, W (always in this order, whatever the memory layout)
  std::array<int, 4> strides{};  // in elements
};

struct FilterDesc {
  DataType type = DataType::Float;
  FilterFormat format = FilterFormat::NCHW;
  std::array<int, 4> dims{};  // K, C / groups, R, S
};

struct ConvDesc {
  std::array<int, 2> pad{}, stride{}, dilation{};
  int groups = 1;
  DataType compute = DataType::Float;  // float for float/half/bfloat16 data, double for double
};

// "float32", "float64", "float16", "bfloat16" (messages and descriptions).
const char* type_name(DataType t);

// cuDNN's math types (cudnnMathType_t's values; kernels/cuda/cudnn_conv.cpp checks them).
enum class MathType { Default = 0, TensorOp = 1, TensorOpAllowConversion = 2, Fma = 3 };

struct ConvPlan {
  TensorDesc x, y;    // input and output (also dx and dy: the gradients share their layouts)
  FilterDesc w;       // weight (and dw)
  ConvDesc conv;
  TensorDesc bias;    // [1, K, 1, 1] (cudnnAddTensor / cudnnConvolutionBackwardBias)
  bool channels_last = false;  // x and y are NHWC in memory (the filter then must be KRSC too)
  bool tensor_ops = false;     // tensor-core math allowed (half/bfloat16 always; float with TF32 allowed)
  // The convolution descriptor's math type, as PyTorch sets it: float16/bfloat16 TensorOp, float32
  // with TF32 allowed Default (TF32 on tensor cores), else Fma (float32 without TF32, float64).
  // Never TensorOpAllowConversion: for float32 data that lets cuDNN convert to float16 (range
  // 6.1e-5 to 65504, so large activations become inf and small gradients 0).
  MathType math = MathType::Fma;
};

// Whether a search result that ran with math type `result` may be taken for a plan of math type
// `plan`: any but a down-converting one unless the plan allows it.
bool result_math_allowed(MathType plan, int result);

// chorus::Error when a size or stride does not fit cuDNN's int, a tensor is not 4-D, the dtype has
// no cuDNN type, or the weight's layout does not match the input's (cuDNN wants a KRSC filter with
// NHWC tensors and a KCRS one with NCHW: the caller makes the weight contiguous in the right format
// first, see weight_layout_for).
ConvPlan plan_conv2d(const Shape& x_sizes, const Strides& x_strides, const Shape& w_sizes, const Strides& w_strides,
                     const Shape& y_sizes, const Strides& y_strides, DType dtype, const Window2d& window,
                     int64_t groups, bool allow_tf32);

// Whether 4-D `strides` of `sizes` are channels-last dense (C stride 1, W stride C, H stride W*C,
// N stride H*W*C; size-1 dims may have any stride), as PyTorch's is_contiguous(channels_last).
bool is_channels_last(const Shape& sizes, const Strides& strides);
// Whether they are plain dense NCHW.
bool is_nchw_contiguous(const Shape& sizes, const Strides& strides);

// Which convolution an algorithm is chosen for.
enum class Direction { Forward, BackwardData, BackwardFilter };

// Everything an algorithm choice depends on: direction, device, descriptors, determinism.
struct ConvKey {
  Direction direction = Direction::Forward;
  int device = 0;
  DataType type = DataType::Float;
  bool channels_last = false, tensor_ops = false, deterministic = false;
  std::array<int, 4> x_dims{}, x_strides{}, w_dims{}, y_dims{}, y_strides{};
  std::array<int, 2> pad{}, stride{}, dilation{};
  int groups = 1;
  bool operator==(const ConvKey& other) const = default;
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& key) const;
};
ConvKey conv_key(const ConvPlan& plan, Direction direction, int device, bool deterministic);
// "forward float32 NCHW x[8,64,56,56] w[64,64,3,3] pad 1,1 stride 1,1 dilation 1,1 groups 1 ..." (logs, errors).
std::string describe(const ConvKey& key);

// The algorithm chosen for a key and the workspace it needs; one cache per process, filled by the
// first convolution of each key (cuDNN's search) and read by the rest.
struct AlgoChoice {
  int algorithm = 0;       // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  int math_type = 0;       // cudnnMathType_t the search ran it with
  int64_t workspace = 0;   // bytes
};
class AlgoCache {
 public:
  // The cached choice, unless it needs more workspace than `max_workspace` (the limit lowered since
  // it was made: chorus::cuda::set_cudnn_workspace_limit): then none, and the caller searches again.
  std::optional<AlgoChoice> find(const ConvKey& key, int64_t max_workspace = INT64_MAX) const;
  void insert(const ConvKey& key, const AlgoChoice& choice);
  size_t size() const;
  void clear();
  // Every cached choice, in no particular order (benchmarks note what was chosen).
  std::vector<std::pair<ConvKey, AlgoChoice>> entries() const;
  static AlgoCache& global();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<ConvKey, AlgoChoice, ConvKeyHash> map_;
};

}  // namespace chorus::kernels::cudnn_plan
