// Reductions (sum, prod, max, min over any dims), arg-reductions, and softmax. Every reduction is
// brought to one of two dense layouts without copying where strides allow:
//   rows:    out[m] = reduce_r in[m * row_stride + r]   (reduced dims innermost; e.g. sum(-1))
//   columns: out[m] = reduce_r in[r * col_stride + m]   (kept dims innermost; e.g. sum(0) of a bias
//            gradient) — vectorized over m, which reads memory in order;
// anything else is first copied into the row layout.
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "kernels/shared/reduce_math.h"

namespace chorus::kernels::cpu {
namespace {

Tensor restrided(const Tensor& t, const Shape& sizes, const Strides& strides) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset(), sizes, strides, t.dtype()));
}

Tensor dense_copy(const Tensor& t) {
  Tensor out = make_tensor(t.sizes(), t.dtype(), kCPU);
  copy(out, t);
  return out;
}


template <typename T, typename Acc, typename Out, ReduceOp Op>
void reduce_layout(const Tensor& out, const Tensor& in, int64_t M, int64_t R, int64_t sm, int64_t sr) {
  using Red = shared::ReduceRule<Acc, Op>;
  const T* x = static_cast<const T*>(in.raw_data_ptr());
  Out* o = static_cast<Out*>(out.raw_data_ptr());
  if (sr == 1 || R == 1) {
    // Rows. With few rows, split each row across threads and combine the partial results.
    if (M < num_threads() && R > kGrainSize) {
      for (int64_t m = 0; m < M; ++m) {
        const T* row = x + m * sm;
        const int chunks = num_threads();
        std::vector<Acc> partial(chunks, Red::identity());
        parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c) {
            Acc acc = Red::identity();
            const int64_t lo = R * c / chunks, hi = R * (c + 1) / chunks;
            for (int64_t r = lo; r < hi; ++r) acc = Red::combine(acc, static_cast<Acc>(row[r]));
            partial[c] = acc;
          }
        });
        Acc acc = Red::identity();
        for (Acc p : partial) acc = Red::combine(acc, p);
        o[m] = shared::Cast<Out>{}(acc);
      }
      return;
    }
    parallel_for(0, M, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(R, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t m = lo; m < hi; ++m) {
        const T* row = x + m * sm;
        Acc acc = Red::identity();
        if constexpr (Op == ReduceOp::Sum && std::is_floating_point_v<Acc>) {
          // Eight independent partial sums let the compiler vectorize the reduction.
          Acc lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t r = 0;
          for (; r + 8 <= R; r += 8)
            for (int j = 0; j < 8; ++j) lanes[j] += static_cast<Acc>(row[r + j]);
          for (; r < R; ++r) acc += static_cast<Acc>(row[r]);
          for (int j = 0; j < 8; ++j) acc += lanes[j];
        } else {
          for (int64_t r = 0; r < R; ++r) acc = Red::combine(acc, static_cast<Acc>(row[r]));
        }
        o[m] = shared::Cast<Out>{}(acc);
      }
    });
    return;
  }
  // Columns (sm == 1): accumulate row by row into a buffer of M accumulators.
  parallel_for(0, M, std::max<int64_t>(64, kGrainSize / std::max<int64_t>(R, 1)), [&](int64_t lo, int64_t hi) {
    std::vector<Acc> acc_buffer(static_cast<size_t>(hi - lo), Red::identity());
    Acc* acc = acc_buffer.data();
    for (int64_t r = 0; r < R; ++r) {
      const T* row = x + r * sr + lo;
      // One vector loop per row (a plain loop stayed scalar at -O2: 10x libtorch's time for a
      // bias gradient, the sum over 1024 rows of a [1024, 768] output gradient).
      simd_for(0, hi - lo, [&](int64_t m) CHORUS_ELEMENT { acc[m] = Red::combine(acc[m], static_cast<Acc>(row[m])); });
    }
    for (int64_t m = lo; m < hi; ++m) o[m] = shared::Cast<Out>{}(acc[m - lo]);
  });
}

template <ReduceOp Op>
void reduce_dispatch(const Tensor& out, const Tensor& in, int64_t M, int64_t R, int64_t sm, int64_t sr) {
  CHORUS_DISPATCH_ALL(in.dtype(), "reduce", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T> || shared::is_reduced_float_v<T>) {
      // Float sums and products accumulate in float64; max/min need no extra precision. float16/
      // bfloat16 are read as stored and the result rounded once (double to float to 16 bits): the
      // bits of reducing a float32 copy and casting the float32 result.
      using Acc = std::conditional_t<(Op == ReduceOp::Sum || Op == ReduceOp::Prod), double, shared::opmath_t<T>>;
      reduce_layout<T, Acc, T, Op>(out, in, M, R, sm, sr);
    } else if constexpr (Op == ReduceOp::Sum || Op == ReduceOp::Prod) {
      reduce_layout<T, int64_t, int64_t, Op>(out, in, M, R, sm, sr);
    } else if constexpr (std::is_same_v<T, bool>) {
      reduce_layout<T, int, bool, Op>(out, in, M, R, sm, sr);
    } else {
      reduce_layout<T, T, T, Op>(out, in, M, R, sm, sr);
    }
  });
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<int64_t>& dims) {
  const int64_t nd = in.dim();
  std::vector<bool> reduced(nd, false);
  for (int64_t d : dims) reduced[d] = true;
  Shape psizes;
  Strides pstrides;
  int64_t M = 1, R = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!reduced[d]) { psizes.push_back(in.sizes()[d]); pstrides.push_back(in.strides()[d]); M *= in.sizes()[d]; }
  for (int64_t d = 0; d < nd; ++d)
    if (reduced[d]) { psizes.push_back(in.sizes()[d]); pstrides.push_back(in.strides()[d]); R *= in.sizes()[d]; }
  if (M == 0) return;
  Tensor src = restrided(in, psizes, pstrides);
  Strides mr;
  int64_t sm = 0, sr = 0;
  const bool viewable = compute_view_strides(psizes, pstrides, {M, R}, mr);
  if (viewable) {
    sm = mr[0];
    sr = mr[1];
  }
  const bool rows = viewable && (sr == 1 || R == 1);
  const bool columns = viewable && !rows && (sm == 1 || M == 1);
  if (!rows && !columns) {
    src = dense_copy(src);
    sm = R;
    sr = 1;
  }
  Tensor dense_out = out.is_contiguous() ? out : make_tensor(out.sizes(), out.dtype(), kCPU);
  switch (op) {
    case ReduceOp::Sum: reduce_dispatch<ReduceOp::Sum>(dense_out, src, M, R, sm, sr); break;
    case ReduceOp::Prod: reduce_dispatch<ReduceOp::Prod>(dense_out, src, M, R, sm, sr); break;
    case ReduceOp::Max: reduce_dispatch<ReduceOp::Max>(dense_out, src, M, R, sm, sr); break;
    case ReduceOp::Min: reduce_dispatch<ReduceOp::Min>(dense_out, src, M, R, sm, sr); break;
  }
  if (!dense_out.is_same(out)) copy(out, dense_out);
}

namespace {
// `t` viewed with `dim` moved last.
Tensor dim_last_view(const Tensor& t, int64_t dim) {
  Shape s = t.sizes();
  Strides st = t.strides();
  s.erase(s.begin() + dim);
  st.erase(st.begin() + dim);
  s.push_back(t.sizes()[dim]);
  st.push_back(t.strides()[dim]);
  return restrided(t, s, st);
}

// `in` with `dim` moved last, densely copied unless it already is dense in that layout.
Tensor dim_last_dense(const Tensor& in, int64_t dim, int64_t& M, int64_t& R) {
  R = in.sizes()[dim];
  M = R == 0 ? 0 : in.numel() / R;
  Tensor v = dim_last_view(in, dim);
  return v.is_contiguous() ? v : dense_copy(v);
}

// Where a kernel writes `out` with `dim` moved last: that view itself when it is dense, else a fresh
// dense tensor that the caller copies into `view` afterwards.
Tensor dim_last_output(const Tensor& out, int64_t dim, Tensor& view) {
  view = dim_last_view(out, dim);
  return view.is_contiguous() ? view : make_tensor(view.sizes(), view.dtype(), kCPU);
}
}  // namespace

void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  int64_t M, R;
  Tensor x = dim_last_dense(in, dim, M, R);
  Tensor vals = values.is_contiguous() ? values : make_tensor(values.sizes(), values.dtype(), kCPU);
  Tensor idx = indices.is_contiguous() ? indices : make_tensor(indices.sizes(), kInt64, kCPU);
  CHORUS_DISPATCH_COMPUTE(in.dtype(), is_max ? "max" : "min", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* pv = vals.data_ptr<T>();
    int64_t* pi = idx.data_ptr<int64_t>();
    parallel_for(0, M, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(R, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t m = lo; m < hi; ++m) {
        const T* row = px + m * R;
        T best = row[0];
        int64_t best_i = 0;
        for (int64_t r = 1; r < R; ++r) {
          T v = row[r];
          bool better;
          if constexpr (std::is_floating_point_v<T>) {
            if (best != best) break;  // NaN already found: it is the answer
            better = (v != v) || (is_max ? v > best : v < best);
          } else {
            better = is_max ? v > best : v < best;
          }
          if (better) { best = v; best_i = r; }
        }
        pv[m] = best;
        pi[m] = best_i;
      }
    });
  });
  if (!vals.is_same(values)) copy(values, vals);
  if (!idx.is_same(indices)) copy(indices, idx);
}

void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) {
  int64_t M, R;
  Tensor x = dim_last_dense(in, dim, M, R);
  Tensor out_view;
  Tensor y = dim_last_output(out, dim, out_view);
  dispatch_float_storage(in, log ? "log_softmax" : "softmax", {}, [&]<typename T, typename P>() {
    const T* px = x.data_ptr<T>();
    T* py = y.data_ptr<T>();
    parallel_for(0, M, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(R, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<P> xbuf, ybuf;  // 16-bit rows at float (loops.h, widened_row)
      for (int64_t m = lo; m < hi; ++m) {
        const P* row = widened_row(px + m * R, R, xbuf);
        P* orow = row_out(py + m * R, R, ybuf);
        P mx = simd_max<P>(0, R, -std::numeric_limits<P>::infinity(), [&](int64_t r) CHORUS_ELEMENT { return row[r]; });
        if (mx == -std::numeric_limits<P>::infinity()) mx = 0;  // all -inf: avoid inf - inf
        double sum = 0;
        // The exp loops are vector loops (libmvec, vector_math.h); the sums in double, in lanes.
        if (log) {
          sum = simd_sum<double>(0, R, [&](int64_t r) CHORUS_ELEMENT { return std::exp(row[r] - mx); });
          // (x - max) - log(sum), in this order, as PyTorch: folding max + log(sum) first rounds to
          // the spacing of max (about 1e-3 at 1e4 in float32) and loses every digit below it.
          const P log_sum = static_cast<P>(std::log(sum));
          simd_for(0, R, [&](int64_t r) CHORUS_ELEMENT { orow[r] = (row[r] - mx) - log_sum; });
        } else {
          simd_for(0, R, [&](int64_t r) CHORUS_ELEMENT { orow[r] = std::exp(row[r] - mx); });
          sum = simd_sum<double>(0, R, [&](int64_t r) CHORUS_ELEMENT { return orow[r]; });
          P inv = static_cast<P>(1.0 / sum);
          simd_for(0, R, [&](int64_t r) CHORUS_ELEMENT { orow[r] *= inv; });
        }
        store_row(py + m * R, orow, R);
      }
    });
  });
  if (!y.is_same(out_view)) copy(out_view, y);
}

void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, int64_t dim, bool log) {
  int64_t M, R;
  Tensor g = dim_last_dense(grad_out, dim, M, R);
  Tensor y = dim_last_dense(out, dim, M, R);
  Tensor in_view;
  Tensor gi = dim_last_output(grad_in, dim, in_view);
  dispatch_float_storage(out, "softmax_backward", {}, [&]<typename T, typename P>() {
    const T* pg = g.data_ptr<T>();
    const T* py = y.data_ptr<T>();
    T* pi = gi.data_ptr<T>();
    parallel_for(0, M, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(R, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<P> gbuf, ybuf, ibuf;
      for (int64_t m = lo; m < hi; ++m) {
        const P* gr = widened_row(pg + m * R, R, gbuf);
        const P* yr = widened_row(py + m * R, R, ybuf);
        P* ir = row_out(pi + m * R, R, ibuf);
        if (log) {
          const P total = static_cast<P>(simd_sum<double>(0, R, [&](int64_t r) CHORUS_ELEMENT { return gr[r]; }));
          simd_for(0, R, [&](int64_t r) CHORUS_ELEMENT { ir[r] = gr[r] - std::exp(yr[r]) * total; });
        } else {
          const P dot = static_cast<P>(
              simd_sum<double>(0, R, [&](int64_t r) CHORUS_ELEMENT { return static_cast<double>(gr[r]) * yr[r]; }));
          simd_for(0, R, [&](int64_t r) CHORUS_ELEMENT { ir[r] = yr[r] * (gr[r] - dot); });
        }
        store_row(pi + m * R, ir, R);
      }
    });
  });
  if (!gi.is_same(in_view)) copy(in_view, gi);
}

}  // namespace chorus::kernels::cpu
