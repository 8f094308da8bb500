// scaled_dot_product_attention as a composite of differentiable ops (matmul, mask, softmax,
// dropout, matmul): autograd derives the backward, and every device that has those kernels (cpu,
// sim, cuda) runs it without kernels of its own.
#include "nn/functional/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops/common.h"
#include "autograd/ops/linalg.h"
#include "nn/functional/basic.h"
#include "tensor/ops.h"

// [No header] (kernels/cpu/gemm.cpp): declared where they are used. kernels/cpu/attention.cpp.
namespace chorus::kernels::cpu {
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                       double scale, const Tensor& drop, const Tensor& out, const Tensor& probs);
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const Tensor& drop, bool causal, double scale, const Tensor& grad_q,
                        const Tensor& grad_k, const Tensor& grad_v);
}  // namespace chorus::kernels::cpu

namespace chorus::nn::functional {
// nn/functional/basic.cpp: [Dropout mask in one pass].
Tensor dropout_multipliers(const Shape& shape, double p, Generator* generator, Device device);

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

Shape leading(const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - 2); }

// NumPy broadcast of two batch shapes, or false when they do not broadcast.
bool broadcast_batch(const Shape& a, const Shape& b, Shape& out) {
  const size_t n = std::max(a.size(), b.size());
  out.assign(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) return false;
    out[i] = x == 1 ? y : x;
  }
  return true;
}

std::string shapes_given(const Tensor& q, const Tensor& k, const Tensor& v) {
  return fmt::format("query {}, key {}, value {}", shape_str(q.sizes()), shape_str(k.sizes()), shape_str(v.sizes()));
}

// [Fused CPU attention] On the CPU, for float32 query, key and value with one batch shape (no
// broadcasting between them) and unit last strides, an additive mask that needs no gradient (a
// boolean one becomes 0 / -inf, which adds exactly as where() selects), or is_causal, and dropout
// below 1: each head in one pass (kernels/cpu/attention.cpp) instead of the composite's ops over the
// whole [..., L, S] scores (scale, product, mask add, softmax, dropout draw and multiply, product;
// and their backward). The same arithmetic in the same order but for the scale, which multiplies
// the product (its alpha) instead of the query (the same bits when it is a power of two, as at head
// dims 4, 16, 64 and 256): the products through chorus's CPU GEMM, reduce.cpp's softmax and softmax
// backward, the dropout multipliers from the same generator draws (dropout_multipliers). So the
// same values as the composite up to the products' rounding (attention_test compares the two).
// Saved for the backward: q, k, v, the softmax weights and the dropout multipliers ([..., L, S]
// each; the composite keeps the scores' product operands, the weights, the mask and the weights
// after dropout). Where it runs by default: is_causal where a head's scores are more than one
// block (L * S > 64 K floats, kernels/cpu/attention.cpp), that is long causal sequences, whose
// blocks skip the keys they may not attend to (GPT-2's attention at 2 x 1024 tokens 1.8x faster
// than the composite). Elsewhere it measured no faster: the same attention without the causal mask
// (224 ms against 201-226), whole BERT-mini and BERT-small steps at 128 tokens at 1 thread (1.00),
// and 3-8% slower at 2 (docs/data/fused_attention_2026-12-02.txt); so the composite stays there.
// CHORUS_FUSED_ATTENTION (read at each call): unset, that rule; 1, the fused path wherever it
// applies (tests compare both paths at small sizes); 0, never.
bool fused_attention_wanted(int64_t L, int64_t S, bool causal) {
  const char* v = std::getenv("CHORUS_FUSED_ATTENTION");
  if (v != nullptr && std::string(v) == "0") return false;
  if (v != nullptr && std::string(v) == "1") return true;
  return causal && L * S > 65536;
}

Tensor fused_cpu_attention(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& additive_mask,
                           bool causal, double scale, double dropout_p, Generator* generator) {
  const int64_t L = query.size(-2), S = key.size(-2);
  Shape score_shape(query.sizes().begin(), query.sizes().end() - 2);
  score_shape.push_back(L);
  score_shape.push_back(S);
  const Tensor mask = additive_mask.defined() ? additive_mask.expand(score_shape) : Tensor();
  const Tensor drop = dropout_p > 0.0 ? dropout_multipliers(score_shape, dropout_p, generator, kCPU) : Tensor();
  const bool grad = autograd::any_requires_grad({&query, &key, &value});
  const Tensor probs = grad ? empty(score_shape, {.dtype = kFloat32}) : Tensor();
  Shape out_shape = query.sizes();
  out_shape.back() = value.size(-1);
  // The output and the gradients laid out as the query and the inputs are (a permuted projection's
  // heads), so that the permute and reshape around the attention stay views.
  auto like = [](const Tensor& t) { return ops::new_output_like(t.sizes(), t.strides(), t.dtype(), t.device()); };
  const Tensor out = value.size(-1) == query.size(-1) ? like(query) : empty(out_shape, {.dtype = kFloat32});
  kernels::cpu::attention_forward(query, key, value, mask, causal, scale, drop, out, probs);
  if (grad) {
    autograd::SavedTensor sq(query), sk(key), sv(value);
    autograd::record("ScaledDotProductAttentionBackward", {query, key, value}, {out},
                     [sq, sk, sv, probs, drop, causal, scale, like](const TensorList& g) -> TensorList {
                       const Tensor q = sq.unpack(kOp), k = sk.unpack(kOp), v = sv.unpack(kOp);
                       Tensor dq = like(q), dk = like(k), dv = like(v);
                       kernels::cpu::attention_backward(g[0], q, k, v, probs, drop, causal, scale, dq, dk, dv);
                       return {dq, dk, dv};
                     });
  }
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const ScaledDotProductAttentionOptions& options) {
  ops::check_defined(query, kOp, "query");
  ops::check_defined(key, kOp, "key");
  ops::check_defined(value, kOp, "value");
  if (query.dim() < 2 || key.dim() < 2 || value.dim() < 2) {
    fail("{}: expected query [..., L, E], key [..., S, E] and value [..., S, Ev] with at least 2 dims each, got {}",
         kOp, shapes_given(query, key, value));
  }
  if (!query.is_floating_point() || key.dtype() != query.dtype() || value.dtype() != query.dtype()) {
    fail("{}: expected query, key and value of one floating dtype, got {}, {} and {}", kOp, dtype_name(query.dtype()),
         dtype_name(key.dtype()), dtype_name(value.dtype()));
  }
  ops::check_same_device(query, key, kOp);
  ops::check_same_device(query, value, kOp);
  const int64_t L = query.size(-2), E = query.size(-1), S = key.size(-2);
  if (key.size(-1) != E) {
    fail("{}: key's last dim must equal query's embedding size E={}, got {}", kOp, E, shapes_given(query, key, value));
  }
  if (value.size(-2) != S) {
    fail("{}: value must have as many rows as key (S={}), got {}", kOp, S, shapes_given(query, key, value));
  }
  Shape score_batch, out_batch;
  if (!broadcast_batch(leading(query), leading(key), score_batch) ||
      !broadcast_batch(score_batch, leading(value), out_batch)) {
    fail("{}: the batch dims (all but the last two) of query, key and value must broadcast, got {}", kOp,
         shapes_given(query, key, value));
  }
  if (!(options.dropout_p >= 0.0 && options.dropout_p <= 1.0)) {
    fail("{}: dropout_p must be within [0, 1], got {}", kOp, options.dropout_p);
  }
  Tensor mask = options.attn_mask;
  if (mask.defined() && options.is_causal) {
    fail("{}: attn_mask and is_causal were both given; PyTorch refuses this too. Pass only is_causal, or fold the "
         "causal mask into attn_mask",
         kOp);
  }
  Shape score_shape = score_batch;
  score_shape.push_back(L);
  score_shape.push_back(S);
  if (mask.defined()) {
    if (mask.dtype() != kBool && !mask.is_floating_point()) {
      fail("{}: attn_mask must be bool (true = attend) or floating (added to the scores), got {}", kOp,
           dtype_name(mask.dtype()));
    }
    if (!is_expandable_to(mask.sizes(), score_shape)) {
      fail("{}: attn_mask of shape {} does not broadcast to the scores [..., L, S] = {}", kOp, shape_str(mask.sizes()),
           shape_str(score_shape));
    }
    ops::check_same_device(query, mask, kOp);
    // A float32 mask beside bfloat16 activations (autocast) is added in the activations' dtype.
    if (mask.dtype() != kBool) mask = mask.to(query.dtype());
  }

  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  auto unit_rows = [](const Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1; };
  if (query.device().is_cpu() && query.dtype() == kFloat32 && fused_attention_wanted(L, S, options.is_causal) &&
      !autocast::lower_precision({&query, &key, &value}).has_value() && leading(query) == leading(key) &&
      leading(query) == leading(value) && unit_rows(query) && unit_rows(key) && unit_rows(value) &&
      options.dropout_p < 1.0 && !(mask.defined() && autograd::any_requires_grad({&mask}))) {
    Tensor additive;
    if (mask.defined()) {
      NoGradGuard no_grad;
      additive = mask.dtype() == kBool ? where(mask, zeros({}, {.dtype = kFloat32}), neg_inf) : mask;
    }
    return fused_cpu_attention(query, key, value, additive, options.is_causal, scale, options.dropout_p,
                               options.generator);
  }
  // Scaling the query instead of the scores touches L*E elements instead of L*S (PyTorch's math
  // backend scales both q and k by sqrt(scale)); the two differ only by rounding, and not at all
  // when the scale is a power of two (head dims 4, 16, 64, 256).
  Tensor scores = matmul(mul(query, scale), key.transpose(-2, -1));

  // [Fully masked rows] A query row whose mask excludes every key has no softmax (0/0). PyTorch's
  // math backend (2.5 and later) returns zeros there. Here such rows get a harmless mask (every
  // key allowed) and their output is zeroed afterwards, so neither the output nor any gradient
  // carries NaN. The test runs on the mask alone, which is usually far smaller than the scores.
  Tensor excluded_rows;  // bool, mask's shape with the last dim 1
  if (mask.defined()) {
    Tensor safe_mask;
    {
      NoGradGuard no_grad;
      excluded_rows = mask.dtype() == kBool ? logical_not(any(mask, -1, true)) : all(eq(mask, neg_inf), -1, true);
      // On the CPU, reading the (small) answer costs nothing: when no row is excluded, which is
      // BERT's case (a finite additive mask), the two extra passes over the mask and the output
      // are skipped. A device keeps them rather than wait for the answer.
      if (excluded_rows.device().is_cpu() && !any(excluded_rows).item<bool>()) excluded_rows = Tensor();
    }
    if (!excluded_rows.defined()) {
      if (mask.dtype() == kBool) scores = where(mask, scores, neg_inf);
      else scores = add(scores, mask);
    } else if (mask.dtype() == kBool) {
      safe_mask = logical_or(mask, excluded_rows);
      scores = where(safe_mask, scores, neg_inf);
    } else {
      safe_mask = masked_fill(mask, excluded_rows, 0.0);
      scores = add(scores, safe_mask);
    }
  } else if (options.is_causal) {
    TensorOptions index_options{.dtype = kInt64, .device = query.device()};
    Tensor allowed = le(arange(S, index_options).unsqueeze(0), arange(L, index_options).unsqueeze(1));
    scores = where(allowed, scores, neg_inf);
  }
  Tensor weights = chorus::softmax(scores, -1);
  if (options.dropout_p > 0.0) weights = dropout(weights, options.dropout_p, true, options.generator);
  // Laid out like the query (PyTorch's fused kernels do the same): a query of heads permuted out of
  // [B, T, H, d] gets its output back in that order, and the caller's permute and reshape to
  // [B, T, H * d] are views, not a copy.
  Tensor out = matmul_laid_out_like(weights, value, query);
  if (excluded_rows.defined()) out = masked_fill(out, excluded_rows, 0.0);
  return out;
}

}  // namespace chorus::nn::functional
