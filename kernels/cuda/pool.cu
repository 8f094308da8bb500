// chorus's own max/avg/adaptive-avg 2-D pooling and their backward on CUDA (NCHW planes, contiguous,
// float32 or float64), with the cpu kernels' windows (kernels/cpu/conv.cpp, kernels/shared/pool_math.h):
// one thread per output cell forward; backward zeroes grad_x and adds each output's share with
// atomicAdd (order-dependent rounding). The table entries (cudnn_pool.cpp) run cuDNN where its plan
// allows and these (*_direct) otherwise.
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/pool_math.h"

namespace chorus::kernels::cuda_impl {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

#define CHORUS_CUDA_LOOP(i, n)                                                                 \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void max_pool_kernel(T* out, int64_t* indices, const T* x, int64_t total, Window2d w) {
  CHORUS_CUDA_LOOP(idx, total) {
    const int64_t ow = idx % w.out_w, oh = (idx / w.out_w) % w.out_h, p = idx / (w.out_w * w.out_h);
    T best;
    const int64_t best_i = shared::max_pool_argmax(x + p * w.in_h * w.in_w, w, oh, ow, best);
    out[idx] = best;
    if (indices != nullptr) indices[idx] = best_i;
  }
}

template <typename T>
__global__ void max_pool_backward_kernel(T* gx, const T* go, const int64_t* indices, int64_t total, int64_t out_plane,
                                         int64_t in_plane) {
  CHORUS_CUDA_LOOP(idx, total) { atomicAdd(gx + (idx / out_plane) * in_plane + indices[idx], go[idx]); }
}

// Without indices: each output cell finds its element again from x and out ([Max-pool arg-max]).
template <typename T>
__global__ void max_pool_backward_recompute_kernel(T* gx, const T* go, const T* x, const T* out, int64_t total,
                                                   Window2d w) {
  CHORUS_CUDA_LOOP(idx, total) {
    const int64_t ow = idx % w.out_w, oh = (idx / w.out_w) % w.out_h, p = idx / (w.out_w * w.out_h);
    const int64_t in_plane = w.in_h * w.in_w;
    const int64_t i = shared::max_pool_first_match(x + p * in_plane, w, oh, ow, out[idx]);
    atomicAdd(gx + p * in_plane + i, go[idx]);
  }
}

// avg_pool2d's clipped window and divisor, as the cpu kernel's avg_cell.
struct AvgCell {
  int64_t h0, h1, w0, w1, divisor;
};
__device__ __forceinline__ AvgCell avg_cell(const Window2d& w, int64_t oh, int64_t ow, bool count_include_pad) {
  int64_t h0 = oh * w.stride_h - w.pad_h, w0 = ow * w.stride_w - w.pad_w;
  int64_t h1 = imin(h0 + w.kernel_h, w.in_h + w.pad_h), w1 = imin(w0 + w.kernel_w, w.in_w + w.pad_w);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = imax(h0, 0);
  w0 = imax(w0, 0);
  h1 = imin(h1, w.in_h);
  w1 = imin(w1, w.in_w);
  const int64_t divisor = count_include_pad ? padded : (h1 - h0) * (w1 - w0);
  return {h0, h1, w0, w1, imax(divisor, 1)};
}

template <typename T>
__global__ void avg_pool_kernel(T* out, const T* x, int64_t total, Window2d w, bool count_include_pad) {
  CHORUS_CUDA_LOOP(idx, total) {
    const int64_t ow = idx % w.out_w, oh = (idx / w.out_w) % w.out_h, p = idx / (w.out_w * w.out_h);
    const T* plane = x + p * w.in_h * w.in_w;
    const AvgCell c = avg_cell(w, oh, ow, count_include_pad);
    T s = 0;
    for (int64_t ih = c.h0; ih < c.h1; ++ih)
      for (int64_t iw = c.w0; iw < c.w1; ++iw) s += plane[ih * w.in_w + iw];
    out[idx] = s / static_cast<T>(c.divisor);
  }
}

template <typename T>
__global__ void avg_pool_backward_kernel(T* gx, const T* go, int64_t total, Window2d w, bool count_include_pad) {
  CHORUS_CUDA_LOOP(idx, total) {
    const int64_t ow = idx % w.out_w, oh = (idx / w.out_w) % w.out_h, p = idx / (w.out_w * w.out_h);
    T* plane = gx + p * w.in_h * w.in_w;
    const AvgCell c = avg_cell(w, oh, ow, count_include_pad);
    const T g = go[idx] / static_cast<T>(c.divisor);
    for (int64_t ih = c.h0; ih < c.h1; ++ih)
      for (int64_t iw = c.w0; iw < c.w1; ++iw) atomicAdd(plane + ih * w.in_w + iw, g);
  }
}

__device__ __forceinline__ int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
__device__ __forceinline__ int64_t adaptive_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

template <typename T, bool Backward>
__global__ void adaptive_avg_kernel(T* out_or_gx, const T* x_or_go, int64_t total, int64_t in_h, int64_t in_w,
                                    int64_t out_h, int64_t out_w) {
  CHORUS_CUDA_LOOP(idx, total) {
    const int64_t ow = idx % out_w, oh = (idx / out_w) % out_h, p = idx / (out_w * out_h);
    const int64_t h0 = adaptive_start(oh, in_h, out_h), h1 = adaptive_end(oh, in_h, out_h);
    const int64_t w0 = adaptive_start(ow, in_w, out_w), w1 = adaptive_end(ow, in_w, out_w);
    if constexpr (Backward) {
      T* plane = out_or_gx + p * in_h * in_w;
      const T g = x_or_go[idx] / static_cast<T>((h1 - h0) * (w1 - w0));
      for (int64_t ih = h0; ih < h1; ++ih)
        for (int64_t iw = w0; iw < w1; ++iw) atomicAdd(plane + ih * in_w + iw, g);
    } else {
      const T* plane = x_or_go + p * in_h * in_w;
      T s = 0;
      for (int64_t ih = h0; ih < h1; ++ih)
        for (int64_t iw = w0; iw < w1; ++iw) s += plane[ih * in_w + iw];
      out_or_gx[idx] = s / static_cast<T>((h1 - h0) * (w1 - w0));
    }
  }
}

#undef CHORUS_CUDA_LOOP

void zero(const Tensor& t, const LaunchContext& ctx) {
  check_cuda(cudaMemsetAsync(t.raw_data_ptr(), 0, t.nbytes(), ctx.stream), "pooling backward (zero grad_x)");
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data_ptr());
}

}  // namespace

void max_pool2d_direct(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w) {
  const int64_t total = out.numel();
  if (total == 0) return;
  CHORUS_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&]<typename T>() {
    LaunchContext ctx(x.device());
    max_pool_kernel<T><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        ptr<T>(out), indices.defined() ? ptr<int64_t>(indices) : nullptr, ptr<const T>(x), total, w);
    check_launch("max_pool2d");
  });
}

void max_pool2d_backward_direct(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const Tensor& x,
                                const Tensor& out, const Window2d& w) {
  const int64_t in_plane = grad_x.size(2) * grad_x.size(3);
  const int64_t out_plane = grad_out.size(2) * grad_out.size(3);
  CHORUS_DISPATCH_FLOATING(grad_x.dtype(), "max_pool2d_backward", [&]<typename T>() {
    LaunchContext ctx(grad_x.device());
    zero(grad_x, ctx);
    const int64_t total = grad_out.numel();
    if (total == 0 || out_plane == 0) return;
    if (indices.defined()) {
      max_pool_backward_kernel<T><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
          ptr<T>(grad_x), ptr<const T>(grad_out), ptr<const int64_t>(indices), total, out_plane, in_plane);
    } else {
      max_pool_backward_recompute_kernel<T><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
          ptr<T>(grad_x), ptr<const T>(grad_out), ptr<const T>(x), ptr<const T>(out), total, w);
    }
    check_launch("max_pool2d_backward");
  });
}

void avg_pool2d_direct(const Tensor& out, const Tensor& x, const Window2d& w, bool count_include_pad) {
  const int64_t total = out.numel();
  if (total == 0) return;
  CHORUS_DISPATCH_FLOATING(x.dtype(), "avg_pool2d", [&]<typename T>() {
    LaunchContext ctx(x.device());
    avg_pool_kernel<T><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        ptr<T>(out), ptr<const T>(x), total, w, count_include_pad);
    check_launch("avg_pool2d");
  });
}

void avg_pool2d_backward_direct(const Tensor& grad_x, const Tensor& grad_out, const Window2d& w,
                                bool count_include_pad) {
  CHORUS_DISPATCH_FLOATING(grad_x.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    LaunchContext ctx(grad_x.device());
    zero(grad_x, ctx);
    const int64_t total = grad_out.numel();
    if (total == 0) return;
    avg_pool_backward_kernel<T><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        ptr<T>(grad_x), ptr<const T>(grad_out), total, w, count_include_pad);
    check_launch("avg_pool2d_backward");
  });
}

void adaptive_avg_pool2d_direct(const Tensor& out, const Tensor& x, int64_t in_h, int64_t in_w, int64_t out_h,
                                int64_t out_w) {
  const int64_t total = out.numel();
  if (total == 0) return;
  CHORUS_DISPATCH_FLOATING(x.dtype(), "adaptive_avg_pool2d", [&]<typename T>() {
    LaunchContext ctx(x.device());
    adaptive_avg_kernel<T, false><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        ptr<T>(out), ptr<const T>(x), total, in_h, in_w, out_h, out_w);
    check_launch("adaptive_avg_pool2d");
  });
}

void adaptive_avg_pool2d_backward_direct(const Tensor& grad_x, const Tensor& grad_out, int64_t in_h, int64_t in_w,
                                         int64_t out_h, int64_t out_w) {
  CHORUS_DISPATCH_FLOATING(grad_x.dtype(), "adaptive_avg_pool2d_backward", [&]<typename T>() {
    LaunchContext ctx(grad_x.device());
    zero(grad_x, ctx);
    const int64_t total = grad_out.numel();
    if (total == 0) return;
    adaptive_avg_kernel<T, true><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        ptr<T>(grad_x), ptr<const T>(grad_out), total, in_h, in_w, out_h, out_w);
    check_launch("adaptive_avg_pool2d_backward");
  });
}

}  // namespace chorus::kernels::cuda_impl
