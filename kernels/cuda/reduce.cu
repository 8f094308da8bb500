// Reductions (sum, prod, max, min over any dims, laid out by kernels/shared/launch_plan.h's
// plan_reduction), arg-reductions and softmax/softmax_backward on CUDA, with the cpu kernels'
// accumulator types (float sums and products in double, integer sums in int64; kernels/cpu/reduce.cpp).
// Few long rows (a full reduction) are split over many blocks, then their partials reduced. Softmax
// is a row kernel (kernels/cuda/row_kernels.h, [Row kernels] in kernels/shared/row_plan.h): a
// warp per row held in registers up to 4 KiB rows, else a block per row with the row cached in
// shared memory; statistics in float for float32 (double for float64).
#include <cuda/std/limits>

#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/row_kernels.h"
#include "kernels/shared/pointwise_math.h"
#include "kernels/shared/reduce_math.h"
#include "kernels/shared/storage_dispatch.h"

namespace chorus::kernels::cuda_impl {
namespace {

constexpr int kThreads = 256;


// inner == 1: one block per output, the block's threads striding over the reduced elements.
template <typename T, typename Acc, typename Out, ReduceOp Op>
__global__ void reduce_rows_kernel(const T* in, Out* out, int64_t outer, int64_t reduced, int64_t outer_stride,
                                   int64_t reduced_stride) {
  __shared__ Acc buf[kThreads];
  using Red = shared::ReduceRule<Acc, Op>;
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
    Acc acc = Red::identity();
    for (int64_t r = threadIdx.x; r < reduced; r += blockDim.x)
      acc = Red::combine(acc, static_cast<Acc>(sh::to_opmath(in[o * outer_stride + r * reduced_stride])));
    acc = block_reduce(acc, Red{}, buf);
    if (threadIdx.x == 0) out[o] = sh::Cast<Out>{}(acc);
  }
}

// inner > 1: one thread per output; neighbouring threads read neighbouring inner elements.
template <typename T, typename Acc, typename Out, ReduceOp Op>
__global__ void reduce_columns_kernel(const T* in, Out* out, int64_t outer, int64_t reduced, int64_t inner,
                                      int64_t outer_stride, int64_t reduced_stride, int64_t inner_stride) {
  using Red = shared::ReduceRule<Acc, Op>;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < outer * inner;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = idx / inner, i = idx % inner;
    const T* base = in + o * outer_stride + i * inner_stride;
    Acc acc = Red::identity();
    for (int64_t r = 0; r < reduced; ++r) acc = Red::combine(acc, static_cast<Acc>(sh::to_opmath(base[r * reduced_stride])));
    out[idx] = sh::Cast<Out>{}(acc);
  }
}

// Few long rows (e.g. a full reduction): each row split into `chunks` pieces, one block each,
// whose partial results (in Acc) a second pass reduces.
template <typename T, typename Acc, ReduceOp Op>
__global__ void reduce_chunks_kernel(const T* in, Acc* partial, int64_t reduced, int64_t outer_stride,
                                     int64_t reduced_stride, int64_t chunks) {
  __shared__ Acc buf[kThreads];
  using Red = shared::ReduceRule<Acc, Op>;
  const int64_t o = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const int64_t lo = reduced * c / chunks, hi = reduced * (c + 1) / chunks;
  Acc acc = Red::identity();
  for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
    acc = Red::combine(acc, static_cast<Acc>(sh::to_opmath(in[o * outer_stride + r * reduced_stride])));
  acc = block_reduce(acc, Red{}, buf);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <typename T, typename Acc, typename Out, ReduceOp Op>
void reduce_launch(const Tensor& out, const Tensor& in, const sh::ReductionPlan& p) {
  LaunchContext ctx(out.device());
  const T* x = static_cast<const T*>(in.raw_data_ptr());
  Out* o = static_cast<Out*>(out.raw_data_ptr());
  constexpr int64_t kMinChunk = 8192;
  if (p.inner == 1 && p.outer < 4LL * ctx.sms && p.reduced >= 2 * kMinChunk) {
    const int64_t want = (8LL * ctx.sms + p.outer - 1) / p.outer;
    const int64_t chunks = std::max<int64_t>(2, std::min<int64_t>(want, p.reduced / kMinChunk));
    const Tensor partial = make_tensor({p.outer * chunks}, dtype_of<Acc>::value, out.device());
    Acc* part = static_cast<Acc*>(partial.raw_data_ptr());
    reduce_chunks_kernel<T, Acc, Op><<<static_cast<unsigned>(p.outer * chunks), kThreads, 0, ctx.stream>>>(
        x, part, p.reduced, p.outer_stride, p.reduced_stride, chunks);
    check_launch("reduce (partial)");
    reduce_rows_kernel<Acc, Acc, Out, Op><<<static_cast<unsigned>(p.outer), kThreads, 0, ctx.stream>>>(
        part, o, p.outer, chunks, chunks, 1);
    check_launch("reduce");
    return;
  }
  if (p.inner == 1) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(p.outer, 65535LL * 16));
    reduce_rows_kernel<T, Acc, Out, Op><<<blocks, kThreads, 0, ctx.stream>>>(x, o, p.outer, p.reduced, p.outer_stride,
                                                                            p.reduced_stride);
  } else {
    reduce_columns_kernel<T, Acc, Out, Op><<<grid_for(p.outer * p.inner, kThreads, ctx.sms), kThreads, 0, ctx.stream>>>(
        x, o, p.outer, p.reduced, p.inner, p.outer_stride, p.reduced_stride, p.inner_stride);
  }
  check_launch("reduce");
}

template <ReduceOp Op>
void reduce_dispatch(const Tensor& out, const Tensor& in, const sh::ReductionPlan& p) {
  CHORUS_DISPATCH_ALL(in.dtype(), "reduce", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T> || sh::is_reduced_float_v<T>) {
      // (float16/bfloat16 as stored, rounded once at the end: the cpu kernel's bits)
      using Acc = std::conditional_t<(Op == ReduceOp::Sum || Op == ReduceOp::Prod), double, sh::opmath_t<T>>;
      reduce_launch<T, Acc, T, Op>(out, in, p);
    } else if constexpr (Op == ReduceOp::Sum || Op == ReduceOp::Prod) {
      reduce_launch<T, int64_t, int64_t, Op>(out, in, p);
    } else if constexpr (std::is_same_v<T, bool>) {
      reduce_launch<T, int, bool, Op>(out, in, p);
    } else {
      reduce_launch<T, T, T, Op>(out, in, p);
    }
  });
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<int64_t>& dims) {
  if (out.numel() == 0) return;
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  sh::ReductionPlan plan = sh::plan_reduction(in.sizes(), in.strides(), sorted);
  Tensor src = in;
  if (plan.needs_copy) {  // kept dims in order, then reduced dims, densely
    Shape s;
    Strides st;
    for (int64_t d : plan.permutation) {
      s.push_back(in.sizes()[d]);
      st.push_back(in.strides()[d]);
    }
    src = make_tensor(s, in.dtype(), in.device());
    copy(src, restrided(in, s, st));
  }
  Tensor dense_out = out.is_contiguous() ? out : empty_like_dense(out);
  switch (op) {
    case ReduceOp::Sum: reduce_dispatch<ReduceOp::Sum>(dense_out, src, plan); break;
    case ReduceOp::Prod: reduce_dispatch<ReduceOp::Prod>(dense_out, src, plan); break;
    case ReduceOp::Max: reduce_dispatch<ReduceOp::Max>(dense_out, src, plan); break;
    case ReduceOp::Min: reduce_dispatch<ReduceOp::Min>(dense_out, src, plan); break;
  }
  if (!dense_out.is_same(out)) copy(out, dense_out);
}

namespace {

// `t` with `dim` moved last (a view), and that view's sizes.
Tensor dim_last_view(const Tensor& t, int64_t dim) {
  Shape s = t.sizes();
  Strides st = t.strides();
  s.erase(s.begin() + dim);
  st.erase(st.begin() + dim);
  s.push_back(t.sizes()[dim]);
  st.push_back(t.strides()[dim]);
  return restrided(t, s, st);
}
// The same, densely copied unless it already is dense.
Tensor dim_last_dense(const Tensor& t, int64_t dim, int64_t& rows, int64_t& cols) {
  cols = t.sizes()[dim];
  rows = cols == 0 ? 0 : t.numel() / cols;
  Tensor v = dim_last_view(t, dim);
  if (v.is_contiguous()) return v;
  Tensor d = empty_like_dense(v);
  copy(d, v);
  return d;
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535LL * 16)); }

// (value, index) pairs: NaN beats everything (the first NaN wins), then the better value, then the
// smaller index, so the result is the cpu kernel's first extremum.
template <typename T>
struct ArgBest {
  bool is_max;
  __device__ __forceinline__ bool better(T v, int64_t i, T best, int64_t best_i) const {
    if constexpr (std::is_floating_point_v<T>) {
      const bool vn = v != v, bn = best != best;
      if (vn || bn) return vn && (!bn || i < best_i);
    }
    if (v == best) return i < best_i;
    return is_max ? v > best : v < best;
  }
};

template <typename T>
__global__ void arg_reduce_kernel(const T* in, T* values, int64_t* indices, int64_t rows, int64_t cols, bool is_max) {
  __shared__ T vbuf[kThreads];
  __shared__ int64_t ibuf[kThreads];
  const ArgBest<T> arg{is_max};
  for (int64_t m = blockIdx.x; m < rows; m += gridDim.x) {
    const T* row = in + m * cols;
    T best = row[0];
    int64_t best_i = 0;
    for (int64_t r = threadIdx.x; r < cols; r += blockDim.x) {
      if (arg.better(row[r], r, best, best_i)) {
        best = row[r];
        best_i = r;
      }
    }
    vbuf[threadIdx.x] = best;
    ibuf[threadIdx.x] = best_i;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s && arg.better(vbuf[threadIdx.x + s], ibuf[threadIdx.x + s], vbuf[threadIdx.x], ibuf[threadIdx.x])) {
        vbuf[threadIdx.x] = vbuf[threadIdx.x + s];
        ibuf[threadIdx.x] = ibuf[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      values[m] = vbuf[0];
      indices[m] = ibuf[0];
    }
    __syncthreads();
  }
}

// Softmax rows ([Row kernels] in kernels/shared/row_plan.h): accumulation in opmath (float for
// float32, double for float64); the maximum ignores NaN and an all -inf row uses 0 for it, as the cpu
// kernel. Warp kernel: the row in registers, max then sum over them, one read and one write.
template <typename T, int V, int N>
__global__ void softmax_warp_kernel(const T* in, T* out, int64_t rows, int64_t cols, int lanes, bool log) {
  using Acc = sh::opmath_t<T>;
  const sh::Exp exp_;
  const int group = sh::warp_row_in_block(threadIdx.x, lanes), lane = sh::warp_lane(threadIdx.x, lanes);
  const int64_t per_block = blockDim.x / lanes;
  // Every thread runs the same iterations (the shuffles need the whole warp); rows past the end
  // load nothing and store nothing.
  for (int64_t first = blockIdx.x * per_block; first < rows; first += gridDim.x * per_block) {
    const int64_t row = first + group;
    const bool active = row < rows;
    Acc v[N][V];
    Acc mx = row_kernels::neg_inf<Acc>();
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (active && c < cols) {
        row_kernels::load<V>(in + row * cols + c, v[j]);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) v[j][i] = row_kernels::neg_inf<Acc>();
      }
#pragma unroll
      for (int i = 0; i < V; ++i) mx = v[j][i] > mx ? v[j][i] : mx;
    }
    mx = row_kernels::warp_allreduce(mx, row_kernels::Max{}, lanes);
    if (mx == row_kernels::neg_inf<Acc>()) mx = 0;  // all -inf: avoid inf - inf
    Acc sum = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc e = exp_(v[j][i] - mx);  // 0 for the padding (-inf)
        if (!log) v[j][i] = e;
        sum += e;
      }
    }
    sum = row_kernels::warp_allreduce(sum, row_kernels::Sum{}, lanes);
    const Acc scale = log ? sh::Log{}(sum) : Acc(1) / sum;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (!active || c >= cols) continue;
#pragma unroll
      for (int i = 0; i < V; ++i) v[j][i] = log ? (v[j][i] - mx) - scale : v[j][i] * scale;
      row_kernels::store<V>(out + row * cols + c, v[j]);
    }
  }
}

// Block kernel: one block per row; online max and sum in one pass (the row copied into shared memory
// on the way when `cache`), then one pass that writes, reading the cache (each thread reads back
// the vectors it cached itself: no barrier needed) or the row again.
template <typename T, int V>
__global__ void softmax_block_kernel(const T* in, T* out, int64_t rows, int64_t cols, bool cache, bool log) {
  using Acc = sh::opmath_t<T>;
  extern __shared__ __align__(16) unsigned char row_cache[];
  __shared__ row_kernels::Pair<Acc> buf[32];
  T* cached = reinterpret_cast<T*>(row_cache);
  const sh::Exp exp_;
  const int64_t vectors = cols / V;  // V divides cols when V > 1
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * cols;
    row_kernels::Pair<Acc> st{row_kernels::neg_inf<Acc>(), Acc(0)};
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= vectors * V) break;
      T raw[V];
      row_kernels::load_raw<V>(x + c, raw);
      if (cache) row_kernels::store_raw<V>(cached + c, raw);
#pragma unroll
      for (int i = 0; i < V; ++i) row_kernels::online_add(st, sh::to_opmath(raw[i]));
    }
    st = row_kernels::block_allreduce(st, row_kernels::MaxSum{}, buf);
    const Acc mx = st.a == row_kernels::neg_inf<Acc>() ? Acc(0) : st.a;
    const Acc scale = log ? sh::Log{}(st.b) : Acc(1) / st.b;
    const T* src = cache ? cached : x;
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= vectors * V) break;
      Acc v[V];
      row_kernels::load<V>(src + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = log ? (v[i] - mx) - scale : exp_(v[i] - mx) * scale;
      row_kernels::store<V>(out + row * cols + c, v);
    }
  }
}

// Backward: gi = y * (g - sum(g * y)) for softmax, g - exp(y) * sum(g) for log_softmax (y the
// forward's output), the row sum in opmath.
template <typename T, int V, int N>
__global__ void softmax_backward_warp_kernel(const T* g, const T* y, T* gi, int64_t rows, int64_t cols, int lanes,
                                             bool log) {
  using Acc = sh::opmath_t<T>;
  const sh::Exp exp_;
  const int group = sh::warp_row_in_block(threadIdx.x, lanes), lane = sh::warp_lane(threadIdx.x, lanes);
  const int64_t per_block = blockDim.x / lanes;
  for (int64_t first = blockIdx.x * per_block; first < rows; first += gridDim.x * per_block) {
    const int64_t row = first + group;
    const bool active = row < rows;
    Acc gv[N][V], yv[N][V];
    Acc acc = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (active && c < cols) {
        row_kernels::load<V>(g + row * cols + c, gv[j]);
        row_kernels::load<V>(y + row * cols + c, yv[j]);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) gv[j][i] = yv[j][i] = 0;
      }
#pragma unroll
      for (int i = 0; i < V; ++i) acc += log ? gv[j][i] : gv[j][i] * yv[j][i];
    }
    acc = row_kernels::warp_allreduce(acc, row_kernels::Sum{}, lanes);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t c = sh::warp_column(lane, j, lanes, V);
      if (!active || c >= cols) continue;
#pragma unroll
      for (int i = 0; i < V; ++i) gv[j][i] = log ? gv[j][i] - exp_(yv[j][i]) * acc : yv[j][i] * (gv[j][i] - acc);
      row_kernels::store<V>(gi + row * cols + c, gv[j]);
    }
  }
}

template <typename T, int V>
__global__ void softmax_backward_block_kernel(const T* g, const T* y, T* gi, int64_t rows, int64_t cols, bool cache,
                                              bool log) {
  using Acc = sh::opmath_t<T>;
  extern __shared__ __align__(16) unsigned char row_cache[];
  __shared__ Acc buf[32];
  T* cached_g = reinterpret_cast<T*>(row_cache);
  T* cached_y = cached_g + cols;
  const sh::Exp exp_;
  const int64_t end = cols / V * V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gr = g + row * cols;
    const T* yr = y + row * cols;
    Acc acc = 0;
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= end) break;
      T graw[V], yraw[V];
      row_kernels::load_raw<V>(gr + c, graw);
      row_kernels::load_raw<V>(yr + c, yraw);
      if (cache) {
        row_kernels::store_raw<V>(cached_g + c, graw);
        row_kernels::store_raw<V>(cached_y + c, yraw);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) acc += log ? sh::to_opmath(graw[i]) : sh::to_opmath(graw[i]) * sh::to_opmath(yraw[i]);
    }
    acc = row_kernels::block_allreduce(acc, row_kernels::Sum{}, buf);
    for (int64_t k = 0;; ++k) {
      const int64_t c = sh::block_column(threadIdx.x, k, blockDim.x, V);
      if (c >= end) break;
      Acc gv[V], yv[V];
      row_kernels::load<V>((cache ? cached_g : gr) + c, gv);
      row_kernels::load<V>((cache ? cached_y : yr) + c, yv);
#pragma unroll
      for (int i = 0; i < V; ++i) gv[i] = log ? gv[i] - exp_(yv[i]) * acc : yv[i] * (gv[i] - acc);
      row_kernels::store<V>(gi + row * cols + c, gv);
    }
  }
}

// The row plan of a softmax over `arrays` (their data addresses decide the vector width).
sh::RowPlan softmax_plan(int64_t rows, int64_t cols, const Tensor& like, std::initializer_list<const Tensor*> arrays,
                         int sms) {
  sh::RowProblem problem{.rows = rows, .cols = cols, .element_size_bytes = static_cast<int64_t>(like.element_size()),
                         .row_inputs = static_cast<int>(arrays.size()) - 1, .addresses = {}, .sms = sms};
  for (const Tensor* t : arrays) problem.addresses.push_back(row_kernels::address_of(t->raw_data_ptr()));
  return sh::plan_rows(problem);
}

}  // namespace

void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  int64_t rows, cols;
  Tensor x = dim_last_dense(in, dim, rows, cols);
  if (rows == 0) return;
  Tensor vals = values.is_contiguous() ? values : empty_like_dense(values);
  Tensor idx = indices.is_contiguous() ? indices : empty_like_dense(indices);
  CHORUS_DISPATCH_COMPUTE(in.dtype(), is_max ? "max" : "min", [&]<typename T>() {
    LaunchContext ctx(in.device());
    arg_reduce_kernel<T><<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
        static_cast<const T*>(x.raw_data_ptr()), static_cast<T*>(vals.raw_data_ptr()),
        static_cast<int64_t*>(idx.raw_data_ptr()), rows, cols, is_max);
    check_launch(is_max ? "argmax" : "argmin");
  });
  if (!vals.is_same(values)) copy(values, vals);
  if (!idx.is_same(indices)) copy(indices, idx);
}

void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) {
  int64_t rows, cols;
  Tensor x = dim_last_dense(in, dim, rows, cols);
  if (rows == 0) return;
  // [Rows written in place] The kernel writes `out` itself when its rows are dense (the usual case:
  // the last dim of a fresh tensor), else a dense temporary copied into it after. Until 2026-12-01
  // it always wrote a temporary and copied: a second read and write of the whole tensor, which is
  // what held softmax at 0.46-0.50 of a device-to-device copy on the H100 and H200 (PyTorch 0.90-0.98).
  const Tensor out_rows = dim_last_view(out, dim);
  Tensor y = out_rows.is_contiguous() ? out_rows : empty_like_dense(x);
  sh::dispatch_float_storage(in, log ? "log_softmax" : "softmax", {}, [&]<typename T, typename>() {
    LaunchContext ctx(in.device());
    const sh::RowPlan plan = softmax_plan(rows, cols, x, {&x, &y}, ctx.sms);
    const T* px = static_cast<const T*>(x.raw_data_ptr());
    T* py = static_cast<T*>(y.raw_data_ptr());
    row_kernels::dispatch_row_shape<T>(plan, [&]<int V, int N>() {
      if (plan.kernel == sh::RowKernel::Warp) {
        softmax_warp_kernel<T, V, N><<<static_cast<unsigned>(plan.blocks), plan.threads, 0, ctx.stream>>>(
            px, py, rows, cols, plan.lanes, log);
      } else {
        softmax_block_kernel<T, V><<<static_cast<unsigned>(plan.blocks), plan.threads, plan.shared_bytes, ctx.stream>>>(
            px, py, rows, cols, plan.cache_in_shared, log);
      }
    });
    check_launch(log ? "log_softmax" : "softmax");
  });
  if (!y.is_same(out_rows)) copy(out_rows, y);
}

void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, int64_t dim, bool log) {
  int64_t rows, cols;
  Tensor g = dim_last_dense(grad_out, dim, rows, cols);
  Tensor y = dim_last_dense(out, dim, rows, cols);
  if (rows == 0) return;
  const Tensor grad_rows = dim_last_view(grad_in, dim);  // [Rows written in place], as softmax
  Tensor gi = grad_rows.is_contiguous() ? grad_rows : empty_like_dense(g);
  sh::dispatch_float_storage(out, "softmax_backward", {}, [&]<typename T, typename>() {
    LaunchContext ctx(out.device());
    const sh::RowPlan plan = softmax_plan(rows, cols, g, {&g, &y, &gi}, ctx.sms);
    const T* pg = static_cast<const T*>(g.raw_data_ptr());
    const T* py = static_cast<const T*>(y.raw_data_ptr());
    T* pi = static_cast<T*>(gi.raw_data_ptr());
    row_kernels::dispatch_row_shape<T>(plan, [&]<int V, int N>() {
      if (plan.kernel == sh::RowKernel::Warp) {
        softmax_backward_warp_kernel<T, V, N><<<static_cast<unsigned>(plan.blocks), plan.threads, 0, ctx.stream>>>(
            pg, py, pi, rows, cols, plan.lanes, log);
      } else {
        softmax_backward_block_kernel<T, V>
            <<<static_cast<unsigned>(plan.blocks), plan.threads, plan.shared_bytes, ctx.stream>>>(
                pg, py, pi, rows, cols, plan.cache_in_shared, log);
      }
    });
    check_launch("softmax_backward");
  });
  if (!gi.is_same(grad_rows)) copy(grad_rows, gi);
}

}  // namespace chorus::kernels::cuda_impl
