// Max pooling's window scan, shared by the cpu kernels (kernels/cpu/conv.cpp) and chorus's own CUDA
// kernels (kernels/cuda/pool.cu): which input element an output cell picks, and the same choice
// recomputed in backward from x and the output when no indices were kept.
//
// [Max-pool arg-max] As PyTorch: the window is scanned row-major from its first in-range element;
// a strictly greater value replaces the best so far, and the first NaN wins outright. So the chosen
// element is the first one (row-major) whose value equals the output, with a NaN output matching the
// first NaN; a window whose values are all -inf picks its first element. The backward
// without indices (max_pool_first_match) searches for exactly that element, so it routes the gradient
// where the indices would have, ties included.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"
#include "kernels/shared/hd.h"

#if defined(__CUDACC__)
#include <cuda/std/limits>
#else
#include <limits>
#endif

namespace chorus::kernels::shared {

// The in-range rows [h0, h1) and columns [w0, w1) of an output cell's window, stepping by dilation:
// h0/w0 are the first in-range tap, h1/w1 one past the last tap's position (clipped to the input).
struct MaxWindow {
  int64_t h0, h1, w0, w1;
};

CHORUS_HD CHORUS_INLINE MaxWindow max_window(const Window2d& w, int64_t oh, int64_t ow) {
  int64_t h0 = oh * w.stride_h - w.pad_h;
  int64_t h1 = h0 + (w.kernel_h - 1) * w.dilation_h + 1;
  if (h1 > w.in_h) h1 = w.in_h;
  while (h0 < 0) h0 += w.dilation_h;
  int64_t w0 = ow * w.stride_w - w.pad_w;
  int64_t w1 = w0 + (w.kernel_w - 1) * w.dilation_w + 1;
  if (w1 > w.in_w) w1 = w.in_w;
  while (w0 < 0) w0 += w.dilation_w;
  return {h0, h1, w0, w1};
}

// The forward: writes the window's maximum to `best` and returns its flat index (h * in_w + w) in
// the plane, per [Max-pool arg-max].
template <typename T>
CHORUS_HD CHORUS_INLINE int64_t max_pool_argmax(const T* plane, const Window2d& w, int64_t oh, int64_t ow, T& best) {
#if defined(__CUDACC__)
  best = -::cuda::std::numeric_limits<T>::infinity();
#else
  best = -std::numeric_limits<T>::infinity();
#endif
  const MaxWindow m = max_window(w, oh, ow);
  int64_t best_i = m.h0 * w.in_w + m.w0;
  for (int64_t ih = m.h0; ih < m.h1; ih += w.dilation_h) {
    for (int64_t iw = m.w0; iw < m.w1; iw += w.dilation_w) {
      const T v = plane[ih * w.in_w + iw];
      if (v != v) {  // NaN
        best = v;
        return ih * w.in_w + iw;
      }
      if (v > best) {
        best = v;
        best_i = ih * w.in_w + iw;
      }
    }
  }
  return best_i;
}

// The backward without indices: the flat index max_pool_argmax returned for this cell, found again
// from the output value `out` (the first element equal to it; NaN matches NaN).
template <typename T>
CHORUS_HD CHORUS_INLINE int64_t max_pool_first_match(const T* plane, const Window2d& w, int64_t oh, int64_t ow,
                                                     T out) {
  const MaxWindow m = max_window(w, oh, ow);
  const bool nan = out != out;
  for (int64_t ih = m.h0; ih < m.h1; ih += w.dilation_h) {
    for (int64_t iw = m.w0; iw < m.w1; iw += w.dilation_w) {
      const T v = plane[ih * w.in_w + iw];
      if (nan ? v != v : v == out) return ih * w.in_w + iw;
    }
  }
  // Only when `out` is not this window's maximum (an output the forward did not write): the
  // forward's choice for a window with nothing above -inf.
  return m.h0 * w.in_w + m.w0;
}

}  // namespace chorus::kernels::shared
