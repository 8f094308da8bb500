#include "kernels/cpu/nn_basic.h"

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
  CHORUS_DISPATCH_FLOATING(x.dtype(), "layer_norm", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    const T* pw = ptr_or_null<T>(weight);
    const T* pb = ptr_or_null<T>(bias);
    T* po = out.data_ptr<T>();
    T* pm = mean.data_ptr<T>();
    T* pr = rstd.data_ptr<T>();
    parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = px + r * cols;
        // Two passes (mean, then centered squares) in double: stable for large offsets.
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) s += row[c];
        const double mu = s / static_cast<double>(cols);
        double v = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double d = row[c] - mu;
          v += d * d;
        }
        const double inv = 1.0 / std::sqrt(v / static_cast<double>(cols) + eps);
        pm[r] = static_cast<T>(mu);
        pr[r] = static_cast<T>(inv);
        const T m = static_cast<T>(mu), iv = static_cast<T>(inv);
        T* orow = po + r * cols;
        if (pw && pb) for (int64_t c = 0; c < cols; ++c) orow[c] = (row[c] - m) * iv * pw[c] + pb[c];
        else if (pw) for (int64_t c = 0; c < cols; ++c) orow[c] = (row[c] - m) * iv * pw[c];
        else for (int64_t c = 0; c < cols; ++c) orow[c] = (row[c] - m) * iv + (pb ? pb[c] : T(0));
      }
    });
  });
}

void layer_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& g,
                         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, int64_t rows,
                         int64_t cols) {
  CHORUS_DISPATCH_FLOATING(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    const T* pg = g.data_ptr<T>();
    const T* pm = mean.data_ptr<T>();
    const T* pr = rstd.data_ptr<T>();
    const T* pw = ptr_or_null<T>(weight);
    T* pgx = grad_x.defined() ? grad_x.data_ptr<T>() : nullptr;
    // Parameter gradients: per-thread partial sums over rows, then combined (no atomics).
    const int threads = num_threads();
    std::vector<std::vector<double>> gw(threads), gb(threads);
    const bool want_w = grad_weight.defined(), want_b = grad_bias.defined();
    const int64_t chunk = (rows + threads - 1) / std::max(threads, 1);
    parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        std::vector<double>& lw = gw[t];
        std::vector<double>& lb = gb[t];
        if (want_w) lw.assign(cols, 0.0);
        if (want_b) lb.assign(cols, 0.0);
        const int64_t lo = t * chunk, hi = std::min(rows, lo + chunk);
        for (int64_t r = lo; r < hi; ++r) {
          const T* xr = px + r * cols;
          const T* gr = pg + r * cols;
          const double m = pm[r], iv = pr[r];
          double sum_gw = 0, sum_gw_xhat = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double xhat = (xr[c] - m) * iv;
            const double gwv = gr[c] * (pw ? pw[c] : T(1));
            sum_gw += gwv;
            sum_gw_xhat += gwv * xhat;
            if (want_w) lw[c] += gr[c] * xhat;
            if (want_b) lb[c] += gr[c];
          }
          if (pgx) {
            // dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat))
            const double a = sum_gw / static_cast<double>(cols), b = sum_gw_xhat / static_cast<double>(cols);
            T* out = pgx + r * cols;
            for (int64_t c = 0; c < cols; ++c) {
              const double xhat = (xr[c] - m) * iv;
              out[c] = static_cast<T>(iv * (gr[c] * (pw ? pw[c] : T(1)) - a - xhat * b));
            }
          }
        }
      }
    });
    if (want_w || want_b) {
      T* ow = want_w ? grad_weight.data_ptr<T>() : nullptr;
      T* ob = want_b ? grad_bias.data_ptr<T>() : nullptr;
      for (int64_t c = 0; c < cols; ++c) {
        double sw = 0, sb = 0;
        for (int t = 0; t < threads; ++t) {
          if (want_w && !gw[t].empty()) sw += gw[t][c];
          if (want_b && !gb[t].empty()) sb += gb[t][c];
        }
        if (ow) ow[c] = static_cast<T>(sw);
        if (ob) ob[c] = static_cast<T>(sb);
      }
    }
  });
}

void cross_entropy(const Tensor& losses, const Tensor& row_weight, const Tensor& probs, const Tensor& logits,
                   const Tensor& target, const Tensor& class_weight, int64_t ignore_index, double label_smoothing) {
  const int64_t rows = logits.size(0), C = logits.size(1);
  CHORUS_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&]<typename T>() {
    const T* px = logits.data_ptr<T>();
    const int64_t* py = target.data_ptr<int64_t>();
    const T* pcw = ptr_or_null<T>(class_weight);
    T* pl = losses.data_ptr<T>();
    T* prw = row_weight.data_ptr<T>();
    T* pp = probs.data_ptr<T>();
    double wsum = 0;
    if (pcw) for (int64_t c = 0; c < C; ++c) wsum += pcw[c];
    else wsum = static_cast<double>(C);
    parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* x = px + r * C;
        T* p = pp + r * C;
        const int64_t y = py[r];
        if (y == ignore_index) {
          pl[r] = 0;
          prw[r] = 0;
          for (int64_t c = 0; c < C; ++c) p[c] = 0;
          continue;
        }
        T mx = x[0];
        for (int64_t c = 1; c < C; ++c) mx = x[c] > mx ? x[c] : mx;
        double s = 0;
        // Vector loops (libmvec's exp, vector_math.h); the sum in double, in lanes.
        simd_for(0, C, [&](int64_t c) CHORUS_ELEMENT { p[c] = std::exp(x[c] - mx); });
        s = simd_sum<double>(0, C, [&](int64_t c) CHORUS_ELEMENT { return p[c]; });
        const double lse = static_cast<double>(mx) + std::log(s);
        const T inv = static_cast<T>(1.0 / s);
        simd_for(0, C, [&](int64_t c) CHORUS_ELEMENT { p[c] *= inv; });
        const double wy = pcw ? static_cast<double>(pcw[y]) : 1.0;
        double loss = (1.0 - label_smoothing) * wy * (lse - x[y]);
        if (label_smoothing > 0) {
          double smooth = 0;
          for (int64_t c = 0; c < C; ++c) smooth += (pcw ? pcw[c] : T(1)) * (lse - x[c]);
          loss += label_smoothing / static_cast<double>(C) * smooth;
        }
        pl[r] = static_cast<T>(loss);
        prw[r] = static_cast<T>(wy);
      }
    });
    (void)wsum;
  });
}

void cross_entropy_backward(const Tensor& grad_logits, const Tensor& row_scale, const Tensor& probs,
                            const Tensor& target, const Tensor& class_weight, int64_t ignore_index,
                            double label_smoothing) {
  const int64_t rows = probs.size(0), C = probs.size(1);
  CHORUS_DISPATCH_FLOATING(probs.dtype(), "cross_entropy_backward", [&]<typename T>() {
    const T* pp = probs.data_ptr<T>();
    const int64_t* py = target.data_ptr<int64_t>();
    const T* pcw = ptr_or_null<T>(class_weight);
    const T* ps = row_scale.data_ptr<T>();
    T* pg = grad_logits.data_ptr<T>();
    double W = 0;
    if (pcw) for (int64_t c = 0; c < C; ++c) W += pcw[c];
    else W = static_cast<double>(C);
    const T eps_c = static_cast<T>(label_smoothing / static_cast<double>(C));
    const T one_minus = static_cast<T>(1.0 - label_smoothing);
    parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        T* gr = pg + r * C;
        const int64_t y = py[r];
        if (y == ignore_index) {
          for (int64_t c = 0; c < C; ++c) gr[c] = 0;
          continue;
        }
        const T* p = pp + r * C;
        const T s = ps[r];
        const T wy = pcw ? pcw[y] : T(1);
        for (int64_t c = 0; c < C; ++c) {
          T v = one_minus * wy * p[c];
          if (label_smoothing > 0) v += eps_c * (static_cast<T>(W) * p[c] - (pcw ? pcw[c] : T(1)));
          gr[c] = s * v;
        }
        gr[y] -= s * one_minus * wy;
      }
    });
  });
}

}  // namespace chorus::kernels::cpu
