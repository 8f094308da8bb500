// scaled_dot_product_attention as a composite of differentiable ops (matmul, mask, softmax,
// dropout, matmul): autograd derives the backward, and every device that has those kernels (cpu,
// sim, cuda) runs it without kernels of its own.
#include "nn/functional/attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "autograd/ops/common.h"
#include "autograd/ops/linalg.h"
#include "nn/functional/basic.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {
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
