// conv2d and conv2d_backward on CUDA as direct kernels (NCHW, contiguous, float32/float64, groups,
// stride, padding, dilation): forward one thread per output, grad_x one thread per input element
// (gathering the outputs it fed), grad_weight/grad_bias one block per element with a double sum.
// Correct but not fast: the fallback when cuDNN is off (chorus::cuda::set_cudnn_enabled) or cannot
// run a case; cudnn_conv.cpp is the usual path.
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"

namespace chorus::kernels::cuda_impl {
namespace {

constexpr int kThreads = 256;

struct ConvShape {
  int64_t n, c_in, c_out, groups, cin_g, cout_g;
  Window2d w;
};

#define CHORUS_CUDA_LOOP(i, n)                                                                 \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void conv_forward_kernel(T* out, const T* x, const T* weight, const T* bias, ConvShape cs, int64_t total) {
  const Window2d& w = cs.w;
  CHORUS_CUDA_LOOP(idx, total) {
    const int64_t ow = idx % w.out_w, oh = (idx / w.out_w) % w.out_h;
    const int64_t oc = (idx / (w.out_w * w.out_h)) % cs.c_out, n = idx / (w.out_w * w.out_h * cs.c_out);
    const int64_t g = oc / cs.cout_g;
    T acc = bias ? bias[oc] : T(0);
    for (int64_t ic = 0; ic < cs.cin_g; ++ic) {
      const T* plane = x + ((n * cs.c_in) + g * cs.cin_g + ic) * w.in_h * w.in_w;
      const T* wk = weight + (oc * cs.cin_g + ic) * w.kernel_h * w.kernel_w;
      for (int64_t kh = 0; kh < w.kernel_h; ++kh) {
        const int64_t ih = oh * w.stride_h - w.pad_h + kh * w.dilation_h;
        if (ih < 0 || ih >= w.in_h) continue;
        for (int64_t kw = 0; kw < w.kernel_w; ++kw) {
          const int64_t iw = ow * w.stride_w - w.pad_w + kw * w.dilation_w;
          if (iw < 0 || iw >= w.in_w) continue;
          acc += plane[ih * w.in_w + iw] * wk[kh * w.kernel_w + kw];
        }
      }
    }
    out[idx] = acc;
  }
}

template <typename T>
__global__ void conv_grad_x_kernel(T* gx, const T* go, const T* weight, ConvShape cs, int64_t total) {
  const Window2d& w = cs.w;
  CHORUS_CUDA_LOOP(idx, total) {
    const int64_t iw = idx % w.in_w, ih = (idx / w.in_w) % w.in_h;
    const int64_t c = (idx / (w.in_w * w.in_h)) % cs.c_in, n = idx / (w.in_w * w.in_h * cs.c_in);
    const int64_t g = c / cs.cin_g, ic = c % cs.cin_g;
    T acc = 0;
    for (int64_t oc = g * cs.cout_g; oc < (g + 1) * cs.cout_g; ++oc) {
      const T* gplane = go + (n * cs.c_out + oc) * w.out_h * w.out_w;
      const T* wk = weight + (oc * cs.cin_g + ic) * w.kernel_h * w.kernel_w;
      for (int64_t kh = 0; kh < w.kernel_h; ++kh) {
        const int64_t th = ih + w.pad_h - kh * w.dilation_h;
        if (th < 0 || th % w.stride_h != 0) continue;
        const int64_t oh = th / w.stride_h;
        if (oh >= w.out_h) continue;
        for (int64_t kw = 0; kw < w.kernel_w; ++kw) {
          const int64_t tw = iw + w.pad_w - kw * w.dilation_w;
          if (tw < 0 || tw % w.stride_w != 0) continue;
          const int64_t ow = tw / w.stride_w;
          if (ow >= w.out_w) continue;
          acc += gplane[oh * w.out_w + ow] * wk[kh * w.kernel_w + kw];
        }
      }
    }
    gx[idx] = acc;
  }
}

// Block e: weight element e = (oc, ic, kh, kw), summed over (n, oh, ow) in double.
template <typename T>
__global__ void conv_grad_weight_kernel(T* gw, const T* go, const T* x, ConvShape cs, int64_t total) {
  __shared__ double buf[kThreads];
  const Window2d& w = cs.w;
  const int64_t per = cs.n * w.out_h * w.out_w;
  for (int64_t e = blockIdx.x; e < total; e += gridDim.x) {
    const int64_t kw = e % w.kernel_w, kh = (e / w.kernel_w) % w.kernel_h;
    const int64_t ic = (e / (w.kernel_w * w.kernel_h)) % cs.cin_g, oc = e / (w.kernel_w * w.kernel_h * cs.cin_g);
    const int64_t c = (oc / cs.cout_g) * cs.cin_g + ic;
    double acc = 0;
    for (int64_t k = threadIdx.x; k < per; k += blockDim.x) {
      const int64_t ow = k % w.out_w, oh = (k / w.out_w) % w.out_h, n = k / (w.out_w * w.out_h);
      const int64_t ih = oh * w.stride_h - w.pad_h + kh * w.dilation_h;
      const int64_t iw = ow * w.stride_w - w.pad_w + kw * w.dilation_w;
      if (ih < 0 || ih >= w.in_h || iw < 0 || iw >= w.in_w) continue;
      acc += static_cast<double>(go[((n * cs.c_out + oc) * w.out_h + oh) * w.out_w + ow]) *
             static_cast<double>(x[((n * cs.c_in + c) * w.in_h + ih) * w.in_w + iw]);
    }
    acc = block_reduce(acc, SumOp{}, buf);
    if (threadIdx.x == 0) gw[e] = static_cast<T>(acc);
  }
}

template <typename T>
__global__ void conv_grad_bias_kernel(T* gb, const T* go, ConvShape cs) {
  __shared__ double buf[kThreads];
  const int64_t plane = cs.w.out_h * cs.w.out_w, per = cs.n * plane;
  for (int64_t oc = blockIdx.x; oc < cs.c_out; oc += gridDim.x) {
    double acc = 0;
    for (int64_t k = threadIdx.x; k < per; k += blockDim.x) acc += go[((k / plane) * cs.c_out + oc) * plane + k % plane];
    acc = block_reduce(acc, SumOp{}, buf);
    if (threadIdx.x == 0) gb[oc] = static_cast<T>(acc);
  }
}

#undef CHORUS_CUDA_LOOP

ConvShape conv_shape(const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups) {
  ConvShape cs;
  cs.n = x.size(0);
  cs.c_in = x.size(1);
  cs.c_out = weight.size(0);
  cs.groups = groups;
  cs.cin_g = cs.c_in / groups;
  cs.cout_g = cs.c_out / groups;
  cs.w = w;
  return cs;
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(n, 1), 65535LL * 16)); }

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data_ptr()) : nullptr;
}

}  // namespace

void conv2d_direct(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
                   int64_t groups) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const ConvShape cs = conv_shape(x, weight, w, groups);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "conv2d", [&]<typename T>() {
    LaunchContext ctx(x.device());
    conv_forward_kernel<T><<<grid_for(total, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        ptr_or_null<T>(out), ptr_or_null<const T>(x), ptr_or_null<const T>(weight), ptr_or_null<const T>(bias), cs,
        total);
    check_launch("conv2d");
  });
}

void conv2d_backward_direct(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                            const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Window2d& w,
                            int64_t groups) {
  const ConvShape cs = conv_shape(x, weight, w, groups);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "conv2d_backward", [&]<typename T>() {
    LaunchContext ctx(x.device());
    if (grad_x.defined() && grad_x.numel() > 0) {
      conv_grad_x_kernel<T><<<grid_for(grad_x.numel(), kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
          ptr_or_null<T>(grad_x), ptr_or_null<const T>(grad_out), ptr_or_null<const T>(weight), cs, grad_x.numel());
      check_launch("conv2d_backward (input)");
    }
    if (grad_weight.defined() && grad_weight.numel() > 0) {
      conv_grad_weight_kernel<T><<<blocks_for(grad_weight.numel()), kThreads, 0, ctx.stream>>>(
          ptr_or_null<T>(grad_weight), ptr_or_null<const T>(grad_out), ptr_or_null<const T>(x), cs,
          grad_weight.numel());
      check_launch("conv2d_backward (weight)");
    }
    if (grad_bias.defined() && grad_bias.numel() > 0) {
      conv_grad_bias_kernel<T><<<blocks_for(cs.c_out), kThreads, 0, ctx.stream>>>(
          ptr_or_null<T>(grad_bias), ptr_or_null<const T>(grad_out), cs);
      check_launch("conv2d_backward (bias)");
    }
  });
}

}  // namespace chorus::kernels::cuda_impl
