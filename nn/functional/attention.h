// scaled_dot_product_attention, as torch.nn.functional's: softmax(q k^T * scale + mask) v, with an
// optional boolean or additive mask, a causal mask, and dropout on the attention weights. The
// layers built on attention (nn::MultiheadAttention, BERT's self-attention) call it.
#pragma once

#include <optional>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace chorus::nn::functional {

// PyTorch's keyword arguments, by the same names. `Tensor attn_mask{}` (not `Tensor attn_mask;`)
// keeps GCC's -Wmissing-field-initializers quiet when a designated initializer leaves it out.
struct ScaledDotProductAttentionOptions {
  // bool: true where a query may attend to a key; floating: added to the scores (in the query's
  // dtype). Either broadcastable to the scores [..., L, S].
  Tensor attn_mask{};
  // Applied to the attention weights whenever > 0 (the functional form has no training flag).
  double dropout_p = 0.0;
  // Query i attends to keys 0..i (a lower-triangular [L, S] mask, top-left aligned when L != S).
  // An error together with attn_mask, as in PyTorch.
  bool is_causal = false;
  std::optional<double> scale{};  // default 1 / sqrt(E)
  Generator* generator = nullptr;  // for dropout; the default generator when null
};

// query [..., L, E], key [..., S, E], value [..., S, Ev] (batch dims broadcast) -> [..., L, Ev].
// A query row whose mask excludes every key gives zeros (and zero gradients), as PyTorch's math
// backend does since 2.5 (its _safe_softmax; PyTorch 2.0-2.4 gave NaN there).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const ScaledDotProductAttentionOptions& options = {});

}  // namespace chorus::nn::functional
