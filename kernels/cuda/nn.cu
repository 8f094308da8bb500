// layer_norm, cross_entropy and chorus's own batch_norm (each with its backward; cudnn_bn.cpp runs
// batch_norm through cuDNN and falls back to these) on CUDA: one block per row (per channel for
// batch_norm over [n, c, s] with s > 1; a coalesced rows path for s == 1) over contiguous buffers,
// with the cpu kernels' double accumulations (kernels/cpu/nn_basic.cpp, conv.cpp) and the shared exp/log/sqrt of kernels/shared/pointwise_math.h.
#include <cuda/std/limits>

#include <initializer_list>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::cuda_impl {
namespace {

constexpr int kThreads = 256;

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data_ptr()) : nullptr;
}
unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535LL * 16)); }

template <typename T>
__global__ void layer_norm_kernel(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t rows,
                                  int64_t cols, double eps) {
  __shared__ double buf[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    double s = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += row[c];
    s = block_reduce(s, SumOp{}, buf);
    const double mu = s / static_cast<double>(cols);
    double v = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const double d = row[c] - mu;
      v += d * d;
    }
    v = block_reduce(v, SumOp{}, buf);
    const double inv = 1.0 / sh::Sqrt{}(v / static_cast<double>(cols) + eps);
    if (threadIdx.x == 0) {
      mean[r] = static_cast<T>(mu);
      rstd[r] = static_cast<T>(inv);
    }
    const T m = static_cast<T>(mu), iv = static_cast<T>(inv);
    T* orow = out + r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      if (w && b) orow[c] = (row[c] - m) * iv * w[c] + b[c];
      else if (w) orow[c] = (row[c] - m) * iv * w[c];
      else orow[c] = (row[c] - m) * iv + (b ? b[c] : T(0));
    }
  }
}

template <typename T>
__global__ void layer_norm_backward_rows_kernel(T* gx, const T* g, const T* x, const T* mean, const T* rstd,
                                                const T* w, int64_t rows, int64_t cols) {
  __shared__ double buf[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    const T* gr = g + r * cols;
    const double m = mean[r], iv = rstd[r];
    double sum_gw = 0, sum_gw_xhat = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const double xhat = (xr[c] - m) * iv;
      const double gwv = gr[c] * (w ? w[c] : T(1));
      sum_gw += gwv;
      sum_gw_xhat += gwv * xhat;
    }
    sum_gw = block_reduce(sum_gw, SumOp{}, buf);
    sum_gw_xhat = block_reduce(sum_gw_xhat, SumOp{}, buf);
    const double a = sum_gw / static_cast<double>(cols), bb = sum_gw_xhat / static_cast<double>(cols);
    T* out = gx + r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const double xhat = (xr[c] - m) * iv;
      out[c] = static_cast<T>(iv * (gr[c] * (w ? w[c] : T(1)) - a - xhat * bb));
    }
  }
}

// Parameter gradients: one thread per column, summing over rows in double (deterministic).
template <typename T>
__global__ void layer_norm_backward_params_kernel(T* gw, T* gb, const T* g, const T* x, const T* mean, const T* rstd,
                                                  int64_t rows, int64_t cols) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double sw = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T gv = g[r * cols + c];
      if (gw) sw += gv * ((x[r * cols + c] - static_cast<double>(mean[r])) * static_cast<double>(rstd[r]));
      sb += gv;
    }
    if (gw) gw[c] = static_cast<T>(sw);
    if (gb) gb[c] = static_cast<T>(sb);
  }
}

template <typename T>
__global__ void cross_entropy_kernel(T* losses, T* row_weight, T* probs, const T* logits, const int64_t* target,
                                     const T* cw, int64_t rows, int64_t C, int64_t ignore_index,
                                     double label_smoothing) {
  __shared__ T tbuf[kThreads];
  __shared__ double dbuf[kThreads];
  const sh::Exp exp_;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * C;
    T* p = probs + r * C;
    const int64_t y = target[r];
    if (y == ignore_index) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) p[c] = 0;
      if (threadIdx.x == 0) {
        losses[r] = 0;
        row_weight[r] = 0;
      }
      continue;  // uniform across the block: no barrier is skipped by only some threads
    }
    T mx = x[0];
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = x[c] > mx ? x[c] : mx;
    mx = block_reduce(mx, MaxIgnoringNaN{}, tbuf);
    double s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const T e = exp_(static_cast<T>(x[c] - mx));
      p[c] = e;
      s += e;
    }
    s = block_reduce(s, SumOp{}, dbuf);
    const double lse = static_cast<double>(mx) + sh::Log{}(s);
    const T inv = static_cast<T>(1.0 / s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) p[c] *= inv;
    double smooth = 0;
    if (label_smoothing > 0) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) smooth += (cw ? cw[c] : T(1)) * (lse - x[c]);
      smooth = block_reduce(smooth, SumOp{}, dbuf);
    }
    if (threadIdx.x == 0) {
      const double wy = cw ? static_cast<double>(cw[y]) : 1.0;
      double loss = (1.0 - label_smoothing) * wy * (lse - x[y]);
      if (label_smoothing > 0) loss += label_smoothing / static_cast<double>(C) * smooth;
      losses[r] = static_cast<T>(loss);
      row_weight[r] = static_cast<T>(wy);
    }
  }
}

template <typename T>
__global__ void cross_entropy_backward_kernel(T* grad, const T* row_scale, const T* probs, const int64_t* target,
                                              const T* cw, int64_t rows, int64_t C, int64_t ignore_index,
                                              double label_smoothing) {
  __shared__ double dbuf[kThreads];
  double W = static_cast<double>(C);
  if (cw) {
    double s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += cw[c];
    W = block_reduce(s, SumOp{}, dbuf);
  }
  const T eps_c = static_cast<T>(label_smoothing / static_cast<double>(C));
  const T one_minus = static_cast<T>(1.0 - label_smoothing);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* gr = grad + r * C;
    const int64_t y = target[r];
    if (y == ignore_index) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) gr[c] = 0;
      continue;
    }
    const T* p = probs + r * C;
    const T s = row_scale[r];
    const T wy = cw ? cw[y] : T(1);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      T v = one_minus * wy * p[c];
      if (label_smoothing > 0) v += eps_c * (static_cast<T>(W) * p[c] - (cw ? cw[c] : T(1)));
      gr[c] = s * v;
      if (c == y) gr[c] -= s * one_minus * wy;
    }
  }
}

// batch_norm over x viewed as [n, c, s]: block ch handles channel ch (n * s elements). T: the storage of
// x, out, g and gx; P: of the [C] tensors (float for a float16/bfloat16 T, else T). Elements are widened
// to P (sh::to_opmath) and the output rounded once, as the cpu kernel.
template <typename T, typename P>
__global__ void batch_norm_kernel(T* out, P* save_mean, P* save_rstd, const T* x, const P* w, const P* b,
                                  P* running_mean, P* running_var, bool use_batch_stats, double momentum, double eps,
                                  int64_t n, int64_t c, int64_t s) {
  __shared__ double buf[kThreads];
  const int64_t count = n * s;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double mean, var;
    if (use_batch_stats) {
      double sum = 0;
      for (int64_t k = threadIdx.x; k < count; k += blockDim.x) sum += sh::to_opmath(x[((k / s) * c + ch) * s + k % s]);
      sum = block_reduce(sum, SumOp{}, buf);
      mean = sum / static_cast<double>(count);
      double sq = 0;
      for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
        const double d = sh::to_opmath(x[((k / s) * c + ch) * s + k % s]) - mean;
        sq += d * d;
      }
      sq = block_reduce(sq, SumOp{}, buf);
      var = sq / static_cast<double>(count);
      if (running_mean != nullptr && threadIdx.x == 0) {
        const double unbiased = count > 1 ? sq / static_cast<double>(count - 1) : var;
        running_mean[ch] = static_cast<P>((1 - momentum) * running_mean[ch] + momentum * mean);
        running_var[ch] = static_cast<P>((1 - momentum) * running_var[ch] + momentum * unbiased);
      }
    } else {
      mean = running_mean[ch];
      var = running_var[ch];
    }
    const double rstd = 1.0 / sh::Sqrt{}(var + eps);
    if (threadIdx.x == 0) {
      save_mean[ch] = static_cast<P>(mean);
      save_rstd[ch] = static_cast<P>(rstd);
    }
    const P scale = static_cast<P>(rstd * (w ? static_cast<double>(w[ch]) : 1.0));
    const P shift = static_cast<P>((b ? static_cast<double>(b[ch]) : 0.0) - mean * rstd * (w ? static_cast<double>(w[ch]) : 1.0));
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t at = ((k / s) * c + ch) * s + k % s;
      out[at] = sh::Cast<T>{}(sh::to_opmath(x[at]) * scale + shift);
    }
  }
}

template <typename T, typename P>
__global__ void batch_norm_backward_kernel(T* gx, P* gw, P* gb, const T* g, const T* x, const P* save_mean,
                                           const P* save_rstd, const P* w, bool use_batch_stats, int64_t n, int64_t c,
                                           int64_t s) {
  __shared__ double buf[kThreads];
  const int64_t count = n * s;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double mean = save_mean[ch], rstd = save_rstd[ch];
    double sum_g = 0, sum_gx = 0;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t at = ((k / s) * c + ch) * s + k % s;
      const double gk = sh::to_opmath(g[at]);
      sum_g += gk;
      sum_gx += gk * (sh::to_opmath(x[at]) - mean);
    }
    sum_g = block_reduce(sum_g, SumOp{}, buf);
    sum_gx = block_reduce(sum_gx, SumOp{}, buf) * rstd;
    if (threadIdx.x == 0) {
      if (gw) gw[ch] = static_cast<P>(sum_gx);
      if (gb) gb[ch] = static_cast<P>(sum_g);
    }
    if (!gx) continue;  // uniform across the block
    const double wc = w ? static_cast<double>(w[ch]) : 1.0;
    const P k = static_cast<P>(wc * rstd);
    if (use_batch_stats) {
      const P mg = static_cast<P>(sum_g / count);
      const P mgx = static_cast<P>(sum_gx / count * rstd);
      const P m = static_cast<P>(mean);
      for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
        const int64_t at = ((e / s) * c + ch) * s + e % s;
        gx[at] = sh::Cast<T>{}(k * (sh::to_opmath(g[at]) - mg - (sh::to_opmath(x[at]) - m) * mgx));
      }
    } else {
      for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
        const int64_t at = ((e / s) * c + ch) * s + e % s;
        gx[at] = sh::Cast<T>{}(k * sh::to_opmath(g[at]));
      }
    }
  }
}


// The channels-last rows path (s == 1: x is [n, c] rows, what nn/functional/batch_norm.cpp passes for
// NHWC inputs and BatchNorm1d): the per-channel kernels above would read a column with stride c, one
// uncoalesced access per element. Here a block is 32 channels x 8 rows: a warp reads 32 consecutive
// channels of one row, blocks along y take bands of rows and write per-band partial sums (double),
// and a per-channel kernel adds the bands in order (deterministic), as the cpu kernel's column_sums.
// Two passes for the statistics as the cpu kernel: the mean, then squared deviations from it rounded
// to P.
constexpr int kRowsTileC = 32, kRowsTileR = 8;

struct Sums2 {  // trivial: it lives in __shared__ memory
  double a, b;
};

// f(r, j) -> Sums2 summed over the rows of band blockIdx.y for channel j; partial[band * c + j].
template <typename F>
__global__ void bn_rows_partials_kernel(Sums2* partial, F f, int64_t n, int64_t c, int64_t rows_per_band) {
  __shared__ Sums2 buf[kRowsTileR][kRowsTileC];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsTileC + threadIdx.x;
  const int64_t lo = static_cast<int64_t>(blockIdx.y) * rows_per_band;
  const int64_t hi = lo + rows_per_band < n ? lo + rows_per_band : n;
  Sums2 acc{0, 0};
  if (j < c) {
    for (int64_t r = lo + threadIdx.y; r < hi; r += kRowsTileR) {
      const Sums2 v = f(r, j);
      acc.a += v.a;
      acc.b += v.b;
    }
  }
  buf[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    for (int k = 1; k < kRowsTileR; ++k) {
      acc.a += buf[k][threadIdx.x].a;
      acc.b += buf[k][threadIdx.x].b;
    }
    partial[blockIdx.y * c + j] = acc;
  }
}

template <typename T, typename P>
struct RowsX {
  const T* x;
  int64_t c;
  __device__ Sums2 operator()(int64_t r, int64_t j) const { return {static_cast<double>(sh::to_opmath(x[r * c + j])), 0.0}; }
};
template <typename T, typename P>
struct RowsSquaredDeviation {
  const T* x;
  const P* mean;
  int64_t c;
  __device__ Sums2 operator()(int64_t r, int64_t j) const {
    const P d = sh::to_opmath(x[r * c + j]) - mean[j];
    return {static_cast<double>(d * d), 0.0};
  }
};
template <typename T, typename P>
struct RowsGradSums {  // sum(g), sum(g * (x - mean))
  const T* g;
  const T* x;
  const P* mean;
  int64_t c;
  __device__ Sums2 operator()(int64_t r, int64_t j) const {
    const P gv = sh::to_opmath(g[r * c + j]);
    return {static_cast<double>(gv), static_cast<double>(gv * (sh::to_opmath(x[r * c + j]) - mean[j]))};
  }
};

__device__ Sums2 band_total(const Sums2* partial, int64_t bands, int64_t c, int64_t j) {
  Sums2 t{0, 0};
  for (int64_t b = 0; b < bands; ++b) {
    t.a += partial[b * c + j].a;
    t.b += partial[b * c + j].b;
  }
  return t;
}

// mean[j] (double, and rounded to P for the second pass) from the first pass's bands.
template <typename P>
__global__ void bn_rows_mean_kernel(double* mean, P* mean_t, const Sums2* partial, int64_t bands, int64_t n, int64_t c) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < c;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    mean[j] = band_total(partial, bands, c, j).a / static_cast<double>(n);
    mean_t[j] = static_cast<P>(mean[j]);
  }
}

// The statistics (batch: from the mean and the second pass's bands; eval: the running ones), the
// running update, save_mean/save_rstd, and the per-channel scale and shift of the output.
template <typename P>
__global__ void bn_rows_finalize_kernel(P* scale, P* shift, P* save_mean, P* save_rstd, P* running_mean, P* running_var,
                                        const double* batch_mean, const Sums2* partial, int64_t bands, const P* w,
                                        const P* b, bool use_batch_stats, double momentum, double eps, int64_t n,
                                        int64_t c) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < c;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double mean, var;
    if (use_batch_stats) {
      const double sq = band_total(partial, bands, c, j).a;
      mean = batch_mean[j];
      var = sq / static_cast<double>(n);
      if (running_mean != nullptr) {
        const double unbiased = n > 1 ? sq / static_cast<double>(n - 1) : var;
        running_mean[j] = static_cast<P>((1 - momentum) * running_mean[j] + momentum * mean);
        running_var[j] = static_cast<P>((1 - momentum) * running_var[j] + momentum * unbiased);
      }
    } else {
      mean = running_mean[j];
      var = running_var[j];
    }
    const double rstd = 1.0 / sh::Sqrt{}(var + eps);
    const double wj = w ? static_cast<double>(w[j]) : 1.0;
    save_mean[j] = static_cast<P>(mean);
    save_rstd[j] = static_cast<P>(rstd);
    scale[j] = static_cast<P>(rstd * wj);
    shift[j] = static_cast<P>((b ? static_cast<double>(b[j]) : 0.0) - mean * rstd * wj);
  }
}

// out[r, j] = to_opmath(x[r, j]) * scale[j] + shift[j], rounded once to T (coalesced along channels).
template <typename T, typename P>
__global__ void bn_rows_apply_kernel(T* out, const T* x, const P* scale, const P* shift, int64_t n, int64_t c) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsTileC + threadIdx.x;
  if (j >= c) return;
  const P sc = scale[j], sf = shift[j];
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowsTileR + threadIdx.y; r < n;
       r += static_cast<int64_t>(gridDim.y) * kRowsTileR) {
    out[r * c + j] = sh::Cast<T>{}(sh::to_opmath(x[r * c + j]) * sc + sf);
  }
}

// The parameter gradients and the per-channel factors of the input gradient (cpu: batch_norm_rows_backward).
template <typename P>
__global__ void bn_rows_backward_finalize_kernel(P* gw, P* gb, P* k, P* mg, P* mgx, const Sums2* partial,
                                                 int64_t bands, const P* save_rstd, const P* w, int64_t n, int64_t c) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < c;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Sums2 t = band_total(partial, bands, c, j);
    const double rstd = save_rstd[j];
    const double sum_gx = t.b * rstd;
    if (gw) gw[j] = static_cast<P>(sum_gx);
    if (gb) gb[j] = static_cast<P>(t.a);
    k[j] = static_cast<P>((w ? static_cast<double>(w[j]) : 1.0) * rstd);
    mg[j] = static_cast<P>(t.a / static_cast<double>(n));
    mgx[j] = static_cast<P>(sum_gx / static_cast<double>(n) * rstd);
  }
}

template <typename T, typename P>
__global__ void bn_rows_backward_apply_kernel(T* gx, const T* g, const T* x, const P* mean, const P* k, const P* mg,
                                              const P* mgx, bool use_batch_stats, int64_t n, int64_t c) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsTileC + threadIdx.x;
  if (j >= c) return;
  const P kj = k[j], mgj = mg[j], mgxj = mgx[j], mj = mean[j];
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowsTileR + threadIdx.y; r < n;
       r += static_cast<int64_t>(gridDim.y) * kRowsTileR) {
    const int64_t at = r * c + j;
    gx[at] = use_batch_stats ? sh::Cast<T>{}(kj * (sh::to_opmath(g[at]) - mgj - (sh::to_opmath(x[at]) - mj) * mgxj))
                             : sh::Cast<T>{}(kj * sh::to_opmath(g[at]));
  }
}

// P-rounded copy of save_mean (the backward's mean, as the cpu kernel's mean_t).
template <typename P>
__global__ void bn_copy_kernel(P* dst, const P* src, int64_t c) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < c;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[j] = src[j];
}

template <typename P>
__global__ void bn_inference_stats_kernel(P* save_mean, P* save_rstd, const P* running_mean, const P* running_var,
                                          double eps, int64_t c) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < c;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    save_mean[j] = running_mean[j];
    save_rstd[j] = static_cast<P>(1.0 / sh::Sqrt{}(static_cast<double>(running_var[j]) + eps));
  }
}

// How the rows are cut into bands: enough blocks to fill the device, each thread summing >= 16 rows.
struct RowsLaunch {
  int64_t bands, rows_per_band;
  dim3 partial_grid, apply_grid;
  RowsLaunch(int64_t n, int64_t c, int sms) {
    const int64_t col_tiles = (c + kRowsTileC - 1) / kRowsTileC;
    const int64_t want = std::max<int64_t>(1, (static_cast<int64_t>(sms) * 8 + col_tiles - 1) / col_tiles);
    const int64_t most = std::max<int64_t>(1, n / (kRowsTileR * 16));
    bands = std::min<int64_t>({want, most, 65535});
    rows_per_band = (n + bands - 1) / bands;
    bands = (n + rows_per_band - 1) / rows_per_band;
    partial_grid = dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(bands));
    apply_grid = dim3(static_cast<unsigned>(col_tiles),
                      static_cast<unsigned>(std::min<int64_t>((n + kRowsTileR - 1) / kRowsTileR,
                                                              std::max<int64_t>(1, (static_cast<int64_t>(sms) * 32 + col_tiles - 1) / col_tiles))));
  }
};

template <typename T, typename P>
void batch_norm_rows(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                     const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                     bool use_batch_stats, double momentum, double eps, int64_t n, int64_t c) {
  LaunchContext ctx(x.device());
  const RowsLaunch L(n, c, ctx.sms);
  const dim3 tile(kRowsTileC, kRowsTileR);
  const unsigned cgrid = grid_for(c, kThreads, ctx.sms);
  // Workspace from the caching allocator, ordered on this stream: the bands, the mean, scale and shift.
  const Tensor bands = make_tensor({L.bands * c * 2}, kFloat64, x.device());
  const Tensor mean = make_tensor({c}, kFloat64, x.device());
  const Tensor params = make_tensor({3 * c}, dtype_of<P>::value, x.device());
  auto* partial = static_cast<Sums2*>(bands.raw_data_ptr());
  P* mean_t = static_cast<P*>(params.raw_data_ptr());
  P* scale = mean_t + c;
  P* shift = mean_t + 2 * c;
  const T* px = ptr_or_null<const T>(x);
  if (use_batch_stats) {
    bn_rows_partials_kernel<<<L.partial_grid, tile, 0, ctx.stream>>>(partial, RowsX<T, P>{px, c}, n, c, L.rows_per_band);
    check_launch("batch_norm (channels-last sums)");
    bn_rows_mean_kernel<P><<<cgrid, kThreads, 0, ctx.stream>>>(ptr_or_null<double>(mean), mean_t, partial, L.bands, n, c);
    check_launch("batch_norm (channels-last mean)");
    bn_rows_partials_kernel<<<L.partial_grid, tile, 0, ctx.stream>>>(
        partial, RowsSquaredDeviation<T, P>{px, mean_t, c}, n, c, L.rows_per_band);
    check_launch("batch_norm (channels-last squared deviations)");
  }
  bn_rows_finalize_kernel<P><<<cgrid, kThreads, 0, ctx.stream>>>(
      scale, shift, ptr_or_null<P>(save_mean), ptr_or_null<P>(save_rstd), ptr_or_null<P>(running_mean),
      ptr_or_null<P>(running_var), ptr_or_null<const double>(mean), partial, L.bands, ptr_or_null<const P>(weight),
      ptr_or_null<const P>(bias), use_batch_stats, momentum, eps, n, c);
  check_launch("batch_norm (channels-last statistics)");
  bn_rows_apply_kernel<T, P><<<L.apply_grid, tile, 0, ctx.stream>>>(ptr_or_null<T>(out), px, scale, shift, n, c);
  check_launch("batch_norm (channels-last output)");
}

template <typename T, typename P>
void batch_norm_rows_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                              const Tensor& grad_out, const Tensor& x, const Tensor& save_mean,
                              const Tensor& save_rstd, const Tensor& weight, bool use_batch_stats, int64_t n,
                              int64_t c) {
  LaunchContext ctx(x.device());
  const RowsLaunch L(n, c, ctx.sms);
  const dim3 tile(kRowsTileC, kRowsTileR);
  const unsigned cgrid = grid_for(c, kThreads, ctx.sms);
  const Tensor bands = make_tensor({L.bands * c * 2}, kFloat64, x.device());
  const Tensor params = make_tensor({4 * c}, dtype_of<P>::value, x.device());
  auto* partial = static_cast<Sums2*>(bands.raw_data_ptr());
  P* mean_t = static_cast<P*>(params.raw_data_ptr());
  P* k = mean_t + c;
  P* mg = mean_t + 2 * c;
  P* mgx = mean_t + 3 * c;
  const T* px = ptr_or_null<const T>(x);
  const T* pg = ptr_or_null<const T>(grad_out);
  bn_copy_kernel<P><<<cgrid, kThreads, 0, ctx.stream>>>(mean_t, ptr_or_null<const P>(save_mean), c);
  check_launch("batch_norm_backward (channels-last mean)");
  bn_rows_partials_kernel<<<L.partial_grid, tile, 0, ctx.stream>>>(partial, RowsGradSums<T, P>{pg, px, mean_t, c}, n,
                                                                   c, L.rows_per_band);
  check_launch("batch_norm_backward (channels-last sums)");
  bn_rows_backward_finalize_kernel<P><<<cgrid, kThreads, 0, ctx.stream>>>(
      ptr_or_null<P>(grad_weight), ptr_or_null<P>(grad_bias), k, mg, mgx, partial, L.bands,
      ptr_or_null<const P>(save_rstd), ptr_or_null<const P>(weight), n, c);
  check_launch("batch_norm_backward (channels-last parameters)");
  if (!grad_x.defined()) return;
  bn_rows_backward_apply_kernel<T, P><<<L.apply_grid, tile, 0, ctx.stream>>>(ptr_or_null<T>(grad_x), pg, px, mean_t, k,
                                                                             mg, mgx, use_batch_stats, n, c);
  check_launch("batch_norm_backward (channels-last input gradient)");
}

// x's storage type (float32, float64, float16, bfloat16); the [C] tensors must be in opmath_t of it.
template <typename Fn>
void dispatch_norm_input(const char* op, const Tensor& x, std::initializer_list<const Tensor*> params, const Fn& fn) {
  auto run = [&]<typename T>() {
    using P = sh::opmath_t<T>;
    for (const Tensor* t : params) {
      if (t->defined() && t->dtype() != dtype_of<P>::value) {
        fail("{}: a {} input takes {} weight, bias and statistics, got {}", op, dtype_name(x.dtype()),
             dtype_name(dtype_of<P>::value), dtype_name(t->dtype()));
      }
    }
    fn.template operator()<T, P>();
  };
  switch (x.dtype()) {
    case kFloat32: run.template operator()<float>(); return;
    case kFloat64: run.template operator()<double>(); return;
    case kFloat16: run.template operator()<Half>(); return;
    case kBFloat16: run.template operator()<BFloat16>(); return;
    default: fail("{}: expected a floating-point input, got {}", op, dtype_name(x.dtype()));
  }
}

}  // namespace

void batch_norm_direct(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                       bool use_batch_stats, double momentum, double eps, int64_t n, int64_t c, int64_t s) {
  if (c == 0) return;
  dispatch_norm_input("batch_norm", x, {&weight, &bias, &running_mean, &running_var, &save_mean, &save_rstd},
                      [&]<typename T, typename P>() {
    if (s == 1 && n > 0) {
      return batch_norm_rows<T, P>(out, save_mean, save_rstd, x, weight, bias, running_mean, running_var,
                                   use_batch_stats, momentum, eps, n, c);
    }
    LaunchContext ctx(x.device());  // (training updates the running statistics when they are defined)
    batch_norm_kernel<T, P><<<row_blocks(c), kThreads, 0, ctx.stream>>>(
        ptr_or_null<T>(out), ptr_or_null<P>(save_mean), ptr_or_null<P>(save_rstd), ptr_or_null<const T>(x),
        ptr_or_null<const P>(weight), ptr_or_null<const P>(bias),
        ptr_or_null<P>(running_mean), ptr_or_null<P>(running_var), use_batch_stats, momentum, eps, n, c, s);
    check_launch("batch_norm");
  });
}

void batch_norm_backward_direct(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& save_mean,
                                const Tensor& save_rstd, const Tensor& weight, bool use_batch_stats, int64_t n,
                                int64_t c, int64_t s) {
  if (c == 0) return;
  dispatch_norm_input("batch_norm_backward", x, {&weight, &save_mean, &save_rstd, &grad_weight, &grad_bias},
                      [&]<typename T, typename P>() {
    if (s == 1 && n > 0) {
      return batch_norm_rows_backward<T, P>(grad_x, grad_weight, grad_bias, grad_out, x, save_mean, save_rstd, weight,
                                            use_batch_stats, n, c);
    }
    LaunchContext ctx(x.device());
    batch_norm_backward_kernel<T, P><<<row_blocks(c), kThreads, 0, ctx.stream>>>(
        ptr_or_null<T>(grad_x), ptr_or_null<P>(grad_weight), ptr_or_null<P>(grad_bias), ptr_or_null<const T>(grad_out),
        ptr_or_null<const T>(x), ptr_or_null<const P>(save_mean), ptr_or_null<const P>(save_rstd),
        ptr_or_null<const P>(weight), use_batch_stats, n, c, s);
    check_launch("batch_norm_backward");
  });
}

void batch_norm_inference_stats(const Tensor& save_mean, const Tensor& save_rstd, const Tensor& running_mean,
                                const Tensor& running_var, double eps, int64_t c) {
  if (c == 0) return;
  auto run = [&]<typename P>() {
    LaunchContext ctx(running_mean.device());
    bn_inference_stats_kernel<P><<<grid_for(c, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        ptr_or_null<P>(save_mean), ptr_or_null<P>(save_rstd), ptr_or_null<const P>(running_mean),
        ptr_or_null<const P>(running_var), eps, c);
    check_launch("batch_norm (inference statistics)");
  };
  switch (save_mean.dtype()) {
    case kFloat32: return run.template operator()<float>();
    case kFloat64: return run.template operator()<double>();
    default: fail("batch_norm: statistics must be float32 or float64, got {}", dtype_name(save_mean.dtype()));
  }
}

void layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                const Tensor& bias, int64_t rows, int64_t cols, double eps) {
  if (rows == 0) return;
  CHORUS_DISPATCH_FLOATING(x.dtype(), "layer_norm", [&]<typename T>() {
    LaunchContext ctx(x.device());
    layer_norm_kernel<T><<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
        ptr_or_null<T>(out), ptr_or_null<T>(mean), ptr_or_null<T>(rstd), ptr_or_null<const T>(x),
        ptr_or_null<const T>(weight), ptr_or_null<const T>(bias), rows, cols, eps);
    check_launch("layer_norm");
  });
}

void layer_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& g,
                         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, int64_t rows,
                         int64_t cols) {
  CHORUS_DISPATCH_FLOATING(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    LaunchContext ctx(x.device());
    if (grad_x.defined() && rows > 0) {
      layer_norm_backward_rows_kernel<T><<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
          ptr_or_null<T>(grad_x), ptr_or_null<const T>(g), ptr_or_null<const T>(x), ptr_or_null<const T>(mean),
          ptr_or_null<const T>(rstd), ptr_or_null<const T>(weight), rows, cols);
      check_launch("layer_norm_backward");
    }
    if ((grad_weight.defined() || grad_bias.defined()) && cols > 0) {
      layer_norm_backward_params_kernel<T><<<grid_for(cols, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
          ptr_or_null<T>(grad_weight), ptr_or_null<T>(grad_bias), ptr_or_null<const T>(g), ptr_or_null<const T>(x),
          ptr_or_null<const T>(mean), ptr_or_null<const T>(rstd), rows, cols);
      check_launch("layer_norm_backward (weight, bias)");
    }
  });
}

void cross_entropy(const Tensor& losses, const Tensor& row_weight, const Tensor& probs, const Tensor& logits,
                   const Tensor& target, const Tensor& class_weight, int64_t ignore_index, double label_smoothing) {
  const int64_t rows = logits.size(0), C = logits.size(1);
  if (rows == 0) return;
  CHORUS_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&]<typename T>() {
    LaunchContext ctx(logits.device());
    cross_entropy_kernel<T><<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
        ptr_or_null<T>(losses), ptr_or_null<T>(row_weight), ptr_or_null<T>(probs), ptr_or_null<const T>(logits),
        ptr_or_null<const int64_t>(target), ptr_or_null<const T>(class_weight), rows, C, ignore_index,
        label_smoothing);
    check_launch("cross_entropy");
  });
}

void cross_entropy_backward(const Tensor& grad_logits, const Tensor& row_scale, const Tensor& probs,
                            const Tensor& target, const Tensor& class_weight, int64_t ignore_index,
                            double label_smoothing) {
  const int64_t rows = probs.size(0), C = probs.size(1);
  if (rows == 0) return;
  CHORUS_DISPATCH_FLOATING(probs.dtype(), "cross_entropy_backward", [&]<typename T>() {
    LaunchContext ctx(probs.device());
    cross_entropy_backward_kernel<T><<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
        ptr_or_null<T>(grad_logits), ptr_or_null<const T>(row_scale), ptr_or_null<const T>(probs),
        ptr_or_null<const int64_t>(target), ptr_or_null<const T>(class_weight), rows, C, ignore_index,
        label_smoothing);
    check_launch("cross_entropy_backward");
  });
}

}  // namespace chorus::kernels::cuda_impl
