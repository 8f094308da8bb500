#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/onednn_conv.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shared/reduce_math.h"
#include "kernels/shared/pointwise_math.h"
#include "kernels/shared/pool_math.h"

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
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow + iw0] += src[ow];
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

int64_t plane_grain(int64_t plane_work) { return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(plane_work, 1)); }

}  // namespace

namespace {
// The direct kernels read and write NCHW memory: a channels-last operand goes through an NCHW copy
// in host memory (a sim device's task may touch host memory, never fresh device memory), and a
// channels-last result is copied back by write_back.
Tensor nchw(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor dense = make_tensor(t.sizes(), t.dtype(), kCPU);
  copy(dense, t);
  return dense;
}
Tensor nchw_result(const Tensor& t) {
  return !t.defined() || t.is_contiguous() ? t : make_tensor(t.sizes(), t.dtype(), kCPU);
}
void write_back(const Tensor& result, const Tensor& computed) {
  if (computed.defined() && !computed.is_same(result)) copy(result, computed);
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

// ------------------------------------------------------------------ pooling
// Each kernel computes plane by plane in NCHW; the table entries below take NCHW or channels-last
// tensors through nchw() copies and write_back, as conv2d does.
namespace {

// Writes indices only when they are defined (the op layer's max_pool2d keeps x and out instead).
void max_pool2d_nchw(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w) {
  const int64_t planes = out.numel() / std::max<int64_t>(1, w.out_h * w.out_w);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    int64_t* pi = indices.defined() ? indices.data_ptr<int64_t>() : nullptr;
    const int64_t work = w.out_h * w.out_w * w.kernel_h * w.kernel_w;
    parallel_for(0, planes, plane_grain(work), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const T* plane = px + p * w.in_h * w.in_w;
        const int64_t o0 = p * w.out_h * w.out_w;
        for (int64_t oh = 0; oh < w.out_h; ++oh) {
          for (int64_t ow = 0; ow < w.out_w; ++ow) {
            T best;
            const int64_t best_i = shared::max_pool_argmax(plane, w, oh, ow, best);
            po[o0 + oh * w.out_w + ow] = best;
            if (pi != nullptr) pi[o0 + oh * w.out_w + ow] = best_i;
          }
        }
      }
    });
  });
}

// With indices: scatters by them. Without: finds each output's element again in x
// ([Max-pool arg-max], kernels/shared/pool_math.h), the same element the indices would name.
void max_pool2d_backward_nchw(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const Tensor& x,
                              const Tensor& out, const Window2d& w) {
  const int64_t planes = grad_x.size(0) * grad_x.size(1);
  const int64_t in_plane = grad_x.size(2) * grad_x.size(3);
  const int64_t out_plane = grad_out.size(2) * grad_out.size(3);
  CHORUS_DISPATCH_FLOATING(grad_x.dtype(), "max_pool2d_backward", [&]<typename T>() {
    T* gx = grad_x.data_ptr<T>();
    const T* go = grad_out.data_ptr<T>();
    const int64_t* pi = indices.defined() ? indices.data_ptr<int64_t>() : nullptr;
    const T* px = pi == nullptr ? x.data_ptr<T>() : nullptr;
    const T* po = pi == nullptr ? out.data_ptr<T>() : nullptr;
    parallel_for(0, planes, plane_grain(in_plane + out_plane), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        T* dst = gx + p * in_plane;
        std::fill(dst, dst + in_plane, T(0));
        const int64_t o0 = p * out_plane;
        if (pi != nullptr) {
          for (int64_t o = 0; o < out_plane; ++o) dst[pi[o0 + o]] += go[o0 + o];
          continue;
        }
        const T* plane = px + p * in_plane;
        for (int64_t oh = 0; oh < w.out_h; ++oh) {
          for (int64_t ow = 0; ow < w.out_w; ++ow) {
            const int64_t o = oh * w.out_w + ow;
            dst[shared::max_pool_first_match(plane, w, oh, ow, po[o0 + o])] += go[o0 + o];
          }
        }
      }
    });
  });
}

// avg_pool2d's window [h0, h1) x [w0, w1) clipped to the input, and its divisor, as PyTorch.
struct AvgCell {
  int64_t h0, h1, w0, w1;
  int64_t divisor;
};

AvgCell avg_cell(const Window2d& w, int64_t oh, int64_t ow, bool count_include_pad) {
  int64_t h0 = oh * w.stride_h - w.pad_h, w0 = ow * w.stride_w - w.pad_w;
  int64_t h1 = std::min(h0 + w.kernel_h, w.in_h + w.pad_h), w1 = std::min(w0 + w.kernel_w, w.in_w + w.pad_w);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, w.in_h);
  w1 = std::min(w1, w.in_w);
  const int64_t divisor = count_include_pad ? padded : (h1 - h0) * (w1 - w0);
  return {h0, h1, w0, w1, std::max<int64_t>(divisor, 1)};
}

void avg_pool2d_nchw(const Tensor& out, const Tensor& x, const Window2d& w, bool count_include_pad) {
  const int64_t planes = out.numel() / std::max<int64_t>(1, w.out_h * w.out_w);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "avg_pool2d", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(0, planes, plane_grain(w.out_h * w.out_w * w.kernel_h * w.kernel_w), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const T* plane = px + p * w.in_h * w.in_w;
        for (int64_t oh = 0; oh < w.out_h; ++oh) {
          for (int64_t ow = 0; ow < w.out_w; ++ow) {
            const AvgCell c = avg_cell(w, oh, ow, count_include_pad);
            T s = 0;
            for (int64_t ih = c.h0; ih < c.h1; ++ih)
              for (int64_t iw = c.w0; iw < c.w1; ++iw) s += plane[ih * w.in_w + iw];
            po[(p * w.out_h + oh) * w.out_w + ow] = s / static_cast<T>(c.divisor);
          }
        }
      }
    });
  });
}

void avg_pool2d_backward_nchw(const Tensor& grad_x, const Tensor& grad_out, const Window2d& w, bool count_include_pad) {
  const int64_t planes = grad_out.numel() / std::max<int64_t>(1, w.out_h * w.out_w);
  CHORUS_DISPATCH_FLOATING(grad_x.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    T* gx = grad_x.data_ptr<T>();
    const T* go = grad_out.data_ptr<T>();
    parallel_for(0, planes, plane_grain(w.out_h * w.out_w * w.kernel_h * w.kernel_w), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        T* plane = gx + p * w.in_h * w.in_w;
        std::fill(plane, plane + w.in_h * w.in_w, T(0));
        for (int64_t oh = 0; oh < w.out_h; ++oh) {
          for (int64_t ow = 0; ow < w.out_w; ++ow) {
            const AvgCell c = avg_cell(w, oh, ow, count_include_pad);
            const T g = go[(p * w.out_h + oh) * w.out_w + ow] / static_cast<T>(c.divisor);
            for (int64_t ih = c.h0; ih < c.h1; ++ih)
              for (int64_t iw = c.w0; iw < c.w1; ++iw) plane[ih * w.in_w + iw] += g;
          }
        }
      }
    });
  });
}

int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
int64_t adaptive_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

void adaptive_avg_pool2d_nchw(const Tensor& out, const Tensor& x, int64_t in_h, int64_t in_w, int64_t out_h,
                              int64_t out_w) {
  const int64_t planes = out.numel() / std::max<int64_t>(1, out_h * out_w);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "adaptive_avg_pool2d", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(0, planes, plane_grain(in_h * in_w), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const T* plane = px + p * in_h * in_w;
        for (int64_t oh = 0; oh < out_h; ++oh) {
          const int64_t h0 = adaptive_start(oh, in_h, out_h), h1 = adaptive_end(oh, in_h, out_h);
          for (int64_t ow = 0; ow < out_w; ++ow) {
            const int64_t w0 = adaptive_start(ow, in_w, out_w), w1 = adaptive_end(ow, in_w, out_w);
            T s = 0;
            for (int64_t ih = h0; ih < h1; ++ih)
              for (int64_t iw = w0; iw < w1; ++iw) s += plane[ih * in_w + iw];
            po[(p * out_h + oh) * out_w + ow] = s / static_cast<T>((h1 - h0) * (w1 - w0));
          }
        }
      }
    });
  });
}

void adaptive_avg_pool2d_backward_nchw(const Tensor& grad_x, const Tensor& grad_out, int64_t in_h, int64_t in_w,
                                       int64_t out_h, int64_t out_w) {
  const int64_t planes = grad_out.numel() / std::max<int64_t>(1, out_h * out_w);
  CHORUS_DISPATCH_FLOATING(grad_x.dtype(), "adaptive_avg_pool2d_backward", [&]<typename T>() {
    T* gx = grad_x.data_ptr<T>();
    const T* go = grad_out.data_ptr<T>();
    parallel_for(0, planes, plane_grain(in_h * in_w), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        T* plane = gx + p * in_h * in_w;
        std::fill(plane, plane + in_h * in_w, T(0));
        for (int64_t oh = 0; oh < out_h; ++oh) {
          const int64_t h0 = adaptive_start(oh, in_h, out_h), h1 = adaptive_end(oh, in_h, out_h);
          for (int64_t ow = 0; ow < out_w; ++ow) {
            const int64_t w0 = adaptive_start(ow, in_w, out_w), w1 = adaptive_end(ow, in_w, out_w);
            const T g = go[(p * out_h + oh) * out_w + ow] / static_cast<T>((h1 - h0) * (w1 - w0));
            for (int64_t ih = h0; ih < h1; ++ih)
              for (int64_t iw = w0; iw < w1; ++iw) plane[ih * in_w + iw] += g;
          }
        }
      }
    });
  });
}

}  // namespace

void max_pool2d(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w) {
  const Tensor o = nchw_result(out);
  max_pool2d_nchw(o, indices, nchw(x), w);
  write_back(out, o);
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const Tensor& x,
                         const Tensor& out, const Window2d& w) {
  const Tensor gx = nchw_result(grad_x);
  max_pool2d_backward_nchw(gx, nchw(grad_out), indices, indices.defined() ? Tensor() : nchw(x),
                           indices.defined() ? Tensor() : nchw(out), w);
  write_back(grad_x, gx);
}

void avg_pool2d(const Tensor& out, const Tensor& x, const Window2d& w, bool count_include_pad) {
  const Tensor o = nchw_result(out);
  avg_pool2d_nchw(o, nchw(x), w, count_include_pad);
  write_back(out, o);
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Window2d& w, bool count_include_pad) {
  const Tensor gx = nchw_result(grad_x);
  avg_pool2d_backward_nchw(gx, nchw(grad_out), w, count_include_pad);
  write_back(grad_x, gx);
}

void adaptive_avg_pool2d(const Tensor& out, const Tensor& x, int64_t in_h, int64_t in_w, int64_t out_h,
                         int64_t out_w) {
  const Tensor o = nchw_result(out);
  adaptive_avg_pool2d_nchw(o, nchw(x), in_h, in_w, out_h, out_w);
  write_back(out, o);
}

void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, int64_t in_h, int64_t in_w,
                                  int64_t out_h, int64_t out_w) {
  const Tensor gx = nchw_result(grad_x);
  adaptive_avg_pool2d_backward_nchw(gx, nchw(grad_out), in_h, in_w, out_h, out_w);
  write_back(grad_x, gx);
}

// ------------------------------------------------------------------ batch norm
// x (and out, grad_out, grad_x) may be float16/bfloat16 storage with float32 weight, bias, running and
// saved statistics and parameter gradients (cuDNN's and PyTorch's mixed batch norm, what autocast
// gives): elements are widened to float, the math runs in P = opmath_t<T>, the output is rounded once.
namespace {

using shared::opmath_t;
using shared::to_opmath;

}  // namespace

// ------------------------------------------------------------------ batch norm over rows
// [N, C] memory (s == 1: BatchNorm1d's [N, C] and every channels-last input, whose memory is
// [N*H*W, C]). The channel-per-thread loops below would read such memory with stride C once per
// channel; these walk it row by row instead, vectorized across the channels. T is the storage, P
// the parameters' and statistics' type (opmath_t<T>), as in the loops below.
namespace {

constexpr int64_t kBnRowsPerBlock = 64;

// Per-column sums of f(r, j) (a P) over the rows r of an [n, c] row-major layout, in double: each
// fixed block of kBnRowsPerBlock rows is summed in P's vector lanes across the columns, the blocks
// in double in block order (so the result does not depend on the thread count).
template <typename P, typename F>
std::vector<double> column_sums(int64_t n, int64_t c, const F& f) {
  const int64_t blocks = (n + kBnRowsPerBlock - 1) / kBnRowsPerBlock;
  std::vector<double> partial(static_cast<size_t>(blocks * c));
  parallel_for(0, blocks, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(kBnRowsPerBlock * c, 1)),
               [&](int64_t lo, int64_t hi) {
                 std::vector<P> acc(static_cast<size_t>(c));
                 P* a = acc.data();
                 for (int64_t b = lo; b < hi; ++b) {
                   std::fill(acc.begin(), acc.end(), P(0));
                   const int64_t end = std::min(n, (b + 1) * kBnRowsPerBlock);
                   for (int64_t r = b * kBnRowsPerBlock; r < end; ++r) {
                     simd_for(0, c, [&](int64_t j) CHORUS_ELEMENT { a[j] += f(r, j); });
                   }
                   double* p = partial.data() + b * c;
                   for (int64_t j = 0; j < c; ++j) p[j] = static_cast<double>(a[j]);
                 }
               });
  std::vector<double> sums(static_cast<size_t>(c), 0.0);
  for (int64_t b = 0; b < blocks; ++b) {
    const double* p = partial.data() + b * c;
    for (int64_t j = 0; j < c; ++j) sums[j] += p[j];
  }
  return sums;
}

// out[r, j] = f(r, j) rounded once to T, for every row: parallel over rows, vectorized across columns.
template <typename T, typename F>
void for_rows(int64_t n, int64_t c, T* out, const F& f) {
  parallel_for(0, n, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(c, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      T* o = out + r * c;
      simd_for(0, c, [&](int64_t j) CHORUS_ELEMENT { o[j] = shared::Cast<T>{}(f(r, j)); });
    }
  });
}

template <typename T, typename P>
void batch_norm_rows(T* po, P* pm, P* pr, const T* px, const P* pw, const P* pb, P* rm, P* rv, bool use_batch_stats,
                     bool update, double momentum, double eps, int64_t n, int64_t c) {
  std::vector<double> mean(static_cast<size_t>(c)), var(static_cast<size_t>(c));
  if (use_batch_stats) {
    // Two passes, as the per-channel path: the mean, then squared deviations from it (rounded to P).
    const std::vector<double> sum =
        column_sums<P>(n, c, [&](int64_t r, int64_t j) CHORUS_ELEMENT { return to_opmath(px[r * c + j]); });
    std::vector<P> mean_t(static_cast<size_t>(c));
    for (int64_t j = 0; j < c; ++j) {
      mean[j] = sum[j] / static_cast<double>(n);
      mean_t[j] = static_cast<P>(mean[j]);
    }
    const P* m = mean_t.data();
    const std::vector<double> sq = column_sums<P>(n, c, [&](int64_t r, int64_t j) CHORUS_ELEMENT {
      const P d = to_opmath(px[r * c + j]) - m[j];
      return d * d;
    });
    for (int64_t j = 0; j < c; ++j) {
      var[j] = sq[j] / static_cast<double>(n);
      if (update) shared::update_running_stats(rm[j], rv[j], mean[j], sq[j], n, momentum);
    }
  } else {
    for (int64_t j = 0; j < c; ++j) {
      mean[j] = rm[j];
      var[j] = rv[j];
    }
  }
  std::vector<P> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) {
    const double rstd = 1.0 / std::sqrt(var[j] + eps);
    pm[j] = static_cast<P>(mean[j]);
    pr[j] = static_cast<P>(rstd);
    scale[j] = static_cast<P>(rstd * (pw ? pw[j] : 1.0));
    shift[j] = static_cast<P>((pb ? pb[j] : 0.0) - mean[j] * rstd * (pw ? pw[j] : 1.0));
  }
  const P* sc = scale.data();
  const P* sh = shift.data();
  for_rows(n, c, po, [&](int64_t r, int64_t j) CHORUS_ELEMENT { return to_opmath(px[r * c + j]) * sc[j] + sh[j]; });
}

template <typename T, typename P>
void batch_norm_rows_backward(T* gx, P* gw, P* gb, const T* pg, const T* px, const P* pm, const P* pr, const P* pw,
                              bool use_batch_stats, int64_t n, int64_t c) {
  std::vector<P> mean_t(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) mean_t[j] = static_cast<P>(static_cast<double>(pm[j]));
  const P* m = mean_t.data();
  const std::vector<double> sum_g =
      column_sums<P>(n, c, [&](int64_t r, int64_t j) CHORUS_ELEMENT { return to_opmath(pg[r * c + j]); });
  std::vector<double> sum_gx = column_sums<P>(n, c, [&](int64_t r, int64_t j) CHORUS_ELEMENT {
    return to_opmath(pg[r * c + j]) * (to_opmath(px[r * c + j]) - m[j]);
  });
  std::vector<P> k(static_cast<size_t>(c)), mg(static_cast<size_t>(c)), mgx(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) {
    const double rstd = pr[j];
    sum_gx[j] *= rstd;
    if (gw) gw[j] = static_cast<P>(sum_gx[j]);
    if (gb) gb[j] = static_cast<P>(sum_g[j]);
    k[j] = static_cast<P>((pw ? static_cast<double>(pw[j]) : 1.0) * rstd);
    mg[j] = static_cast<P>(sum_g[j] / static_cast<double>(n));
    mgx[j] = static_cast<P>(sum_gx[j] / static_cast<double>(n) * rstd);
  }
  if (!gx) return;
  const P* pk = k.data();
  if (use_batch_stats) {
    // gx = w * rstd * (g - mean(g) - xhat * mean(g * xhat)), as the per-channel path.
    const P* pmg = mg.data();
    const P* pmgx = mgx.data();
    for_rows(n, c, gx, [&](int64_t r, int64_t j) CHORUS_ELEMENT {
      return pk[j] * (to_opmath(pg[r * c + j]) - pmg[j] - (to_opmath(px[r * c + j]) - m[j]) * pmgx[j]);
    });
  } else {
    for_rows(n, c, gx, [&](int64_t r, int64_t j) CHORUS_ELEMENT { return pk[j] * to_opmath(pg[r * c + j]); });
  }
}

}  // namespace

void batch_norm(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                bool use_batch_stats, double momentum, double eps, int64_t n, int64_t c, int64_t s) {
  dispatch_float_storage(x, "batch_norm", {&weight, &bias, &running_mean, &running_var, &save_mean, &save_rstd},
                         [&]<typename T, typename P>() {
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    const P* pw = weight.defined() ? weight.data_ptr<P>() : nullptr;
    const P* pb = bias.defined() ? bias.data_ptr<P>() : nullptr;
    P* pm = save_mean.data_ptr<P>();
    P* pr = save_rstd.data_ptr<P>();
    const bool update = use_batch_stats && running_mean.defined();
    P* rm = running_mean.defined() ? running_mean.data_ptr<P>() : nullptr;
    P* rv = running_var.defined() ? running_var.data_ptr<P>() : nullptr;
    if (s == 1) return batch_norm_rows<T, P>(po, pm, pr, px, pw, pb, rm, rv, use_batch_stats, update, momentum, eps, n, c);
    const int64_t count = n * s;
    parallel_for(0, c, plane_grain(count), [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        double mean, var;
        if (use_batch_stats) {
          // Two passes (mean, then squared deviations from it): stable when the mean is large
          // against the spread. Each row of s values is summed in P's vector lanes (a lane adds
          // s / width values: float32's rounding stays near 1e-6 relative for rows up to a few
          // thousand), the rows in double. Summing in double lanes cost twice as much: the
          // conversions, not memory, bound these passes (a fifth of a small ResNet's step).
          double sum = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* row = px + (i * c + ch) * s;
            sum += simd_sum<P>(0, s, [&](int64_t j) CHORUS_ELEMENT { return to_opmath(row[j]); });
          }
          mean = sum / static_cast<double>(count);
          // Deviations from the mean rounded to P: (mean - mean_t)^2 <= (ulp(mean) / 2)^2 shifts
          // the variance by less than P can resolve next to the mean's own square.
          const P mean_t = static_cast<P>(mean);
          double sq = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* row = px + (i * c + ch) * s;
            sq += simd_sum<P>(0, s, [&](int64_t j) CHORUS_ELEMENT {
              const P d = to_opmath(row[j]) - mean_t;
              return d * d;
            });
          }
          var = sq / static_cast<double>(count);
          if (update) shared::update_running_stats(rm[ch], rv[ch], mean, sq, count, momentum);
        } else {
          mean = rm[ch];
          var = rv[ch];
        }
        const double rstd = 1.0 / std::sqrt(var + eps);
        pm[ch] = static_cast<P>(mean);
        pr[ch] = static_cast<P>(rstd);
        // y = x * scale + shift
        const P scale = static_cast<P>(rstd * (pw ? pw[ch] : 1.0));
        const P shift = static_cast<P>((pb ? pb[ch] : 0.0) - mean * rstd * (pw ? pw[ch] : 1.0));
        for (int64_t i = 0; i < n; ++i) {
          const T* row = px + (i * c + ch) * s;
          T* orow = po + (i * c + ch) * s;
          for (int64_t j = 0; j < s; ++j) orow[j] = shared::Cast<T>{}(to_opmath(row[j]) * scale + shift);
        }
      }
    });
  });
}

void batch_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         const Tensor& grad_out, const Tensor& x, const Tensor& save_mean, const Tensor& save_rstd,
                         const Tensor& weight, bool use_batch_stats, int64_t n, int64_t c, int64_t s) {
  dispatch_float_storage(x, "batch_norm_backward", {&weight, &save_mean, &save_rstd, &grad_weight, &grad_bias},
                         [&]<typename T, typename P>() {
    const T* px = x.data_ptr<T>();
    const T* pg = grad_out.data_ptr<T>();
    const P* pw = weight.defined() ? weight.data_ptr<P>() : nullptr;
    const P* pm = save_mean.data_ptr<P>();
    const P* pr = save_rstd.data_ptr<P>();
    T* gx = grad_x.defined() ? grad_x.data_ptr<T>() : nullptr;
    P* gw = grad_weight.defined() ? grad_weight.data_ptr<P>() : nullptr;
    P* gb = grad_bias.defined() ? grad_bias.data_ptr<P>() : nullptr;
    if (s == 1) return batch_norm_rows_backward<T, P>(gx, gw, gb, pg, px, pm, pr, pw, use_batch_stats, n, c);
    const int64_t count = n * s;
    parallel_for(0, c, plane_grain(2 * count), [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        const double mean = pm[ch], rstd = pr[ch];
        double sum_g = 0, sum_gx = 0;  // sum(g), sum(g * xhat)
        const P mean_t = static_cast<P>(mean);
        for (int64_t i = 0; i < n; ++i) {
          const T* xr = px + (i * c + ch) * s;
          const T* gr = pg + (i * c + ch) * s;
          // A row in P's vector lanes, the rows in double (as the forward's statistics).
          P row_g = 0, row_gx = 0;
          _Pragma("omp simd reduction(+ : row_g, row_gx)")
          for (int64_t j = 0; j < s; ++j) {
            const P gj = to_opmath(gr[j]);
            row_g += gj;
            row_gx += gj * (to_opmath(xr[j]) - mean_t);
          }
          sum_g += row_g;
          sum_gx += row_gx;
        }
        sum_gx *= rstd;
        if (gw) gw[ch] = static_cast<P>(sum_gx);
        if (gb) gb[ch] = static_cast<P>(sum_g);
        if (!gx) continue;
        const double w = pw ? pw[ch] : 1.0;
        if (use_batch_stats) {
          // gx = w * rstd * (g - mean(g) - xhat * mean(g * xhat))
          const P k = static_cast<P>(w * rstd);
          const P mg = static_cast<P>(sum_g / count);
          const P mgx = static_cast<P>(sum_gx / count * rstd);  // folded: xhat * rstd-scaled term
          const P m = static_cast<P>(mean);
          for (int64_t i = 0; i < n; ++i) {
            const T* xr = px + (i * c + ch) * s;
            const T* gr = pg + (i * c + ch) * s;
            T* out = gx + (i * c + ch) * s;
            for (int64_t j = 0; j < s; ++j) {
              out[j] = shared::Cast<T>{}(k * (to_opmath(gr[j]) - mg - (to_opmath(xr[j]) - m) * mgx));
            }
          }
        } else {
          const P k = static_cast<P>(w * rstd);
          for (int64_t i = 0; i < n; ++i) {
            const T* gr = pg + (i * c + ch) * s;
            T* out = gx + (i * c + ch) * s;
            for (int64_t j = 0; j < s; ++j) out[j] = shared::Cast<T>{}(k * to_opmath(gr[j]));
          }
        }
      }
    });
  });
}

}  // namespace chorus::kernels::cpu
