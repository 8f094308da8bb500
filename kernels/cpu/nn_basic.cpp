#include "kernels/cpu/nn_basic.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"

namespace chorus::kernels::cpu {
namespace {

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

void layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                const Tensor& bias, int64_t rows, int64_t cols, double eps) {
  dispatch_float_storage(x, "layer_norm", {&weight, &bias, &mean, &rstd}, [&]<typename T, typename P>() {
    const T* px = x.data_ptr<T>();
    const P* pw = ptr_or_null<P>(weight);
    const P* pb = ptr_or_null<P>(bias);
    T* po = out.data_ptr<T>();
    P* pm = mean.data_ptr<P>();
    P* pr = rstd.data_ptr<P>();
    parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<P> xbuf, obuf;  // 16-bit rows at float (loops.h, widened_row)
      for (int64_t r = lo; r < hi; ++r) {
        const P* row = widened_row(px + r * cols, cols, xbuf);
        // Two passes (mean, then centered squares) in double: stable for large offsets. One partial
        // sum per vector lane (simd_sum): a single running double sum was a chain of dependent adds,
        // 2.7 GB/s at BERT's 256-wide rows.
        const double s = simd_sum<double>(0, cols, [&](int64_t c) CHORUS_ELEMENT { return static_cast<double>(row[c]); });
        const double mu = s / static_cast<double>(cols);
        const double v = simd_sum<double>(0, cols, [&](int64_t c) CHORUS_ELEMENT {
          const double d = row[c] - mu;
          return d * d;
        });
        const double inv = 1.0 / std::sqrt(v / static_cast<double>(cols) + eps);
        pm[r] = static_cast<P>(mu);
        pr[r] = static_cast<P>(inv);
        const P m = static_cast<P>(mu), iv = static_cast<P>(inv);
        P* orow = row_out(po + r * cols, cols, obuf);
        if (pw && pb) simd_for(0, cols, [&](int64_t c) CHORUS_ELEMENT { orow[c] = (row[c] - m) * iv * pw[c] + pb[c]; });
        else if (pw) simd_for(0, cols, [&](int64_t c) CHORUS_ELEMENT { orow[c] = (row[c] - m) * iv * pw[c]; });
        else if (pb) simd_for(0, cols, [&](int64_t c) CHORUS_ELEMENT { orow[c] = (row[c] - m) * iv + pb[c]; });
        else simd_for(0, cols, [&](int64_t c) CHORUS_ELEMENT { orow[c] = (row[c] - m) * iv; });
        store_row(po + r * cols, orow, cols);
      }
    });
  });
}

void layer_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& g,
                         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, int64_t rows,
                         int64_t cols) {
  dispatch_float_storage(x, "layer_norm_backward", {&mean, &rstd, &weight, &grad_weight, &grad_bias},
                         [&]<typename T, typename P>() {
    const T* px = x.data_ptr<T>();
    const T* pg = g.data_ptr<T>();
    const P* pm = mean.data_ptr<P>();
    const P* pr = rstd.data_ptr<P>();
    const P* pw = ptr_or_null<P>(weight);
    T* pgx = grad_x.defined() ? grad_x.data_ptr<T>() : nullptr;
    // Parameter gradients: per-thread partial sums over rows, then combined (no atomics).
    const int threads = num_threads();
    std::vector<std::vector<double>> gw(threads), gb(threads);
    const bool want_w = grad_weight.defined(), want_b = grad_bias.defined();
    const int64_t chunk = (rows + threads - 1) / std::max(threads, 1);
    // The weight, or a row of ones where there is none: the conditional load pw ? pw[c] : 1 that the
    // loops below had kept them all scalar, weight or not (a [1024, 256] backward took 1.2 ms, 1
    // thread, Zen 3; about a third of that now).
    const std::vector<P> ones(pw ? 0 : static_cast<size_t>(cols), P(1));
    const P* wv = pw ? pw : ones.data();
    parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      std::vector<P> xbuf, gbuf, obuf;
      for (int64_t t = t0; t < t1; ++t) {
        std::vector<double>& lw = gw[t];
        std::vector<double>& lb = gb[t];
        if (want_w) lw.assign(cols, 0.0);
        if (want_b) lb.assign(cols, 0.0);
        const int64_t lo = t * chunk, hi = std::min(rows, lo + chunk);
        for (int64_t r = lo; r < hi; ++r) {
          const P* xr = widened_row(px + r * cols, cols, xbuf);
          const P* gr = widened_row(pg + r * cols, cols, gbuf);
          const double m = pm[r], iv = pr[r];
          // The row's two sums one partial sum per lane (simd_sum), and the per-column parameter
          // sums as loops of their own: together in one loop, the running sums kept it scalar.
          const double sum_gw = simd_sum<double>(0, cols, [&](int64_t c) CHORUS_ELEMENT {
            return static_cast<double>(gr[c] * wv[c]);
          });
          const double sum_gw_xhat = simd_sum<double>(0, cols, [&](int64_t c) CHORUS_ELEMENT {
            const double xhat = (xr[c] - m) * iv;
            return static_cast<double>(gr[c] * wv[c]) * xhat;
          });
          if (want_w) {
            double* w = lw.data();
            simd_for(0, cols, [&](int64_t c) CHORUS_ELEMENT { w[c] += gr[c] * ((xr[c] - m) * iv); });
          }
          if (want_b) {
            double* b = lb.data();
            simd_for(0, cols, [&](int64_t c) CHORUS_ELEMENT { b[c] += gr[c]; });
          }
          if (pgx) {
            // dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat))
            const double a = sum_gw / static_cast<double>(cols), b = sum_gw_xhat / static_cast<double>(cols);
            P* out = row_out(pgx + r * cols, cols, obuf);
            // Uncontracted: g*w rounded on its own as in sum_gw, never fused into g*w - a (-mfma and
            // g++'s -ffp-contract=fast would make it the product's rounding error), so a row whose
            // terms cancel exactly (one column) gives exactly 0, as the CUDA kernel (nn.cu,
            // mul_rounded) does. Seen as a float64 CPU/GPU mismatch on an H200, 2026-11-30.
            simd_for_uncontracted(0, cols, [&](int64_t c) CHORUS_ELEMENT {
              CHORUS_UNCONTRACTED
              const double xhat = (xr[c] - m) * iv;
              out[c] = static_cast<P>(iv * (gr[c] * wv[c] - a - xhat * b));
            });
            store_row(pgx + r * cols, out, cols);
          }
        }
      }
    });
    if (want_w || want_b) {
      P* ow = want_w ? grad_weight.data_ptr<P>() : nullptr;
      P* ob = want_b ? grad_bias.data_ptr<P>() : nullptr;
      for (int64_t c = 0; c < cols; ++c) {
        double sw = 0, sb = 0;
        for (int t = 0; t < threads; ++t) {
          if (want_w && !gw[t].empty()) sw += gw[t][c];
          if (want_b && !gb[t].empty()) sb += gb[t][c];
        }
        if (ow) ow[c] = static_cast<P>(sw);
        if (ob) ob[c] = static_cast<P>(sb);
      }
    }
  });
}

void cross_entropy(const Tensor& losses, const Tensor& row_weight, const Tensor& probs, const Tensor& logits,
                   const Tensor& target, const Tensor& class_weight, int64_t ignore_index, double label_smoothing) {
  const int64_t rows = logits.size(0), C = logits.size(1);
  dispatch_float_storage(logits, "cross_entropy", {&losses, &row_weight, &class_weight}, [&]<typename T, typename P>() {
    const T* px = logits.data_ptr<T>();
    const int64_t* py = target.data_ptr<int64_t>();
    const P* pcw = ptr_or_null<P>(class_weight);
    P* pl = losses.data_ptr<P>();
    P* prw = row_weight.data_ptr<P>();
    T* pp = probs.data_ptr<T>();
    parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<P> xbuf, pbuf;  // 16-bit rows at float (loops.h, widened_row)
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t y = py[r];
        if (y == ignore_index) {
          pl[r] = 0;
          prw[r] = 0;
          std::fill(pp + r * C, pp + (r + 1) * C, T(0));
          continue;
        }
        const P* x = widened_row(px + r * C, C, xbuf);
        P* p = row_out(pp + r * C, C, pbuf);
        const P mx = simd_max<P>(1, C, x[0], [&](int64_t c) CHORUS_ELEMENT { return x[c]; });
        double s = 0;
        // Vector loops (libmvec's exp, vector_math.h); the sum in double, in lanes.
        simd_for(0, C, [&](int64_t c) CHORUS_ELEMENT { p[c] = std::exp(x[c] - mx); });
        s = simd_sum<double>(0, C, [&](int64_t c) CHORUS_ELEMENT { return p[c]; });
        const double lse = static_cast<double>(mx) + std::log(s);
        const P inv = static_cast<P>(1.0 / s);
        simd_for(0, C, [&](int64_t c) CHORUS_ELEMENT { p[c] *= inv; });
        store_row(pp + r * C, p, C);
        const double wy = pcw ? static_cast<double>(pcw[y]) : 1.0;
        double loss = (1.0 - label_smoothing) * wy * (lse - x[y]);
        if (label_smoothing > 0) {
          double smooth = 0;
          for (int64_t c = 0; c < C; ++c) smooth += (pcw ? pcw[c] : P(1)) * (lse - x[c]);
          loss += label_smoothing / static_cast<double>(C) * smooth;
        }
        pl[r] = static_cast<P>(loss);
        prw[r] = static_cast<P>(wy);
      }
    });
  });
}

void cross_entropy_backward(const Tensor& grad_logits, const Tensor& row_scale, const Tensor& probs,
                            const Tensor& target, const Tensor& class_weight, int64_t ignore_index,
                            double label_smoothing) {
  const int64_t rows = probs.size(0), C = probs.size(1);
  dispatch_float_storage(probs, "cross_entropy_backward", {&row_scale, &class_weight}, [&]<typename T, typename P>() {
    const T* pp = probs.data_ptr<T>();
    const int64_t* py = target.data_ptr<int64_t>();
    const P* pcw = ptr_or_null<P>(class_weight);
    const P* ps = row_scale.data_ptr<P>();
    T* pg = grad_logits.data_ptr<T>();
    double W = 0;
    if (pcw) for (int64_t c = 0; c < C; ++c) W += pcw[c];
    else W = static_cast<double>(C);
    const P eps_c = static_cast<P>(label_smoothing / static_cast<double>(C));
    const P one_minus = static_cast<P>(1.0 - label_smoothing);
    parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<P> pbuf, gbuf;
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t y = py[r];
        if (y == ignore_index) {
          std::fill(pg + r * C, pg + (r + 1) * C, T(0));
          continue;
        }
        const P* p = widened_row(pp + r * C, C, pbuf);
        P* gr = row_out(pg + r * C, C, gbuf);
        const P s = ps[r];
        const P wy = pcw ? pcw[y] : P(1);
        const P keep = one_minus * wy;
        if (label_smoothing > 0) {
          const P w_all = static_cast<P>(W);
          simd_for(0, C, [&](int64_t c) CHORUS_ELEMENT {
            gr[c] = s * (keep * p[c] + eps_c * (w_all * p[c] - (pcw ? pcw[c] : P(1))));
          });
        } else {
          simd_for(0, C, [&](int64_t c) CHORUS_ELEMENT { gr[c] = s * (keep * p[c]); });
        }
        gr[y] -= s * one_minus * wy;
        store_row(pg + r * C, gr, C);
      }
    });
  });
}

}  // namespace chorus::kernels::cpu
