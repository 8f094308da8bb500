// Convolution on the CPU: oneDNN where it handles the case (onednn_conv.h), else im2col and Eigen GEMMs
// over chunks of the batch. Pooling is in pool.cpp, batch norm in batch_norm.cpp.
#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/onednn_conv.h"

#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/nchw_copies.h"
#include "kernels/cpu/parallel.h"

namespace chorus::kernels::cpu {
namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const RowMat<T>>;
template <typename T>
using MutMap = Eigen::Map<RowMat<T>>;

bool is_pointwise(const Window2d& w) {
  return w.kernel_h == 1 && w.kernel_w == 1 && w.stride_h == 1 && w.stride_w == 1 && w.pad_h == 0 &&
         w.pad_w == 0;
}

// col [C*kH*kW, OH*OW] from one sample's C planes.
template <typename T>
void im2col(T* col, const T* x, int64_t channels, const Window2d& w) {
  const int64_t ohw = w.out_h * w.out_w;
  for (int64_t c = 0; c < channels; ++c) {
    const T* plane = x + c * w.in_h * w.in_w;
    for (int64_t ki = 0; ki < w.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < w.kernel_w; ++kj) {
        T* row = col + ((c * w.kernel_h + ki) * w.kernel_w + kj) * ohw;
        for (int64_t oh = 0; oh < w.out_h; ++oh) {
          T* dst = row + oh * w.out_w;
          const int64_t ih = oh * w.stride_h - w.pad_h + ki * w.dilation_h;
          if (ih < 0 || ih >= w.in_h) {
            std::fill(dst, dst + w.out_w, T(0));
            continue;
          }
          const T* src = plane + ih * w.in_w;
          const int64_t iw0 = kj * w.dilation_w - w.pad_w;
          // Output columns whose input column is inside the row: [lo, hi); zeros around them.
          const int64_t lo = iw0 >= 0 ? 0 : std::min(w.out_w, (-iw0 + w.stride_w - 1) / w.stride_w);
          const int64_t hi = iw0 >= w.in_w ? lo : std::max(lo, std::min(w.out_w, (w.in_w - 1 - iw0) / w.stride_w + 1));
          std::fill(dst, dst + lo, T(0));
          if (w.stride_w == 1) {
            std::copy(src + lo + iw0, src + hi + iw0, dst + lo);
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * w.stride_w + iw0];
          }
          std::fill(dst + hi, dst + w.out_w, T(0));
        }
      }
    }
  }
}

// Adds col [C*kH*kW, OH*OW] back into one sample's C planes (the adjoint of im2col).
template <typename T>
void col2im_add(T* x, const T* col, int64_t channels, const Window2d& w) {
  const int64_t ohw = w.out_h * w.out_w;
  for (int64_t c = 0; c < channels; ++c) {
    T* plane = x + c * w.in_h * w.in_w;
    for (int64_t ki = 0; ki < w.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < w.kernel_w; ++kj) {
        const T* row = col + ((c * w.kernel_h + ki) * w.kernel_w + kj) * ohw;
        for (int64_t oh = 0; oh < w.out_h; ++oh) {
          const int64_t ih = oh * w.stride_h - w.pad_h + ki * w.dilation_h;
          if (ih < 0 || ih >= w.in_h) continue;
          const T* src = row + oh * w.out_w;
          T* dst = plane + ih * w.in_w;
          const int64_t iw0 = kj * w.dilation_w - w.pad_w;
          const int64_t lo = iw0 >= 0 ? 0 : std::min(w.out_w, (-iw0 + w.stride_w - 1) / w.stride_w);
          const int64_t hi = iw0 >= w.in_w ? lo : std::max(lo, std::min(w.out_w, (w.in_w - 1 - iw0) / w.stride_w + 1));
          if (w.stride_w == 1) {
            simd_for(lo, hi, [&](int64_t ow) CHORUS_ELEMENT { dst[ow + iw0] += src[ow]; });
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow * w.stride_w + iw0] += src[ow];
          }
        }
      }
    }
  }
}

// Splits the batch into one chunk per thread, each running single-threaded GEMMs (Eigen stays on
// one thread inside a parallel region); a batch of one sample runs its GEMMs on every thread.
template <typename F>
void over_batch(int64_t batch, const F& f) {
  const int64_t chunks = std::min<int64_t>(num_threads(), batch);
  if (chunks <= 1) {
    sync_eigen_threads();
    f(0, 0, batch);
    return;
  }
  parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) f(c, batch * c / chunks, batch * (c + 1) / chunks);
  });
}

int64_t batch_chunks(int64_t batch) { return std::max<int64_t>(1, std::min<int64_t>(num_threads(), batch)); }

template <typename T>
void conv2d_typed(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
                  int64_t groups) {
  const int64_t n = x.size(0), c_in = x.size(1), c_out = weight.size(0);
  const int64_t cg = c_in / groups, og = c_out / groups;
  const int64_t ckk = cg * w.kernel_h * w.kernel_w, ohw = w.out_h * w.out_w, hw = w.in_h * w.in_w;
  const T* px = x.data_ptr<T>();
  const T* pw = weight.data_ptr<T>();
  const T* pb = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* po = out.data_ptr<T>();
  const bool pointwise = is_pointwise(w);
  over_batch(n, [&](int64_t, int64_t lo, int64_t hi) {
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(ckk * ohw));
    for (int64_t s = lo; s < hi; ++s) {
      for (int64_t g = 0; g < groups; ++g) {
        const T* xg = px + (s * c_in + g * cg) * hw;
        const T* src = xg;
        if (!pointwise) {
          im2col(col.data(), xg, cg, w);
          src = col.data();
        }
        MutMap<T> o(po + (s * c_out + g * og) * ohw, og, ohw);
        o.noalias() = ConstMap<T>(pw + g * og * ckk, og, ckk) * ConstMap<T>(src, ckk, ohw);
        if (pb) {
          for (int64_t k = 0; k < og; ++k) o.row(k).array() += pb[g * og + k];
        }
      }
    }
  });
}

template <typename T>
void conv2d_backward_typed(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                           const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Window2d& w,
                           int64_t groups) {
  const int64_t n = x.size(0), c_in = x.size(1), c_out = weight.size(0);
  const int64_t cg = c_in / groups, og = c_out / groups;
  const int64_t ckk = cg * w.kernel_h * w.kernel_w, ohw = w.out_h * w.out_w, hw = w.in_h * w.in_w;
  const T* px = x.data_ptr<T>();
  const T* pw = weight.data_ptr<T>();
  const T* pg = grad_out.data_ptr<T>();
  T* pgx = grad_x.defined() ? grad_x.data_ptr<T>() : nullptr;
  const bool want_w = grad_weight.defined(), want_b = grad_bias.defined();
  const bool pointwise = is_pointwise(w);
  // Per-chunk partial parameter gradients, summed afterwards: no atomics, deterministic for a
  // given thread count.
  const int64_t chunks = batch_chunks(n);
  std::vector<std::vector<T>> part_w(chunks), part_b(chunks);
  over_batch(n, [&](int64_t chunk, int64_t lo, int64_t hi) {
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(ckk * ohw));
    if (want_w) part_w[chunk].assign(static_cast<size_t>(c_out * ckk), T(0));
    if (want_b) part_b[chunk].assign(static_cast<size_t>(c_out), T(0));
    for (int64_t s = lo; s < hi; ++s) {
      for (int64_t g = 0; g < groups; ++g) {
        ConstMap<T> go(pg + (s * c_out + g * og) * ohw, og, ohw);
        ConstMap<T> wg(pw + g * og * ckk, og, ckk);
        if (want_w) {
          const T* xg = px + (s * c_in + g * cg) * hw;
          const T* src = xg;
          if (!pointwise) {
            im2col(col.data(), xg, cg, w);
            src = col.data();
          }
          MutMap<T> dw(part_w[chunk].data() + g * og * ckk, og, ckk);
          dw.noalias() += go * ConstMap<T>(src, ckk, ohw).transpose();
        }
        if (want_b) {
          for (int64_t k = 0; k < og; ++k) part_b[chunk][g * og + k] += go.row(k).sum();
        }
        if (pgx) {
          T* gxg = pgx + (s * c_in + g * cg) * hw;
          if (pointwise) {
            MutMap<T>(gxg, cg, hw).noalias() = wg.transpose() * go;
          } else {
            MutMap<T> dcol(col.data(), ckk, ohw);
            dcol.noalias() = wg.transpose() * go;
            std::fill(gxg, gxg + cg * hw, T(0));
            col2im_add(gxg, col.data(), cg, w);
          }
        }
      }
    }
  });
  if (want_w) {
    T* dst = grad_weight.data_ptr<T>();
    std::fill(dst, dst + c_out * ckk, T(0));
    for (const auto& p : part_w)
      for (int64_t i = 0; i < c_out * ckk; ++i) dst[i] += p[i];
  }
  if (want_b) {
    T* dst = grad_bias.data_ptr<T>();
    std::fill(dst, dst + c_out, T(0));
    for (const auto& p : part_b)
      for (int64_t i = 0; i < c_out; ++i) dst[i] += p[i];
  }
}


}  // namespace

void conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
            int64_t groups) {
  if (onednn::handles(x, weight, w)) return onednn::conv2d(out, x, weight, bias, w, groups);
  const Tensor o = nchw_result(out);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "conv2d",
                           [&]<typename T>() { conv2d_typed<T>(o, nchw(x), nchw(weight), bias, w, groups); });
  write_back(out, o);
}

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                     const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups) {
  if (onednn::handles(x, weight, w)) return onednn::conv2d_backward(grad_x, grad_weight, grad_bias, grad_out, x, weight, w, groups);
  const Tensor gx = nchw_result(grad_x), gw = nchw_result(grad_weight);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "conv2d_backward", [&]<typename T>() {
    conv2d_backward_typed<T>(gx, gw, grad_bias, nchw(grad_out), nchw(x), nchw(weight), w, groups);
  });
  write_back(grad_x, gx);
  write_back(grad_weight, gw);
}

}  // namespace chorus::kernels::cpu
