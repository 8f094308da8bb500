// Batch norm on the CPU, training and inference, forward and backward, over planes (NCHW) or rows
// (channels-last and [N, C]) (kernels/cpu/conv.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/nchw_copies.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shared/pointwise_math.h"
#include "kernels/shared/reduce_math.h"

namespace chorus::kernels::cpu {

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
          simd_for(0, s, [&](int64_t j) CHORUS_ELEMENT { orow[j] = shared::Cast<T>{}(to_opmath(row[j]) * scale + shift); });
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
          // (Two simd_sum passes: the row is in L1 for the second; an `omp simd reduction` of both
          // sums in one loop stayed scalar at -O2.)
          sum_g += simd_sum<P>(0, s, [&](int64_t j) CHORUS_ELEMENT { return to_opmath(gr[j]); });
          sum_gx += simd_sum<P>(0, s, [&](int64_t j) CHORUS_ELEMENT {
            return to_opmath(gr[j]) * (to_opmath(xr[j]) - mean_t);
          });
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
            simd_for(0, s, [&](int64_t j) CHORUS_ELEMENT {
              out[j] = shared::Cast<T>{}(k * (to_opmath(gr[j]) - mg - (to_opmath(xr[j]) - m) * mgx));
            });
          }
        } else {
          const P k = static_cast<P>(w * rstd);
          for (int64_t i = 0; i < n; ++i) {
            const T* gr = pg + (i * c + ch) * s;
            T* out = gx + (i * c + ch) * s;
            simd_for(0, s, [&](int64_t j) CHORUS_ELEMENT { out[j] = shared::Cast<T>{}(k * to_opmath(gr[j])); });
          }
        }
      }
    });
  });
}

}  // namespace chorus::kernels::cpu
