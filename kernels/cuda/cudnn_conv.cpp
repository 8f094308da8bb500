// conv2d forward, backward-data, backward-filter and backward-bias through cuDNN 9's convolution
// API, following the plan of kernels/cuda/cudnn_plan.h (descriptors from the tensors' sizes and
// strides, NCHW or channels-last). The algorithm of each (direction, shapes, layout, dtype, device,
// determinism) is chosen once by cuDNN's search (cudnnFind*AlgorithmEx on the call's own buffers,
// with a workspace from the caching allocator as large as the most demanding algorithm asks for, at
// most chorus::cuda::cudnn_workspace_limit() bytes: [Search workspace]) and cached; later calls only
// allocate the chosen algorithm's workspace. One cuDNN handle per device and thread, set to the
// thread's current stream before every call.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <vector>

#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/cudnn_plan.h"
#include "kernels/cuda/kernels.h"
#include "tensor/error.h"
#include "tensor/runtime.h"

static_assert(static_cast<int>(chorus::kernels::cudnn_plan::MathType::Default) == CUDNN_DEFAULT_MATH &&
                  static_cast<int>(chorus::kernels::cudnn_plan::MathType::TensorOp) == CUDNN_TENSOR_OP_MATH &&
                  static_cast<int>(chorus::kernels::cudnn_plan::MathType::TensorOpAllowConversion) ==
                      CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
                  static_cast<int>(chorus::kernels::cudnn_plan::MathType::Fma) == CUDNN_FMA_MATH,
              "kernels/cuda/cudnn_plan.h's MathType must be cudnnMathType_t's values");

namespace chorus::kernels::cuda_impl {
namespace {

namespace cp = ::chorus::kernels::cudnn_plan;

// RAII descriptors made from the plan (tensors: TensorDescriptor, cudnn_common.h).
struct FilterDescriptor {
  cudnnFilterDescriptor_t d = nullptr;
  explicit FilterDescriptor(const cp::FilterDesc& f) {
    check_cudnn(cudnnCreateFilterDescriptor(&d), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnSetFilterNdDescriptor(d, cudnn_type(f.type),
                                           f.format == cp::FilterFormat::NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, 4,
                                           f.dims.data()),
                "cudnnSetFilterNdDescriptor");
  }
  ~FilterDescriptor() { cudnnDestroyFilterDescriptor(d); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
};

struct ConvolutionDescriptor {
  cudnnConvolutionDescriptor_t d = nullptr;
  explicit ConvolutionDescriptor(const cp::ConvPlan& p) {
    check_cudnn(cudnnCreateConvolutionDescriptor(&d), "cudnnCreateConvolutionDescriptor");
    check_cudnn(cudnnSetConvolutionNdDescriptor(d, 2, p.conv.pad.data(), p.conv.stride.data(), p.conv.dilation.data(),
                                                CUDNN_CROSS_CORRELATION, cudnn_type(p.conv.compute)),
                "cudnnSetConvolutionNdDescriptor");
    check_cudnn(cudnnSetConvolutionGroupCount(d, p.conv.groups), "cudnnSetConvolutionGroupCount");
    // The search below tries the math types this allows (the plan's: FMA math keeps float32 out of
    // TF32, and no plan lets cuDNN convert float32 data to float16).
    check_cudnn(cudnnSetConvolutionMathType(d, static_cast<cudnnMathType_t>(p.math)), "cudnnSetConvolutionMathType");
  }
  void set_math(int math) {
    check_cudnn(cudnnSetConvolutionMathType(d, static_cast<cudnnMathType_t>(math)), "cudnnSetConvolutionMathType");
  }
  ~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(d); }
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
};

// A device buffer of `bytes` from the caching allocator (ordered on the current stream like every
// other tensor); an empty tensor for 0.
Tensor workspace(Device device, int64_t bytes) { return make_tensor({std::max<int64_t>(bytes, 0)}, kUInt8, device); }

// [Search workspace] The search's workspace: as much as the most demanding of the direction's
// algorithms asks for (cudnnGet*WorkspaceSize with the descriptors as they are, each algorithm that
// cuDNN can run here and that stays within the limit), as PyTorch's getMaxWorkspaceSize sizes its
// benchmark's; the whole limit when no size could be asked. Until 2026-12-01 the search always took
// the whole limit (1 GiB), and a backward search runs while nearly all of the forward's activations
// are held: ResNet-50's first step peaked at the activations plus ~1.2 GiB on the H200 (tf32 and
// bf16 alike), where the chosen algorithms need far less.
template <typename Size>
int64_t search_bytes(int count, Size size) {
  const int64_t limit = ::chorus::cuda::cudnn_workspace_limit();
  int64_t most = 0;
  bool asked = false;
  for (int algo = 0; algo < count; ++algo) {
    size_t bytes = 0;
    if (size(algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;  // not supported for these descriptors
    asked = true;
    if (static_cast<int64_t>(bytes) <= limit) most = std::max(most, static_cast<int64_t>(bytes));
  }
  return asked ? most : limit;
}

// A workspace of `bytes`, or the largest the allocator gives now below it (search only): halves on
// failure.
Tensor search_workspace(Device device, int64_t& bytes) {
  while (bytes > 0) {
    try {
      return workspace(device, bytes);
    } catch (const Error&) {
      bytes /= 2;
    }
  }
  return workspace(device, 0);
}

// Picks the first (fastest) result that succeeded, fits the workspace, and is deterministic when
// that is asked for; records it in the cache.
template <typename Perf>
cp::AlgoChoice pick(const std::vector<Perf>& results, int returned, int64_t limit, bool deterministic,
                    cp::MathType math, const cp::ConvKey& key) {
  for (int i = 0; i < returned; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS) continue;
    if (!cp::result_math_allowed(math, static_cast<int>(r.mathType))) continue;
    if (static_cast<int64_t>(r.memory) > limit) continue;
    if (deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    cp::AlgoChoice c{static_cast<int>(r.algo), static_cast<int>(r.mathType), static_cast<int64_t>(r.memory)};
    cp::AlgoCache::global().insert(key, c);
    return c;
  }
  fail("cuDNN: no algorithm for {} ran within the workspace limit of {} bytes{}", cp::describe(key), limit,
       deterministic ? " among the deterministic ones (chorus::cuda::set_cudnn_deterministic)" : "");
}

// The cached choice for `key`, or cuDNN's search (`find` runs cudnnFind*AlgorithmEx with the
// workspace, its size, the result capacity and the output slots) picked and cached.
template <typename Perf, typename Size, typename Find>
cp::AlgoChoice choose(Device device, bool deterministic, cp::MathType math, const cp::ConvKey& key, int count, Size size,
                      Find find) {
  // (a choice made under a larger workspace limit than today's is searched again)
  if (std::optional<cp::AlgoChoice> cached =
          cp::AlgoCache::global().find(key, ::chorus::cuda::cudnn_workspace_limit())) {
    return *cached;
  }
  int64_t limit = search_bytes(count, size);
  Tensor ws = search_workspace(device, limit);
  std::vector<Perf> results(count);
  int returned = 0;
  find(ws.raw_data_ptr(), limit, count, &returned, results.data());
  return pick(results, returned, limit, deterministic, math, key);
}

bool cudnn_can_run(const Tensor& x, const Tensor& weight) {
  if (!::chorus::cuda::cudnn_enabled()) return false;
  const DType d = x.dtype();
  if (d != kFloat32 && d != kFloat64 && d != kFloat16 && d != kBFloat16) return false;
  return weight.dtype() == d;
}

struct Call {
  Device device;
  cudnnHandle_t handle;
  cp::ConvPlan plan;
  bool deterministic;
  Call(const Tensor& x, const Tensor& weight, const Tensor& y, const Window2d& w, int64_t groups)
      : device(x.device()),
        handle(handle_on_current_stream(x.device())),
        plan(cp::plan_conv2d(x.sizes(), x.strides(), weight.sizes(), weight.strides(), y.sizes(), y.strides(), x.dtype(),
                             w, groups, ::chorus::cuda::cudnn_allow_tf32())),
        deterministic(::chorus::cuda::cudnn_deterministic()) {}
  cp::ConvKey key(cp::Direction d) const { return cp::conv_key(plan, d, device.index, deterministic); }
};

// cuDNN 9 has no float64 algorithm for NHWC tensors (none for the backward-data pass on an H100,
// 2026-11-26): a float64 convolution with a channels-last operand runs on NCHW copies
// (direct_operand), as PyTorch's cuDNN convolution does (it suggests the contiguous layout for double).
bool needs_nchw(const Tensor& x, const Tensor& weight, const Tensor& y) {
  return x.dtype() == kFloat64 && !(x.is_contiguous() && weight.is_contiguous() && y.is_contiguous());
}

}  // namespace

void conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
            int64_t groups) {
  if (out.numel() == 0) return;
  if (!cudnn_can_run(x, weight)) {
    const Tensor o = direct_operand(out);
    conv2d_direct(o, direct_operand(x), direct_operand(weight), direct_operand(bias), w, groups);
    return write_back(out, o);
  }
  if (needs_nchw(x, weight, out)) {
    const Tensor o = direct_operand(out);
    conv2d(o, direct_operand(x), direct_operand(weight), bias, w, groups);
    return write_back(out, o);
  }
  DeviceGuard guard(x.device());
  Call call(x, weight, out, w, groups);
  TensorDescriptor xd(call.plan.x), yd(call.plan.y);
  FilterDescriptor wd(call.plan.w);
  ConvolutionDescriptor cd(call.plan);
  const Scalars s(call.plan.conv.compute);
  const cp::ConvKey key = call.key(cp::Direction::Forward);
  const auto choice = choose<cudnnConvolutionFwdAlgoPerf_t>(
      call.device, call.deterministic, call.plan.math, key, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
      [&](int algo, size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(call.handle, xd.d, wd.d, cd.d, yd.d,
                                                       static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
      },
      [&](void* ws, int64_t limit, int count, int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
        check_cudnn(cudnnFindConvolutionForwardAlgorithmEx(call.handle, xd.d, x.raw_data_ptr(), wd.d,
                                                           weight.raw_data_ptr(), cd.d, yd.d, out.raw_data_ptr(), count,
                                                           returned, results, ws, limit),
                    "cudnnFindConvolutionForwardAlgorithmEx");
      });
  cd.set_math(choice.math_type);
  Tensor ws = workspace(call.device, choice.workspace);
  check_cudnn(cudnnConvolutionForward(call.handle, s.one(), xd.d, x.raw_data_ptr(), wd.d, weight.raw_data_ptr(), cd.d,
                                      static_cast<cudnnConvolutionFwdAlgo_t>(choice.algorithm), ws.raw_data_ptr(),
                                      choice.workspace, s.zero(), yd.d, out.raw_data_ptr()),
              "cudnnConvolutionForward");
  if (bias.defined()) {
    TensorDescriptor bd(call.plan.bias);
    check_cudnn(cudnnAddTensor(call.handle, s.one(), bd.d, bias.raw_data_ptr(), s.one(), yd.d, out.raw_data_ptr()),
                "cudnnAddTensor (bias)");
  }
}

namespace {
// Whether a and b (of one shape) lay their elements out alike: the strides of dimensions of size 1
// say nothing (a 1x1 weight [K, C, 1, 1] is both NCHW [C, 1, 1, 1] and channels-last [C, 1, C, C]).
bool same_memory_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}
}  // namespace

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                     const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups) {
  if (!cudnn_can_run(x, weight) || grad_out.numel() == 0 || x.numel() == 0) {
    const Tensor gx = direct_operand(grad_x), gw = direct_operand(grad_weight), gb = direct_operand(grad_bias);
    conv2d_backward_direct(gx, gw, gb, direct_operand(grad_out), direct_operand(x), direct_operand(weight), w, groups);
    write_back(grad_x, gx);
    write_back(grad_weight, gw);
    return write_back(grad_bias, gb);
  }
  if (needs_nchw(x, weight, grad_out)) {
    const Tensor gx = direct_operand(grad_x), gw = direct_operand(grad_weight);
    conv2d_backward(gx, gw, grad_bias, direct_operand(grad_out), direct_operand(x), direct_operand(weight), w, groups);
    write_back(grad_x, gx);
    return write_back(grad_weight, gw);
  }
  DeviceGuard guard(x.device());
  Call call(x, weight, grad_out, w, groups);
  // The gradients are written through the descriptors of x, w and y: they must share those layouts.
  if (grad_x.defined() && !same_memory_layout(grad_x, x)) {
    fail("cuDNN conv2d backward: grad_x strides {} differ from the input's {}", shape_str(grad_x.strides()),
         shape_str(x.strides()));
  }
  if (grad_weight.defined() && !same_memory_layout(grad_weight, weight)) {
    fail("cuDNN conv2d backward: grad_weight strides {} differ from the weight's {}", shape_str(grad_weight.strides()),
         shape_str(weight.strides()));
  }
  TensorDescriptor xd(call.plan.x), yd(call.plan.y);
  FilterDescriptor wd(call.plan.w);
  const Scalars s(call.plan.conv.compute);
  if (grad_x.defined()) {
    ConvolutionDescriptor cd(call.plan);
    const cp::ConvKey key = call.key(cp::Direction::BackwardData);
    const auto choice = choose<cudnnConvolutionBwdDataAlgoPerf_t>(
        call.device, call.deterministic, call.plan.math, key, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        [&](int algo, size_t* bytes) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(call.handle, wd.d, yd.d, cd.d, xd.d,
                                                              static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
        },
        [&](void* ws, int64_t limit, int count, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
          check_cudnn(cudnnFindConvolutionBackwardDataAlgorithmEx(call.handle, wd.d, weight.raw_data_ptr(), yd.d,
                                                                  grad_out.raw_data_ptr(), cd.d, xd.d,
                                                                  grad_x.raw_data_ptr(), count, returned, results, ws,
                                                                  limit),
                      "cudnnFindConvolutionBackwardDataAlgorithmEx");
        });
    cd.set_math(choice.math_type);
    Tensor ws = workspace(call.device, choice.workspace);
    check_cudnn(cudnnConvolutionBackwardData(call.handle, s.one(), wd.d, weight.raw_data_ptr(), yd.d,
                                             grad_out.raw_data_ptr(), cd.d,
                                             static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algorithm),
                                             ws.raw_data_ptr(), choice.workspace, s.zero(), xd.d, grad_x.raw_data_ptr()),
                "cudnnConvolutionBackwardData");
  }
  if (grad_weight.defined()) {
    ConvolutionDescriptor cd(call.plan);
    const cp::ConvKey key = call.key(cp::Direction::BackwardFilter);
    const auto choice = choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
        call.device, call.deterministic, call.plan.math, key, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        [&](int algo, size_t* bytes) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(call.handle, xd.d, yd.d, cd.d, wd.d,
                                                                static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo),
                                                                bytes);
        },
        [&](void* ws, int64_t limit, int count, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* results) {
          check_cudnn(cudnnFindConvolutionBackwardFilterAlgorithmEx(call.handle, xd.d, x.raw_data_ptr(), yd.d,
                                                                    grad_out.raw_data_ptr(), cd.d, wd.d,
                                                                    grad_weight.raw_data_ptr(), count, returned,
                                                                    results, ws, limit),
                      "cudnnFindConvolutionBackwardFilterAlgorithmEx");
        });
    cd.set_math(choice.math_type);
    Tensor ws = workspace(call.device, choice.workspace);
    check_cudnn(cudnnConvolutionBackwardFilter(call.handle, s.one(), xd.d, x.raw_data_ptr(), yd.d,
                                               grad_out.raw_data_ptr(), cd.d,
                                               static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algorithm),
                                               ws.raw_data_ptr(), choice.workspace, s.zero(), wd.d,
                                               grad_weight.raw_data_ptr()),
                "cudnnConvolutionBackwardFilter");
  }
  if (grad_bias.defined()) {
    TensorDescriptor bd(call.plan.bias);
    check_cudnn(cudnnConvolutionBackwardBias(call.handle, s.one(), yd.d, grad_out.raw_data_ptr(), s.zero(), bd.d,
                                             grad_bias.raw_data_ptr()),
                "cudnnConvolutionBackwardBias");
  }
}

}  // namespace chorus::kernels::cuda_impl
