// Pooling on the CPU: max, average and adaptive average, forward and backward (kernels/cpu/conv.h).
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/nchw_copies.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shared/pool_math.h"

namespace chorus::kernels::cpu {

// ------------------------------------------------------------------ pooling
// Each kernel computes plane by plane in NCHW; the table entries below take NCHW or channels-last
// tensors through nchw() copies and write_back, as conv2d does.
namespace {

// [Vectorized max pool] The outputs of a row whose windows lie wholly inside the input's columns
// (none clipped at the left or right edge: [a, b) below) are computed several per instruction: the
// window's elements are visited in max_pool_argmax's order (rows, then columns), output ow taking
// element v over its best so far when v > best or v is the first NaN, which is that function's rule
// ([Max-pool arg-max], kernels/shared/pool_math.h), so values and indices are the same bit for bit.
// The clipped outputs at either end go through that function one at a time. ResNet-18's 3x3
// stride-2 pool (batch 16 of 64x64, 1 thread, Zen 3): 2.3% of the training step's samples one window
// at a time, 1.6% this way (perf; the strided loads are gathered lane by lane). The backward stays
// one window at a time: a version of this loop for its search (first element equal to the output)
// did not vectorize (GCC 12 left it scalar and branchy) and took 3.0% against 1.1%.
struct InteriorColumns {
  int64_t a = 0, b = 0;  // outputs [a, b) of every row: windows inside columns [0, in_w)
};

// Outputs [a, b) of one axis whose windows lie inside [0, in): the smallest o with
// o * stride - pad >= 0, and the largest with o * stride - pad + (kernel - 1) * dilation < in.
InteriorColumns interior_range(int64_t out, int64_t in, int64_t pad, int64_t stride, int64_t kernel, int64_t dilation) {
  const int64_t a = std::min(out, (pad + stride - 1) / stride);
  const int64_t last = in - 1 + pad - (kernel - 1) * dilation;
  const int64_t b = last < 0 ? 0 : std::min(out, last / stride + 1);
  return {a, std::max(a, b)};
}
InteriorColumns interior_columns(const Window2d& w) {
  return interior_range(w.out_w, w.in_w, w.pad_w, w.stride_w, w.kernel_w, w.dilation_w);
}
InteriorColumns interior_rows(const Window2d& w) {
  return interior_range(w.out_h, w.in_h, w.pad_h, w.stride_h, w.kernel_h, w.dilation_h);
}

// max_pool_argmax's rule for one more element v after `cur` (row-major order): v wins when it is
// greater, or the first NaN.
template <typename T>
CHORUS_ELEMENT inline T max_step(T cur, T v) {
  return ((v > cur) | ((v != v) & (cur == cur))) ? v : cur;
}

template <typename T>
constexpr bool kVectorPool = std::is_same_v<T, float> || std::is_same_v<T, double>;

// Row oh's outputs [a, b) (InteriorColumns) into best[ow] and, when `at` is not null, their flat
// indices in the plane into at[ow].
template <typename T>
void max_pool_interior(const T* plane, const Window2d& w, int64_t oh, int64_t a, int64_t b, T* best, int64_t* at) {
  const shared::MaxWindow m = shared::max_window(w, oh, a);  // its rows are every output's of the row
  const int64_t s = w.stride_w;
  const int64_t first = m.h0 * w.in_w - w.pad_w;  // output ow's first element: first + ow * s
  simd_for(a, b, [&](int64_t ow) CHORUS_ELEMENT { best[ow] = -std::numeric_limits<T>::infinity(); });
  if (at != nullptr) simd_for(a, b, [&](int64_t ow) CHORUS_ELEMENT { at[ow] = first + ow * s; });
  for (int64_t ih = m.h0; ih < m.h1; ih += w.dilation_h) {
    const T* r = plane + ih * w.in_w;
    for (int64_t kw = 0; kw < w.kernel_w; ++kw) {
      // Column ow * s + c of row ih: at least 0 for every ow in [a, b) (no pointer before the plane).
      const int64_t c = kw * w.dilation_w - w.pad_w, off = ih * w.in_w + c;
      if (at == nullptr) {
        simd_for(a, b, [&](int64_t ow) CHORUS_ELEMENT {
          const T v = r[ow * s + c], cur = best[ow];
          best[ow] = ((v > cur) | ((v != v) & (cur == cur))) ? v : cur;
        });
      } else {
        simd_for(a, b, [&](int64_t ow) CHORUS_ELEMENT {
          const T v = r[ow * s + c], cur = best[ow];
          const bool take = (v > cur) | ((v != v) & (cur == cur));
          best[ow] = take ? v : cur;
          at[ow] = take ? off + ow * s : at[ow];
        });
      }
    }
  }
}

// [Separable max pool] Without indices (training: the op layer keeps x and out), the outputs whose
// windows lie wholly inside the plane (interior rows x interior columns) in two passes over whole
// rows: H[i] = the rule of [Vectorized max pool] over the window's columns starting at flat i (kw
// ascending), then V = the same over the window's rows of H (kh ascending), and each output is V at
// its window's top-left corner. The maximum of the rows' maxima, each the first in its row, taken
// from the first row that holds it, is the window's first maximum in row-major order (the first
// NaN likewise), so values are max_pool_argmax's bit for bit (signed zeros included). Both passes
// run over contiguous memory at full vector width across row ends (the values there are never
// picked), where the row-at-a-time loop has a few strided outputs a row: ResNet-18's 3x3 stride-2
// pool has 16x16 outputs a plane (15 interior a row), which the AVX-512 variant ran mostly in its
// scalar remainder. ResNet-18, batch 16 of 64x64, 1 thread, AMD EPYC family 26 (AVX-512), perf:
// the pool's forward 5.6% of the step's samples before, 1.5% this way; the whole --profile run of
// 30 steps 0.954x the time (farm-bench, 5 pairs).
template <typename T>
void max_pool_separable(const T* plane, const Window2d& w, const InteriorColumns& cols, const InteriorColumns& rows,
                        T* out_plane, std::vector<T>& h, std::vector<T>& v) {
  const int64_t n = w.in_h * w.in_w;
  // H[i] for every i whose window columns stay inside the plane (the picked positions are among
  // them); -inf after those, so that V reads no unset value.
  const int64_t h_n = std::max<int64_t>(0, n - (w.kernel_w - 1) * w.dilation_w);
  h.resize(static_cast<size_t>(n));
  T* ph = h.data();
  std::fill(ph + h_n, ph + n, -std::numeric_limits<T>::infinity());
  simd_for(0, h_n, [&](int64_t i) CHORUS_ELEMENT { ph[i] = plane[i]; });
  for (int64_t kw = 1; kw < w.kernel_w; ++kw) {
    const T* src = plane + kw * w.dilation_w;
    simd_for(0, h_n, [&](int64_t i) CHORUS_ELEMENT { ph[i] = max_step(ph[i], src[i]); });
  }
  // V over the input rows that are the top rows of the interior output rows' windows.
  const int64_t top0 = rows.a * w.stride_h - w.pad_h, top1 = (rows.b - 1) * w.stride_h - w.pad_h;
  const int64_t v_lo = top0 * w.in_w, v_n = (top1 - top0 + 1) * w.in_w;
  v.resize(static_cast<size_t>(v_n));
  T* pv = v.data();
  const T* h0 = ph + v_lo;
  simd_for(0, v_n, [&](int64_t i) CHORUS_ELEMENT { pv[i] = h0[i]; });
  for (int64_t kh = 1; kh < w.kernel_h; ++kh) {
    const T* src = h0 + kh * w.dilation_h * w.in_w;
    simd_for(0, v_n, [&](int64_t i) CHORUS_ELEMENT { pv[i] = max_step(pv[i], src[i]); });
  }
  const int64_t s = w.stride_w;
  for (int64_t oh = rows.a; oh < rows.b; ++oh) {
    // Output ow's window starts at V[base + ow * s] (at least 0: ow is an interior column).
    const int64_t base = (oh * w.stride_h - w.pad_h - top0) * w.in_w - w.pad_w;
    T* orow = out_plane + oh * w.out_w;
    simd_for(cols.a, cols.b, [&](int64_t ow) CHORUS_ELEMENT { orow[ow] = pv[base + ow * s]; });
  }
}

// Writes indices only when they are defined (the op layer's max_pool2d keeps x and out instead).
void max_pool2d_nchw(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w) {
  const int64_t planes = out.numel() / std::max<int64_t>(1, w.out_h * w.out_w);
  const InteriorColumns in = interior_columns(w);
  CHORUS_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    int64_t* pi = indices.defined() ? indices.data_ptr<int64_t>() : nullptr;
    const int64_t work = w.out_h * w.out_w * w.kernel_h * w.kernel_w;
    // [Separable max pool] for the interior rows where there are no indices to write.
    const InteriorColumns rows = interior_rows(w);
    const bool separable = kVectorPool<T> && pi == nullptr && in.a < in.b && rows.a < rows.b;
    parallel_for(0, planes, plane_grain(work), [&](int64_t lo, int64_t hi) {
      std::vector<T> h, v;  // the separable passes' rows, reused across this chunk's planes
      for (int64_t p = lo; p < hi; ++p) {
        const T* plane = px + p * w.in_h * w.in_w;
        if constexpr (kVectorPool<T>) {
          if (separable) max_pool_separable(plane, w, in, rows, po + p * w.out_h * w.out_w, h, v);
        }
        for (int64_t oh = 0; oh < w.out_h; ++oh) {
          const int64_t o0 = (p * w.out_h + oh) * w.out_w;
          T* orow = po + o0;
          int64_t* irow = pi != nullptr ? pi + o0 : nullptr;
          // [Vectorized max pool]: the unclipped outputs together (the separable pass wrote them in
          // its rows), the rest one by one.
          const bool vector = kVectorPool<T> && in.a < in.b;
          const bool done = separable && oh >= rows.a && oh < rows.b;
          if constexpr (kVectorPool<T>) {
            if (vector && !done) max_pool_interior(plane, w, oh, in.a, in.b, orow, irow);
          }
          for (int64_t ow = 0; ow < w.out_w; ++ow) {
            if (vector && ow == in.a) ow = in.b;
            if (ow == w.out_w) break;
            T best;
            const int64_t best_i = shared::max_pool_argmax(plane, w, oh, ow, best);
            orow[ow] = best;
            if (irow != nullptr) irow[ow] = best_i;
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

}  // namespace chorus::kernels::cpu
