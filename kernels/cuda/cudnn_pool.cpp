// max_pool2d, avg_pool2d, adaptive_avg_pool2d and their backward of the cuda kernel table through
// cuDNN's pooling (cudnnPoolingForward / cudnnPoolingBackward), following the plan of
// kernels/cuda/cudnn_pool_plan.h ([cuDNN pooling semantics] there). chorus's own kernels (pool.cu,
// *_direct) run whatever the plan sends back (cuDNN off, max pooling with indices, dilation, ceil_mode
// windows past the input, non-uniform adaptive windows, operands in different layouts, empty or
// oversized inputs) and whatever cuDNN answers CUDNN_STATUS_NOT_SUPPORTED, on NCHW float32/float64
// copies of channels-last or 16-bit operands (direct_operand, cudnn_common.h).
//
// Layouts and dtypes: every entry takes its tensors dense NCHW or dense channels-last (all in the
// same layout for cuDNN, which reads NHWC from the strides), in float32, float64, float16 or
// bfloat16; the op layer (nn/functional/conv.cpp, [Pooling operands]) passes the input's layout and
// keeps 16-bit data 16-bit on CUDA. Indices, when a max pool has them, are NCHW-contiguous int64.
//
// [cuDNN average backward] cudnnPoolingBackward takes x and y for every mode; an average's gradient
// is dy spread over each window and reads neither. The avg/adaptive backward entries have no x or y,
// so dy stands in for y and dx for x (same shapes and layouts, so every address cuDNN could form is
// inside an allocation).
// None of this has run on a GPU yet (docs/gpu.md): tests/kernels/cuda:cudnn_gpu_test checks it.
#include <fmt/format.h>

#include <cuda_runtime.h>
#include <cudnn.h>

#include <initializer_list>

#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/cudnn_pool_plan.h"
#include "kernels/cuda/kernels.h"
#include "tensor/error.h"
#include "tensor/runtime.h"

// cuDNN 9 marks its legacy pooling API deprecated in favour of the graph API; it is what the plan's
// descriptors drive. Only this file (and cudnn_bn.cpp) use the deprecated calls.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace chorus::kernels::cuda_impl {
namespace {

namespace cp = ::chorus::kernels::cudnn_plan;

cudnnPoolingMode_t cudnn_mode(cp::PoolingMode m) {
  switch (m) {
    case cp::PoolingMode::Max: return CUDNN_POOLING_MAX;
    case cp::PoolingMode::MaxDeterministic: return CUDNN_POOLING_MAX_DETERMINISTIC;
    case cp::PoolingMode::AverageCountIncludePadding: return CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    case cp::PoolingMode::AverageCountExcludePadding: return CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  }
  return CUDNN_POOLING_MAX;
}

// A status that sends the call to chorus's kernels (cuDNN checks its arguments before it launches
// anything, so nothing has been written yet) or raises.
bool supported(cudnnStatus_t status, const char* what, const cp::PoolPlan& plan) {
  if (status == CUDNN_STATUS_NOT_SUPPORTED) return false;
  if (status != CUDNN_STATUS_SUCCESS) {
    fail("cuDNN {} ({}): {} ({})", what, cp::describe(plan), cudnnGetErrorString(status), static_cast<int>(status));
  }
  return true;
}

struct PoolingDescriptor {
  cudnnPoolingDescriptor_t d = nullptr;
  explicit PoolingDescriptor(const cp::PoolPlan& p) {
    check_cudnn(cudnnCreatePoolingDescriptor(&d), "cudnnCreatePoolingDescriptor");
    check_cudnn(cudnnSetPooling2dDescriptor(d, cudnn_mode(p.mode),
                                            p.propagate_nan ? CUDNN_PROPAGATE_NAN : CUDNN_NOT_PROPAGATE_NAN,
                                            p.window[0], p.window[1], p.pad[0], p.pad[1], p.stride[0], p.stride[1]),
                "cudnnSetPooling2dDescriptor");
  }
  ~PoolingDescriptor() { cudnnDestroyPoolingDescriptor(d); }
  PoolingDescriptor(const PoolingDescriptor&) = delete;
  PoolingDescriptor& operator=(const PoolingDescriptor&) = delete;
};

// The descriptors of a plan, with y's extent checked against cuDNN's own (a plan that mispredicts
// the output fails here, on the first GPU run, not as wrong numbers).
struct Descriptors {
  PoolingDescriptor pool;
  TensorDescriptor x, y;
  explicit Descriptors(const cp::PoolPlan& p) : pool(p), x(p.x), y(p.y) {
    int n, c, h, w;
    check_cudnn(cudnnGetPooling2dForwardOutputDim(pool.d, x.d, &n, &c, &h, &w), "cudnnGetPooling2dForwardOutputDim");
    CHORUS_CHECK(n == p.y.dims[0] && c == p.y.dims[1] && h == p.y.dims[2] && w == p.y.dims[3],
                 "cuDNN pooling ({}) gives an output [{}, {}, {}, {}], the plan expected [{}]", cp::describe(p), n, c, h,
                 w, fmt::join(p.y.dims, ", "));
  }
};

// The layout all the defined operands are dense in (NCHW first: a tensor with one channel or one
// pixel is dense in both, with the same memory either way).
cp::PoolLayout layout_of(std::initializer_list<const Tensor*> operands) {
  bool nchw = true, nhwc = true;
  for (const Tensor* t : operands) {
    if (!t->defined()) continue;
    nchw = nchw && t->is_contiguous();
    nhwc = nhwc && t->is_contiguous(MemoryFormat::ChannelsLast);
  }
  return nchw ? cp::PoolLayout::NCHW : nhwc ? cp::PoolLayout::NHWC : cp::PoolLayout::Mixed;
}

// The call the plan judges: x is the input (or grad_x in backward), for the dtype, batch and channels.
cp::PoolCall pool_call(cp::PoolKind kind, const Tensor& x, std::initializer_list<const Tensor*> operands,
                       const Window2d& w, bool indices) {
  return cp::PoolCall{
      .kind = kind,
      .cudnn_enabled = ::chorus::cuda::cudnn_enabled(),
      .deterministic = ::chorus::cuda::cudnn_deterministic(),
      .indices = indices,
      .dtype = x.dtype(),
      .layout = layout_of(operands),
      .n = x.size(0),
      .c = x.size(1),
      .window = w,
  };
}

// adaptive_avg_pool2d's sizes as a Window2d (what PoolCall reads for PoolKind::AdaptiveAvg).
Window2d adaptive_window(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w) {
  Window2d w;
  w.in_h = in_h;
  w.in_w = in_w;
  w.out_h = out_h;
  w.out_w = out_w;
  return w;
}

bool cudnn_forward(const cp::PoolCall& call, const Tensor& y, const Tensor& x) {
  if (cp::pool_fallback_reason(call)) return false;
  const Device device = x.device();
  DeviceGuard guard(device);
  const cp::PoolPlan plan = cp::plan_pool2d(call);
  const Descriptors desc(plan);
  const Scalars k(plan.x.type);
  cudnnHandle_t h = handle_on_current_stream(device);
  return supported(cudnnPoolingForward(h, desc.pool.d, k.one(), desc.x.d, x.raw_data_ptr(), k.zero(), desc.y.d,
                                       y.raw_data_ptr()),
                   "cudnnPoolingForward", plan);
}

// x and y may be stand-ins for average pooling ([cuDNN average backward]).
bool cudnn_backward(const cp::PoolCall& call, const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& y) {
  if (cp::pool_fallback_reason(call)) return false;
  const Device device = dx.device();
  DeviceGuard guard(device);
  const cp::PoolPlan plan = cp::plan_pool2d(call);
  const Descriptors desc(plan);
  const Scalars k(plan.x.type);
  cudnnHandle_t h = handle_on_current_stream(device);
  return supported(cudnnPoolingBackward(h, desc.pool.d, k.one(), desc.y.d, y.raw_data_ptr(), desc.y.d,
                                        dy.raw_data_ptr(), desc.x.d, x.raw_data_ptr(), k.zero(), desc.x.d,
                                        dx.raw_data_ptr()),
                   "cudnnPoolingBackward", plan);
}

}  // namespace

void max_pool2d(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w) {
  if (cudnn_forward(pool_call(cp::PoolKind::Max, x, {&x, &out}, w, indices.defined()), out, x)) return;
  const Tensor o = direct_operand(out);
  max_pool2d_direct(o, indices, direct_operand(x), w);
  write_back(out, o);
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const Tensor& x,
                         const Tensor& out, const Window2d& w) {
  const cp::PoolCall call =
      pool_call(cp::PoolKind::Max, grad_x, {&grad_x, &grad_out, &x, &out}, w, indices.defined());
  if (cudnn_backward(call, grad_x, grad_out, x, out)) return;
  const Tensor gx = direct_operand(grad_x);
  max_pool2d_backward_direct(gx, direct_operand(grad_out), indices, direct_operand(x), direct_operand(out), w);
  write_back(grad_x, gx);
}

void avg_pool2d(const Tensor& out, const Tensor& x, const Window2d& w, bool count_include_pad) {
  const cp::PoolKind kind = count_include_pad ? cp::PoolKind::AvgIncludePad : cp::PoolKind::AvgExcludePad;
  if (cudnn_forward(pool_call(kind, x, {&x, &out}, w, false), out, x)) return;
  const Tensor o = direct_operand(out);
  avg_pool2d_direct(o, direct_operand(x), w, count_include_pad);
  write_back(out, o);
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Window2d& w, bool count_include_pad) {
  const cp::PoolKind kind = count_include_pad ? cp::PoolKind::AvgIncludePad : cp::PoolKind::AvgExcludePad;
  if (cudnn_backward(pool_call(kind, grad_x, {&grad_x, &grad_out}, w, false), grad_x, grad_out, grad_x, grad_out)) {
    return;
  }
  const Tensor gx = direct_operand(grad_x);
  avg_pool2d_backward_direct(gx, direct_operand(grad_out), w, count_include_pad);
  write_back(grad_x, gx);
}

void adaptive_avg_pool2d(const Tensor& out, const Tensor& x, int64_t in_h, int64_t in_w, int64_t out_h,
                         int64_t out_w) {
  const Window2d w = adaptive_window(in_h, in_w, out_h, out_w);
  if (cudnn_forward(pool_call(cp::PoolKind::AdaptiveAvg, x, {&x, &out}, w, false), out, x)) return;
  const Tensor o = direct_operand(out);
  adaptive_avg_pool2d_direct(o, direct_operand(x), in_h, in_w, out_h, out_w);
  write_back(out, o);
}

void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, int64_t in_h, int64_t in_w,
                                  int64_t out_h, int64_t out_w) {
  const Window2d w = adaptive_window(in_h, in_w, out_h, out_w);
  if (cudnn_backward(pool_call(cp::PoolKind::AdaptiveAvg, grad_x, {&grad_x, &grad_out}, w, false), grad_x, grad_out,
                     grad_x, grad_out)) {
    return;
  }
  const Tensor gx = direct_operand(grad_x);
  adaptive_avg_pool2d_backward_direct(gx, direct_operand(grad_out), in_h, in_w, out_h, out_w);
  write_back(grad_x, gx);
}

}  // namespace chorus::kernels::cuda_impl
