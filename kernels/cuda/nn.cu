// layer_norm, cross_entropy and chorus's own batch_norm (each with its backward; cudnn_bn.cpp runs
// batch_norm through cuDNN and falls back to these) on CUDA over contiguous buffers, with the shared
// exp/log/sqrt of kernels/shared/pointwise_math.h. layer_norm is a row kernel
// (kernels/cuda/row_kernels.h, [Row kernels] in kernels/shared/row_plan.h: a warp per row in
// registers, or a block per row cached in shared memory; statistics in float for float32);
// cross_entropy runs one block per row and batch_norm one block per channel over [n, c, s] with
// s > 1 (a coalesced rows path for s == 1), with the cpu kernels' double accumulations
// (kernels/cpu/nn_basic.cpp, conv.cpp).
#include <cuda/std/limits>

#include <initializer_list>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/row_kernels.h"
#include "kernels/shared/pointwise_math.h"
#include "kernels/shared/reduce_math.h"
#include "kernels/shared/storage_dispatch.h"

namespace chorus::kernels::cuda_impl {
namespace {

constexpr int kThreads = 256;

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data_ptr()) : nullptr;
}
unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535LL * 16)); }

// layer_norm rows ([Row kernels] in kernels/shared/row_plan.h): statistics in opmath (float for
// float32, double for float64) by two passes over the row held in registers (warp kernel) or in
// shared memory (block kernel, when it fits; else the row is read again), so a large offset does not
// cancel as E[x^2] - E[x]^2 would; out = (x - mean) * rstd * w + b as the cpu kernel.
template <typename T, int V, int N>
__global__ void layer_norm_warp_kernel(T* out, sh::opmath_t<T>* mean, sh::opmath_t<T>* rstd, const T* x,
                                       const sh::opmath_t<T>* w, const sh::opmath_t<T>* b, int64_t rows,
                                       int64_t cols, int lanes, double eps) {
  using Acc = sh::opmath_t<T>;
  const int group = sh::warp_row_in_block(threadIdx.x, lanes), lane = sh::warp_lane(threadIdx.x, lanes);
  const int64_t per_block = blockDim.x / lanes;
  for (int64_t first = blockIdx.x * per_block; first < rows; first += gridDim.x * per_block) {
    const int64_t row = first + group;
    const bool active = row < rows;
    Acc v[N][V];
    Acc sum = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (active && c < cols) {
        row_kernels::load<V>(x + row * cols + c, v[j]);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) v[j][i] = 0;
      }
#pragma unroll
      for (int i = 0; i < V; ++i) sum += v[j][i];
    }
    const Acc mu = row_kernels::warp_allreduce(sum, row_kernels::Sum{}, lanes) / static_cast<Acc>(cols);
    Acc sq = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (sh::warp_column(lane, j, lanes, V) >= cols) continue;  // padding is not part of the row
#pragma unroll
      for (int i = 0; i < V; ++i) sq += (v[j][i] - mu) * (v[j][i] - mu);
    }
    sq = row_kernels::warp_allreduce(sq, row_kernels::Sum{}, lanes);
    const Acc inv = Acc(1) / sh::Sqrt{}(sq / static_cast<Acc>(cols) + static_cast<Acc>(eps));
    if (!active) continue;  // (no shuffles below)
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = inv;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (c >= cols) continue;
      Acc wv[V], bv[V];
      if (w) row_kernels::load_params<V>(w + c, wv);
      if (b) row_kernels::load_params<V>(b + c, bv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc y = (v[j][i] - mu) * inv;
        v[j][i] = (w ? y * wv[i] : y) + (b ? bv[i] : Acc(0));
      }
      row_kernels::store<V>(out + row * cols + c, v[j]);
    }
  }
}

template <typename T, int V>
__global__ void layer_norm_block_kernel(T* out, sh::opmath_t<T>* mean, sh::opmath_t<T>* rstd, const T* x,
                                       const sh::opmath_t<T>* w, const sh::opmath_t<T>* b, int64_t rows,
                                        int64_t cols, bool cache, double eps) {
  using Acc = sh::opmath_t<T>;
  extern __shared__ __align__(16) unsigned char row_cache[];
  __shared__ Acc buf[32];
  T* cached = reinterpret_cast<T*>(row_cache);
  const int64_t end = cols / V * V;  // V divides cols when V > 1
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    Acc sum = 0;
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= end) break;
      T raw[V];
      row_kernels::load_raw<V>(xr + c, raw);
      if (cache) row_kernels::store_raw<V>(cached + c, raw);
#pragma unroll
      for (int i = 0; i < V; ++i) sum += sh::to_opmath(raw[i]);
    }
    const Acc mu = row_kernels::block_allreduce(sum, row_kernels::Sum{}, buf) / static_cast<Acc>(cols);
    const T* src = cache ? cached : xr;  // each thread reads back only what it cached: no barrier
    Acc sq = 0;
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= end) break;
      Acc v[V];
      row_kernels::load<V>(src + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) sq += (v[i] - mu) * (v[i] - mu);
    }
    sq = row_kernels::block_allreduce(sq, row_kernels::Sum{}, buf);
    const Acc inv = Acc(1) / sh::Sqrt{}(sq / static_cast<Acc>(cols) + static_cast<Acc>(eps));
    if (threadIdx.x == 0) {
      mean[row] = mu;
      rstd[row] = inv;
    }
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= end) break;
      Acc v[V], wv[V], bv[V];
      row_kernels::load<V>(src + c, v);
      if (w) row_kernels::load_params<V>(w + c, wv);
      if (b) row_kernels::load_params<V>(b + c, bv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc y = (v[i] - mu) * inv;
        v[i] = (w ? y * wv[i] : y) + (b ? bv[i] : Acc(0));
      }
      row_kernels::store<V>(out + row * cols + c, v);
    }
  }
}

// Input gradient: gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), the two row sums in one
// reduction (a pair).
// g * w rounded on its own, never fused with the subtraction that follows (nvcc contracts a*b - c
// into one fma by default): the product then equals the one summed into the row's mean, so a row
// whose terms cancel exactly (one column) gives 0 as the CPU kernel does, not the product's rounding
// error times rstd (1/sqrt(eps), ~316). Seen on an H200, 2026-11-29: float64 rows of 1 column.
__device__ __forceinline__ float mul_rounded(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rounded(double a, double b) { return __dmul_rn(a, b); }

template <typename T, int V, int N>
__global__ void layer_norm_backward_warp_kernel(T* gx, const T* g, const T* x, const sh::opmath_t<T>* mean,
                                                const sh::opmath_t<T>* rstd, const sh::opmath_t<T>* w, int64_t rows, int64_t cols, int lanes) {
  using Acc = sh::opmath_t<T>;
  const int group = sh::warp_row_in_block(threadIdx.x, lanes), lane = sh::warp_lane(threadIdx.x, lanes);
  const int64_t per_block = blockDim.x / lanes;
  for (int64_t first = blockIdx.x * per_block; first < rows; first += gridDim.x * per_block) {
    const int64_t row = first + group;
    const bool active = row < rows;
    const Acc m = active ? mean[row] : Acc(0), iv = active ? rstd[row] : Acc(0);
    Acc xhat[N][V], gw[N][V];
    row_kernels::Pair<Acc> sums{0, 0};
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (active && c < cols) {
        row_kernels::load<V>(x + row * cols + c, xhat[j]);
        row_kernels::load<V>(g + row * cols + c, gw[j]);
        Acc wv[V];
        if (w) row_kernels::load_params<V>(w + c, wv);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          xhat[j][i] = (xhat[j][i] - m) * iv;
          if (w) gw[j][i] = mul_rounded(gw[j][i], wv[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) xhat[j][i] = gw[j][i] = 0;
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        sums.a += gw[j][i];
        sums.b += gw[j][i] * xhat[j][i];
      }
    }
    sums = row_kernels::warp_allreduce(sums, row_kernels::Sum{}, lanes);
    const Acc a = sums.a / static_cast<Acc>(cols), bb = sums.b / static_cast<Acc>(cols);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (!active || c >= cols) continue;
#pragma unroll
      for (int i = 0; i < V; ++i) gw[j][i] = iv * (gw[j][i] - a - xhat[j][i] * bb);
      row_kernels::store<V>(gx + row * cols + c, gw[j]);
    }
  }
}

template <typename T, int V>
__global__ void layer_norm_backward_block_kernel(T* gx, const T* g, const T* x, const sh::opmath_t<T>* mean,
                                                 const sh::opmath_t<T>* rstd, const sh::opmath_t<T>* w, int64_t rows, int64_t cols, bool cache) {
  using Acc = sh::opmath_t<T>;
  extern __shared__ __align__(16) unsigned char row_cache[];
  __shared__ row_kernels::Pair<Acc> buf[32];
  T* cached_x = reinterpret_cast<T*>(row_cache);
  T* cached_g = cached_x + cols;
  const int64_t end = cols / V * V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    const T* gr = g + row * cols;
    const Acc m = mean[row], iv = rstd[row];
    row_kernels::Pair<Acc> sums{0, 0};
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= end) break;
      T xraw[V], graw[V];
      row_kernels::load_raw<V>(xr + c, xraw);
      row_kernels::load_raw<V>(gr + c, graw);
      if (cache) {
        row_kernels::store_raw<V>(cached_x + c, xraw);
        row_kernels::store_raw<V>(cached_g + c, graw);
      }
      Acc wv[V];
      if (w) row_kernels::load_params<V>(w + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc gwv = w ? mul_rounded(sh::to_opmath(graw[i]), wv[i]) : sh::to_opmath(graw[i]);
        sums.a += gwv;
        sums.b += gwv * ((sh::to_opmath(xraw[i]) - m) * iv);
      }
    }
    sums = row_kernels::block_allreduce(sums, row_kernels::Sum{}, buf);
    const Acc a = sums.a / static_cast<Acc>(cols), bb = sums.b / static_cast<Acc>(cols);
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= end) break;
      Acc xv[V], gv[V], wv[V];
      row_kernels::load<V>((cache ? cached_x : xr) + c, xv);
      row_kernels::load<V>((cache ? cached_g : gr) + c, gv);
      if (w) row_kernels::load_params<V>(w + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc gwv = w ? mul_rounded(gv[i], wv[i]) : gv[i];
        gv[i] = iv * (gwv - a - ((xv[i] - m) * iv) * bb);
      }
      row_kernels::store<V>(gx + row * cols + c, gv);
    }
  }
}

// Parameter gradients (sum over rows of g * xhat and of g, in double as the cpu kernel):
// kernels/shared/row_plan.h's ColumnSumPlan. Block (tile, chunk): 32 columns x kColumnSumRowLanes
// row lanes, so each warp reads 32 neighbouring columns of one row; the row lanes' sums are added
// in shared memory in a fixed order, one partial per column and chunk.
template <typename T>
__global__ void layer_norm_params_partial_kernel(double* partial_w, double* partial_b, const T* g, const T* x,
                                                 const sh::opmath_t<T>* mean, const sh::opmath_t<T>* rstd, int64_t rows, int64_t cols,
                                                 int64_t rows_per_chunk) {
  constexpr int kLanes = sh::kColumnSumRowLanes;
  __shared__ double sw[kLanes][33], sb[kLanes][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c = blockIdx.x * 32LL + tx;
  const int64_t lo = blockIdx.y * rows_per_chunk, hi = min(rows, lo + rows_per_chunk);
  double aw = 0, ab = 0;
  if (c < cols) {
    for (int64_t r = lo + ty; r < hi; r += kLanes) {
      const double gv = sh::to_opmath(g[r * cols + c]);
      if (partial_w) {
        aw += gv * ((sh::to_opmath(x[r * cols + c]) - static_cast<double>(mean[r])) *
                    static_cast<double>(rstd[r]));
      }
      ab += gv;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty != 0 || c >= cols) return;
  for (int k = 1; k < kLanes; ++k) {
    aw += sw[k][tx];
    ab += sb[k][tx];
  }
  if (partial_w) partial_w[blockIdx.y * cols + c] = aw;
  if (partial_b) partial_b[blockIdx.y * cols + c] = ab;
}

template <typename P>
__global__ void layer_norm_params_finish_kernel(P* gw, P* gb, const double* partial_w, const double* partial_b,
                                                int64_t chunks, int64_t cols) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double sw = 0, sb = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      if (gw) sw += partial_w[k * cols + c];
      if (gb) sb += partial_b[k * cols + c];
    }
    if (gw) gw[c] = static_cast<P>(sw);
    if (gb) gb[c] = static_cast<P>(sb);
  }
}

// The row plan of a layer_norm pass over the given arrays (row arrays first, the output among them;
// the per-column weight and bias when defined): their addresses decide the vector width.
sh::RowPlan layer_norm_plan(int64_t rows, int64_t cols, const Tensor& x, int row_inputs,
                            std::initializer_list<const Tensor*> arrays, int sms) {
  sh::RowProblem problem{.rows = rows, .cols = cols, .element_size_bytes = static_cast<int64_t>(x.element_size()),
                         .row_inputs = row_inputs, .addresses = {}, .sms = sms};
  for (const Tensor* t : arrays) {
    if (t->defined()) problem.addresses.push_back(row_kernels::address_of(t->raw_data_ptr()));
  }
  return sh::plan_rows(problem);
}

// T: the storage of logits, probs and the logits' gradient; P = opmath_t<T> (float for float16/
// bfloat16): losses, row weights, row scales and class weights, and the math (as the cpu kernel).
template <typename T>
__global__ void cross_entropy_kernel(sh::opmath_t<T>* losses, sh::opmath_t<T>* row_weight, T* probs,
                                     const T* logits, const int64_t* target, const sh::opmath_t<T>* cw,
                                     int64_t rows, int64_t C, int64_t ignore_index, double label_smoothing) {
  using P = sh::opmath_t<T>;
  __shared__ P tbuf[kThreads];
  __shared__ double dbuf[kThreads];
  const sh::Exp exp_;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * C;
    T* p = probs + r * C;
    const int64_t y = target[r];
    if (y == ignore_index) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) p[c] = sh::Cast<T>{}(0.0f);
      if (threadIdx.x == 0) {
        losses[r] = 0;
        row_weight[r] = 0;
      }
      continue;  // uniform across the block: no barrier is skipped by only some threads
    }
    P mx = sh::to_opmath(x[0]);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const P v = sh::to_opmath(x[c]);
      mx = v > mx ? v : mx;
    }
    mx = block_reduce(mx, MaxIgnoringNaN{}, tbuf);
    double s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += exp_(static_cast<P>(sh::to_opmath(x[c]) - mx));
    s = block_reduce(s, SumOp{}, dbuf);
    const double lse = static_cast<double>(mx) + sh::Log{}(s);
    const P inv = static_cast<P>(1.0 / s);
    // (exp again rather than reading p back: a 16-bit p is rounded once, as the cpu kernel's)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      p[c] = sh::Cast<T>{}(exp_(static_cast<P>(sh::to_opmath(x[c]) - mx)) * inv);
    }
    double smooth = 0;
    if (label_smoothing > 0) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        smooth += (cw ? cw[c] : P(1)) * (lse - static_cast<double>(sh::to_opmath(x[c])));
      }
      smooth = block_reduce(smooth, SumOp{}, dbuf);
    }
    if (threadIdx.x == 0) {
      const double wy = cw ? static_cast<double>(cw[y]) : 1.0;
      double loss = (1.0 - label_smoothing) * wy * (lse - static_cast<double>(sh::to_opmath(x[y])));
      if (label_smoothing > 0) loss += label_smoothing / static_cast<double>(C) * smooth;
      losses[r] = static_cast<P>(loss);
      row_weight[r] = static_cast<P>(wy);
    }
  }
}

template <typename T>
__global__ void cross_entropy_backward_kernel(T* grad, const sh::opmath_t<T>* row_scale, const T* probs,
                                              const int64_t* target, const sh::opmath_t<T>* cw, int64_t rows,
                                              int64_t C, int64_t ignore_index, double label_smoothing) {
  using P = sh::opmath_t<T>;
  __shared__ double dbuf[kThreads];
  double W = static_cast<double>(C);
  if (cw) {
    double s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += cw[c];
    W = block_reduce(s, SumOp{}, dbuf);
  }
  const P eps_c = static_cast<P>(label_smoothing / static_cast<double>(C));
  const P one_minus = static_cast<P>(1.0 - label_smoothing);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* gr = grad + r * C;
    const int64_t y = target[r];
    if (y == ignore_index) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) gr[c] = sh::Cast<T>{}(0.0f);
      continue;
    }
    const T* p = probs + r * C;
    const P s = row_scale[r];
    const P wy = cw ? cw[y] : P(1);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const P pc = sh::to_opmath(p[c]);
      P v = one_minus * wy * pc;
      if (label_smoothing > 0) v += eps_c * (static_cast<P>(W) * pc - (cw ? cw[c] : P(1)));
      P out = s * v;
      if (c == y) out -= s * one_minus * wy;
      gr[c] = sh::Cast<T>{}(out);
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
        sh::update_running_stats(running_mean[ch], running_var[ch], mean, sq, count, momentum);
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
    // Unrolled: four loads in flight per thread (the sums keep their order, so the bits do not change).
#pragma unroll 4
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
      if (running_mean != nullptr) sh::update_running_stats(running_mean[j], running_var[j], mean, sq, n, momentum);
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

}  // namespace

void batch_norm_direct(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                       bool use_batch_stats, double momentum, double eps, int64_t n, int64_t c, int64_t s) {
  if (c == 0) return;
  sh::dispatch_float_storage(x, "batch_norm", {&weight, &bias, &running_mean, &running_var, &save_mean, &save_rstd},
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
  sh::dispatch_float_storage(x, "batch_norm_backward", {&weight, &save_mean, &save_rstd, &grad_weight, &grad_bias},
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
  sh::dispatch_float_storage(x, "layer_norm", {&mean, &rstd, &weight, &bias}, [&]<typename T, typename P>() {
    LaunchContext ctx(x.device());
    const sh::RowPlan plan = layer_norm_plan(rows, cols, x, 1, {&x, &out, &weight, &bias}, ctx.sms);
    T* po = ptr_or_null<T>(out);
    P* pm = ptr_or_null<P>(mean);
    P* pr = ptr_or_null<P>(rstd);
    const T* px = ptr_or_null<const T>(x);
    const P* pw = ptr_or_null<const P>(weight);
    const P* pb = ptr_or_null<const P>(bias);
    row_kernels::dispatch_row_shape<T>(plan, [&]<int V, int N>() {
      if (plan.kernel == sh::RowKernel::Warp) {
        layer_norm_warp_kernel<T, V, N><<<static_cast<unsigned>(plan.blocks), plan.threads, 0, ctx.stream>>>(
            po, pm, pr, px, pw, pb, rows, cols, plan.lanes, eps);
      } else {
        layer_norm_block_kernel<T, V><<<static_cast<unsigned>(plan.blocks), plan.threads, plan.shared_bytes, ctx.stream>>>(
            po, pm, pr, px, pw, pb, rows, cols, plan.cache_in_shared, eps);
      }
    });
    check_launch("layer_norm");
  });
}

void layer_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& g,
                         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, int64_t rows,
                         int64_t cols) {
  sh::dispatch_float_storage(x, "layer_norm_backward", {&mean, &rstd, &weight, &grad_weight, &grad_bias},
                             [&]<typename T, typename P>() {
    LaunchContext ctx(x.device());
    if (grad_x.defined() && rows > 0) {
      const sh::RowPlan plan = layer_norm_plan(rows, cols, x, 2, {&x, &g, &grad_x, &weight}, ctx.sms);
      T* pgx = ptr_or_null<T>(grad_x);
      const T* pg = ptr_or_null<const T>(g);
      const T* px = ptr_or_null<const T>(x);
      const P* pm = ptr_or_null<const P>(mean);
      const P* pr = ptr_or_null<const P>(rstd);
      const P* pw = ptr_or_null<const P>(weight);
      row_kernels::dispatch_row_shape<T>(plan, [&]<int V, int N>() {
        if (plan.kernel == sh::RowKernel::Warp) {
          layer_norm_backward_warp_kernel<T, V, N><<<static_cast<unsigned>(plan.blocks), plan.threads, 0, ctx.stream>>>(
              pgx, pg, px, pm, pr, pw, rows, cols, plan.lanes);
        } else {
          layer_norm_backward_block_kernel<T, V>
              <<<static_cast<unsigned>(plan.blocks), plan.threads, plan.shared_bytes, ctx.stream>>>(
                  pgx, pg, px, pm, pr, pw, rows, cols, plan.cache_in_shared);
        }
      });
      check_launch("layer_norm_backward");
    }
    if ((grad_weight.defined() || grad_bias.defined()) && cols > 0) {
      const sh::ColumnSumPlan plan = sh::plan_column_sums(rows, cols, ctx.sms);
      // (rows == 0: one empty chunk, and the sums written are 0)
      const Tensor pw = grad_weight.defined() ? make_tensor({plan.chunks * cols}, kFloat64, x.device()) : Tensor();
      const Tensor pb = grad_bias.defined() ? make_tensor({plan.chunks * cols}, kFloat64, x.device()) : Tensor();
      const dim3 grid(static_cast<unsigned>(plan.column_tiles), static_cast<unsigned>(plan.chunks));
      layer_norm_params_partial_kernel<T><<<grid, 32 * sh::kColumnSumRowLanes, 0, ctx.stream>>>(
          ptr_or_null<double>(pw), ptr_or_null<double>(pb), ptr_or_null<const T>(g), ptr_or_null<const T>(x),
          ptr_or_null<const P>(mean), ptr_or_null<const P>(rstd), rows, cols, plan.rows_per_chunk);
      check_launch("layer_norm_backward (weight, bias partial sums)");
      layer_norm_params_finish_kernel<P><<<grid_for(cols, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
          ptr_or_null<P>(grad_weight), ptr_or_null<P>(grad_bias), ptr_or_null<const double>(pw),
          ptr_or_null<const double>(pb), plan.chunks, cols);
      check_launch("layer_norm_backward (weight, bias)");
    }
  });
}

void cross_entropy(const Tensor& losses, const Tensor& row_weight, const Tensor& probs, const Tensor& logits,
                   const Tensor& target, const Tensor& class_weight, int64_t ignore_index, double label_smoothing) {
  const int64_t rows = logits.size(0), C = logits.size(1);
  if (rows == 0) return;
  sh::dispatch_float_storage(logits, "cross_entropy", {&losses, &row_weight, &class_weight},
                             [&]<typename T, typename P>() {
    LaunchContext ctx(logits.device());
    cross_entropy_kernel<T><<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
        ptr_or_null<P>(losses), ptr_or_null<P>(row_weight), ptr_or_null<T>(probs), ptr_or_null<const T>(logits),
        ptr_or_null<const int64_t>(target), ptr_or_null<const P>(class_weight), rows, C, ignore_index,
        label_smoothing);
    check_launch("cross_entropy");
  });
}

void cross_entropy_backward(const Tensor& grad_logits, const Tensor& row_scale, const Tensor& probs,
                            const Tensor& target, const Tensor& class_weight, int64_t ignore_index,
                            double label_smoothing) {
  const int64_t rows = probs.size(0), C = probs.size(1);
  if (rows == 0) return;
  sh::dispatch_float_storage(probs, "cross_entropy_backward", {&row_scale, &class_weight},
                             [&]<typename T, typename P>() {
    LaunchContext ctx(probs.device());
    cross_entropy_backward_kernel<T><<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
        ptr_or_null<T>(grad_logits), ptr_or_null<const P>(row_scale), ptr_or_null<const T>(probs),
        ptr_or_null<const int64_t>(target), ptr_or_null<const P>(class_weight), rows, C, ignore_index,
        label_smoothing);
    check_launch("cross_entropy_backward");
  });
}

}  // namespace chorus::kernels::cuda_impl
