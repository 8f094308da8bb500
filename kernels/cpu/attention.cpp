// Scaled-dot-product attention in one pass per block of query rows on the CPU, float32: [Fused CPU
// attention] in nn/functional/attention.cpp says when it runs, what it saves and what it equals. A
// block's scores live in a per-thread buffer of at most 64 K floats (all of a head's at BERT's 128
// tokens; 64 rows at GPT-2's 1024) from the product that makes them to the product that consumes
// them, where the composite passes each of its [B, H, L, S] tensors through memory once per op. With
// is_causal a block of rows r0..r1-1 multiplies only the keys 0..r1-1 it may attend to: about half
// of the composite's products at long sequences. [No header] (gemm.cpp): the caller declares these.
#include <cmath>
#include <limits>
#include <memory>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace chorus::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Matrix i of t [batch..., rows, cols] (its batch dims flattened in row-major order), as a 2-D view.
Tensor matrix(const Tensor& t, int64_t i) {
  const int64_t nd = t.dim();
  int64_t offset = t.storage_offset();
  for (int64_t d = nd - 3; d >= 0; --d) {
    const int64_t size = t.size(d);
    offset += (i % size) * t.stride(d);
    i /= size;
  }
  return Tensor(std::make_shared<TensorImpl>(t.storage(), offset, Shape{t.size(-2), t.size(-1)},
                                             Strides{t.stride(-2), t.stride(-1)}, t.dtype()));
}

Tensor transposed(const Tensor& m) {
  return Tensor(std::make_shared<TensorImpl>(m.storage(), m.storage_offset(), Shape{m.size(1), m.size(0)},
                                             Strides{m.stride(1), m.stride(0)}, m.dtype()));
}

float* f32(const Tensor& t) { return static_cast<float*>(t.raw_data_ptr()); }

// How many matrices t [batch..., rows, cols] holds (its batch dims' product; 1 for a 2-D t).
int64_t matrices(const Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 0; d + 2 < t.dim(); ++d) n *= t.size(d);
  return n;
}

// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of a 2-D view.
Tensor block(const Tensor& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  return Tensor(std::make_shared<TensorImpl>(m.storage(), m.storage_offset() + r0 * m.stride(0) + c0 * m.stride(1),
                                             Shape{rows, cols}, Strides{m.stride(0), m.stride(1)}, m.dtype()));
}

void fill_rows(const Tensor& m, float value) {
  for (int64_t r = 0; r < m.size(0); ++r) std::fill_n(f32(m) + r * m.stride(0), m.size(1), value);
}

// Per-thread work space of `rows` x S: a block's scores (then the gradient of its weights) and its
// weights after dropout.
struct Scratch {
  Tensor scores, dropped;
  Scratch(int64_t rows, int64_t S)
      : scores(make_tensor({rows, S}, kFloat32, kCPU)), dropped(make_tensor({rows, S}, kFloat32, kCPU)) {}
};

// Query rows per block: a block's scores at most 64 K floats (256 KiB), at least 16 rows.
int64_t block_rows(int64_t L, int64_t S) { return std::min(L, std::max<int64_t>(16, 65536 / std::max<int64_t>(S, 1))); }

// The keys a block of rows [r0, r1) multiplies: all S, or with is_causal the first r1 (row r
// attends to keys 0..r, top-left aligned as PyTorch's is_causal).
int64_t block_keys(bool causal, int64_t r1, int64_t S) { return causal ? std::min(r1, S) : S; }

// Heads one per thread when there are enough of them and each is small (as bmm does), or when
// there are at least 4 per thread (GPT-2's 24 heads of 1024 x 1024 scores on 2 threads: 84-86 ms
// against 131-147 with the heads in turn, docs/data/fused_attention_2026-12-02.txt), else in turn
// with every thread inside the products (the row passes then run on one).
template <typename F>
void for_each_head(int64_t heads, int64_t flops_per_head, int64_t rows, int64_t S, const F& f) {
  if ((heads >= num_threads() && flops_per_head < (int64_t{1} << 22)) || heads >= 4 * num_threads()) {
    parallel_for(0, heads, 1, [&](int64_t lo, int64_t hi) {
      Scratch scratch(rows, S);
      for (int64_t i = lo; i < hi; ++i) f(i, scratch);
    });
  } else {
    Scratch scratch(rows, S);
    for (int64_t i = 0; i < heads; ++i) f(i, scratch);
  }
}

}  // namespace

// q [n..., L, E], k [n..., S, E], v [n..., S, Ev] (one batch shape, unit last stride); mask
// undefined or float32 [n..., L, S] (any strides: an expanded view); drop undefined or the dropout
// multipliers [n..., L, S] (0 or 1/(1-p), dense); probs undefined or dense [n..., L, S], where the
// softmax weights are kept for the backward (with is_causal only the columns each block computed:
// the backward reads no others); out [n..., L, Ev].
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                       double scale, const Tensor& drop, const Tensor& out, const Tensor& probs) {
  const int64_t L = q.size(-2), E = q.size(-1), S = k.size(-2), Ev = v.size(-1);
  const int64_t heads = matrices(q);
  if (heads == 0 || L == 0) return;
  const int64_t rows = block_rows(L, S);
  sync_eigen_threads();
  for_each_head(heads, L * S * (E + Ev), rows, S, [&](int64_t i, Scratch& scratch) {
    const Tensor qi = matrix(q, i), ki = matrix(k, i), vi = matrix(v, i), oi = matrix(out, i);
    if (S == 0) {  // no keys: softmax over nothing, as the composite's empty product gives zeros
      fill_rows(oi, 0.0f);
      return;
    }
    const Tensor mi = mask.defined() ? matrix(mask, i) : Tensor();
    const Tensor pi = probs.defined() ? matrix(probs, i) : Tensor();
    const Tensor di = drop.defined() ? matrix(drop, i) : Tensor();
    for (int64_t r0 = 0; r0 < L; r0 += rows) {
      const int64_t n = std::min(rows, L - r0), keys = block_keys(causal, r0 + n, S);
      const Tensor scores = block(scratch.scores, 0, n, 0, keys);
      // The scale as the product's alpha: (q * scale) k^T rounded as the composite's when the scale
      // is a power of two (head dims 4, 16, 64, 256), within a rounding otherwise.
      gemm(scores, block(qi, r0, n, 0, E), transposed(block(ki, 0, keys, 0, E)), scale, 0.0);
      const Tensor weights = pi.defined() ? block(pi, r0, n, 0, keys) : scores;
      for (int64_t r = 0; r < n; ++r) {
        float* s = f32(scores) + r * scores.stride(0);
        float* w = f32(weights) + r * weights.stride(0);
        if (mi.defined()) {
          const float* m = f32(mi) + (r0 + r) * mi.stride(0);
          const int64_t cs = mi.stride(1);
          if (cs == 1) simd_for(0, keys, [&](int64_t j) CHORUS_ELEMENT { s[j] += m[j]; });
          else for (int64_t j = 0; j < keys; ++j) s[j] += m[j * cs];
        }
        if (causal) std::fill(s + std::min(r0 + r + 1, keys), s + keys, kNegInf);  // key j > query r
        const float mx = simd_max<float>(0, keys, kNegInf, [&](int64_t j) CHORUS_ELEMENT { return s[j]; });
        if (mx == kNegInf) {
          // [Fully masked rows] no key allowed: zero weights, so a zero output row and no gradient,
          // as the composite's masked_fill and PyTorch's math backend (2.5 and later).
          std::fill_n(w, keys, 0.0f);
        } else {
          // kernels/cpu/reduce.cpp's softmax, the same operations in the same order.
          simd_for(0, keys, [&](int64_t j) CHORUS_ELEMENT { w[j] = std::exp(s[j] - mx); });
          const double sum = simd_sum<double>(0, keys, [&](int64_t j) CHORUS_ELEMENT { return w[j]; });
          const float inv = static_cast<float>(1.0 / sum);
          simd_for(0, keys, [&](int64_t j) CHORUS_ELEMENT { w[j] *= inv; });
        }
        if (di.defined()) {
          const float* d = f32(di) + (r0 + r) * di.stride(0);
          float* o = f32(scratch.dropped) + r * S;
          simd_for(0, keys, [&](int64_t j) CHORUS_ELEMENT { o[j] = w[j] * d[j]; });
        }
      }
      const Tensor used = di.defined() ? block(scratch.dropped, 0, n, 0, keys) : weights;
      gemm(block(oi, r0, n, 0, Ev), used, block(vi, 0, keys, 0, Ev), 1.0, 0.0);
    }
  });
}

// The gradients of attention_forward's q, k and v (each [n..., rows, cols] with unit last stride)
// from the output's, with the weights it kept (probs) and its dropout multipliers.
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const Tensor& drop, bool causal, double scale, const Tensor& grad_q,
                        const Tensor& grad_k, const Tensor& grad_v) {
  const int64_t L = q.size(-2), E = q.size(-1), S = k.size(-2), Ev = v.size(-1);
  const int64_t heads = matrices(q);
  if (heads == 0) return;
  const int64_t rows = std::max<int64_t>(1, block_rows(L, S));
  sync_eigen_threads();
  for_each_head(heads, 2 * L * S * (E + Ev), rows, S, [&](int64_t i, Scratch& scratch) {
    const Tensor dqi = matrix(grad_q, i), dki = matrix(grad_k, i), dvi = matrix(grad_v, i);
    fill_rows(dki, 0.0f);  // summed over the blocks (a causal block reaches only its first keys)
    fill_rows(dvi, 0.0f);
    if (S == 0 || L == 0) {
      fill_rows(dqi, 0.0f);
      return;
    }
    const Tensor doi = matrix(grad_out, i), pi = matrix(probs, i), qi = matrix(q, i), ki = matrix(k, i),
                 vi = matrix(v, i);
    const Tensor di = drop.defined() ? matrix(drop, i) : Tensor();
    for (int64_t r0 = 0; r0 < L; r0 += rows) {
      const int64_t n = std::min(rows, L - r0), keys = block_keys(causal, r0 + n, S);
      const Tensor p = block(pi, r0, n, 0, keys), dob = block(doi, r0, n, 0, Ev);
      // The weights after dropout, as the forward multiplied them, and the value's gradient.
      Tensor used = p;
      if (di.defined()) {
        used = block(scratch.dropped, 0, n, 0, keys);
        for (int64_t r = 0; r < n; ++r) {
          const float* pr = f32(p) + r * p.stride(0);
          const float* d = f32(di) + (r0 + r) * di.stride(0);
          float* o = f32(used) + r * used.stride(0);
          simd_for(0, keys, [&](int64_t j) CHORUS_ELEMENT { o[j] = pr[j] * d[j]; });
        }
      }
      gemm(block(dvi, 0, keys, 0, Ev), transposed(used), dob, 1.0, 1.0);
      // The gradient of the weights after dropout, then of the weights, then of the scores
      // (kernels/cpu/reduce.cpp's softmax_backward), in place in the scores buffer.
      const Tensor g = block(scratch.scores, 0, n, 0, keys);
      gemm(g, dob, transposed(block(vi, 0, keys, 0, Ev)), 1.0, 0.0);
      for (int64_t r = 0; r < n; ++r) {
        float* gr = f32(g) + r * g.stride(0);
        const float* y = f32(p) + r * p.stride(0);
        if (di.defined()) {
          const float* d = f32(di) + (r0 + r) * di.stride(0);
          simd_for(0, keys, [&](int64_t j) CHORUS_ELEMENT { gr[j] *= d[j]; });
        }
        const float dot = static_cast<float>(
            simd_sum<double>(0, keys, [&](int64_t j) CHORUS_ELEMENT { return static_cast<double>(gr[j]) * y[j]; }));
        simd_for(0, keys, [&](int64_t j) CHORUS_ELEMENT { gr[j] = y[j] * (gr[j] - dot); });
      }
      // scores = scale * q k^T: both gradients through the scale (alpha, as in the forward).
      gemm(block(dki, 0, keys, 0, E), transposed(g), block(qi, r0, n, 0, E), scale, 1.0);
      gemm(block(dqi, r0, n, 0, E), g, block(ki, 0, keys, 0, E), scale, 0.0);
    }
  });
}

}  // namespace chorus::kernels::cpu
