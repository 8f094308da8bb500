#include "nn/transformer.h"

#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "nn/functional/attention.h"
#include "nn/functional/basic.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::nn {

namespace F = functional;

namespace {

// linear2(dropout(activation(linear1(x)))): the feed-forward block of both layer kinds.
Tensor feed_forward(Linear& linear1, Dropout& dropout, Linear& linear2, const std::string& activation, const Tensor& x) {
  Tensor h = linear1.forward(x);
  h = activation == "gelu" ? F::gelu(h) : F::relu(h);
  return linear2.forward(dropout.forward(h));
}

void check_activation(const char* layer, const std::string& activation) {
  if (activation != "relu" && activation != "gelu") {
    fail("{}: activation must be 'relu' or 'gelu', got '{}'", layer, activation);
  }
}

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, MultiheadAttentionOptions opts)
    : Module("MultiheadAttention"), embed_dim(e), num_heads(h), head_dim(h > 0 ? e / h : 0), options(opts) {
  if (e <= 0 || h <= 0 || e % h != 0) {
    fail("MultiheadAttention: embed_dim ({}) must be positive and divisible by num_heads ({})", e, h);
  }
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * e, e}));
  if (opts.bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * e}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, opts.bias));
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  init::xavier_uniform_(in_proj_weight);
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  if (out_proj->bias.defined()) init::zeros_(out_proj->bias);
}

std::string MultiheadAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, batch_first={}", embed_dim, num_heads, options.batch_first);
}

MultiheadAttention::Output MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       const Tensor& key_padding_mask, bool need_weights,
                                                       const Tensor& attn_mask, bool average_attn_weights,
                                                       bool is_causal) {
  for (const Tensor* t : {&query, &key, &value}) {
    if (!t->defined() || t->dim() != 3 || t->size(2) != embed_dim) {
      fail("MultiheadAttention: expected query, key and value of shape [{}, E={}] , got {}",
           options.batch_first ? "N, L" : "L, N", embed_dim, t->defined() ? shape_str(t->sizes()) : "undefined");
    }
  }
  // Work in [N, L, E].
  Tensor q_in = options.batch_first ? query : query.transpose(0, 1);
  Tensor k_in = options.batch_first ? key : key.transpose(0, 1);
  Tensor v_in = options.batch_first ? value : value.transpose(0, 1);
  const int64_t N = q_in.size(0), L = q_in.size(1), S = k_in.size(1);
  if (k_in.size(0) != N || v_in.size(0) != N || v_in.size(1) != S) {
    fail("MultiheadAttention: batch or sequence sizes disagree: query {}, key {}, value {}", shape_str(query.sizes()),
         shape_str(key.sizes()), shape_str(value.sizes()));
  }
  const int64_t E = embed_dim, H = num_heads, D = head_dim;
  // One split of the packed weight (one node, whose backward cats the three gradients), not three
  // narrows (three whole-size zero gradients summed).
  const TensorList in_w = chunk(in_proj_weight, 3, 0);
  const TensorList in_b = in_proj_bias.defined() ? chunk(in_proj_bias, 3, 0) : TensorList(3);
  auto proj = [&](const Tensor& x, int64_t i) {
    // [N, T, E] -> [N, H, T, D]
    return F::linear(x, in_w[i], in_b[i]).reshape({N, x.size(1), H, D}).permute({0, 2, 1, 3});
  };
  Tensor q = proj(q_in, 0), k = proj(k_in, 1), v = proj(v_in, 2);

  const double neg_inf = -std::numeric_limits<double>::infinity();
  // Both masks in scores layout: attn_mask [L, S] or [N, H, L, S], key_padding_mask [N, 1, 1, S].
  auto checked_mask = [&](const Tensor& mask, const char* what) {
    Tensor m = mask;
    if (m.dim() == 2) {
      if (m.size(0) != L || m.size(1) != S) {
        fail("MultiheadAttention: {} of shape {} must be [L={}, S={}]", what, shape_str(m.sizes()), L, S);
      }
    } else if (m.dim() == 3) {
      if (m.size(0) != N * H || m.size(1) != L || m.size(2) != S) {
        fail("MultiheadAttention: {} of shape {} must be [N*H={}, L={}, S={}]", what, shape_str(m.sizes()), N * H, L, S);
      }
      m = m.reshape({N, H, L, S});
    } else {
      fail("MultiheadAttention: {} must be 2-D or 3-D, got shape {}", what, shape_str(m.sizes()));
    }
    return m;
  };
  Tensor mask = attn_mask.defined() ? checked_mask(attn_mask, "attn_mask") : Tensor();
  Tensor padding;
  if (key_padding_mask.defined()) {
    if (key_padding_mask.dim() != 2 || key_padding_mask.size(0) != N || key_padding_mask.size(1) != S) {
      fail("MultiheadAttention: key_padding_mask of shape {} must be [N={}, S={}]", shape_str(key_padding_mask.sizes()),
           N, S);
    }
    padding = key_padding_mask.reshape({N, 1, 1, S});
  }
  const double dropout_p = is_training() ? options.dropout : 0.0;

  if (!need_weights) {
    // The weights stay inside scaled_dot_product_attention. Its masks say where attention is
    // allowed, these where it is not, so they are merged into one additive mask as PyTorch's
    // MultiheadAttention does; is_causal alone is passed through.
    auto additive = [&](const Tensor& m) {
      return m.dtype() == kBool ? where(m, full({1}, neg_inf, q.options()), 0.0) : m.to(q.dtype());
    };
    Tensor merged;
    for (const Tensor& m : {mask, padding}) {
      if (m.defined()) merged = merged.defined() ? add(merged, additive(m)) : additive(m);
    }
    bool causal = is_causal;
    if (causal && merged.defined()) {
      merged = masked_fill(merged, gt(arange(S, TensorOptions{.dtype = kInt64, .device = q.device()}).unsqueeze(0),
                                      arange(L, TensorOptions{.dtype = kInt64, .device = q.device()}).unsqueeze(1)),
                           neg_inf);
      causal = false;
    }
    Tensor context = F::scaled_dot_product_attention(q, k, v, {.attn_mask = merged, .dropout_p = dropout_p,
                                                               .is_causal = causal});
    Tensor out = out_proj->forward(context.permute({0, 2, 1, 3}).reshape({N, L, E}));
    return {options.batch_first ? out : out.transpose(0, 1), Tensor()};
  }

  Tensor scores = div(matmul(q, k.transpose(-2, -1)), std::sqrt(static_cast<double>(D)));  // [N, H, L, S]
  auto apply_mask = [&](const Tensor& m) {
    scores = m.dtype() == kBool ? masked_fill(scores, m, neg_inf) : add(scores, m.to(scores.dtype()));
  };
  if (mask.defined()) apply_mask(mask);
  if (is_causal) {
    Tensor causal = gt(arange(S).unsqueeze(0), arange(L).unsqueeze(1));  // true above the diagonal
    scores = masked_fill(scores, causal, neg_inf);
  }
  if (padding.defined()) apply_mask(padding);
  Tensor attn = softmax(scores, -1);
  Tensor attn_used = F::dropout(attn, dropout_p, true);
  Tensor out = matmul(attn_used, v).permute({0, 2, 1, 3}).reshape({N, L, E});
  out = out_proj->forward(out);
  if (!options.batch_first) out = out.transpose(0, 1);
  Output result{out, Tensor()};
  // The weights returned are the ones applied to the values: after dropout in training, as PyTorch.
  if (need_weights) result.weights = average_attn_weights ? mean(attn_used, {1}) : attn_used;
  return result;
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x, Tensor(), false).output; }

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerEncoderLayerOptions opts)
    : Module("TransformerEncoderLayer"), options(opts) {
  check_activation("TransformerEncoderLayer", opts.activation);
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(
                                               d_model, nhead,
                                               MultiheadAttentionOptions{.dropout = opts.dropout, .batch_first = opts.batch_first}));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, opts.dim_feedforward));
  dropout = register_module("dropout", std::make_shared<Dropout>(opts.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(opts.dim_feedforward, d_model));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, opts.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, opts.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(opts.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(opts.dropout));
}

Tensor TransformerEncoderLayer::self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding,
                                                     bool is_causal) {
  return dropout1->forward(self_attn->forward(x, x, x, padding, false, mask, true, is_causal).output);
}

Tensor TransformerEncoderLayer::feed_forward_block(const Tensor& x) {
  return dropout2->forward(feed_forward(*linear1, *dropout, *linear2, options.activation, x));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask,
                                        bool is_causal) {
  Tensor x = src;
  if (options.norm_first) {
    x = add(x, self_attention_block(norm1->forward(x), src_mask, src_key_padding_mask, is_causal));
    x = add(x, feed_forward_block(norm2->forward(x)));
  } else {
    x = norm1->forward(add(x, self_attention_block(x, src_mask, src_key_padding_mask, is_causal)));
    x = norm2->forward(add(x, feed_forward_block(x)));
  }
  return x;
}

TransformerEncoder::TransformerEncoder(int64_t d_model, int64_t nhead, int64_t num_layers,
                                       TransformerEncoderLayerOptions opts, bool final_norm)
    : Module("TransformerEncoder") {
  if (num_layers <= 0) fail("TransformerEncoder: num_layers must be positive, got {}", num_layers);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) layers->push_back(std::make_shared<TransformerEncoderLayer>(d_model, nhead, opts));
  if (final_norm) norm = register_module("norm", std::make_shared<LayerNorm>(Shape{d_model}, opts.layer_norm_eps));
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask,
                                   bool is_causal) {
  Tensor x = src;
  for (const auto& m : *layers) {
    x = std::static_pointer_cast<TransformerEncoderLayer>(m)->forward(x, mask, src_key_padding_mask, is_causal);
  }
  return norm ? norm->forward(x) : x;
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead, TransformerDecoderLayerOptions opts)
    : Module("TransformerDecoderLayer"), options(opts) {
  check_activation("TransformerDecoderLayer", opts.activation);
  const MultiheadAttentionOptions attention{.dropout = opts.dropout, .batch_first = opts.batch_first};
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, attention));
  multihead_attn = register_module("multihead_attn", std::make_shared<MultiheadAttention>(d_model, nhead, attention));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, opts.dim_feedforward));
  dropout = register_module("dropout", std::make_shared<Dropout>(opts.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(opts.dim_feedforward, d_model));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, opts.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, opts.layer_norm_eps));
  norm3 = register_module("norm3", std::make_shared<LayerNorm>(Shape{d_model}, opts.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(opts.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(opts.dropout));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(opts.dropout));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask,
                                        const Tensor& memory_mask, const Tensor& tgt_key_padding_mask,
                                        const Tensor& memory_key_padding_mask) {
  auto self_block = [&](const Tensor& x) {
    return dropout1->forward(self_attn->forward(x, x, x, tgt_key_padding_mask, false, tgt_mask).output);
  };
  auto cross_block = [&](const Tensor& x) {
    return dropout2->forward(
        multihead_attn->forward(x, memory, memory, memory_key_padding_mask, false, memory_mask).output);
  };
  auto ff_block = [&](const Tensor& x) {
    return dropout3->forward(feed_forward(*linear1, *dropout, *linear2, options.activation, x));
  };
  Tensor x = tgt;
  if (options.norm_first) {
    x = add(x, self_block(norm1->forward(x)));
    x = add(x, cross_block(norm2->forward(x)));
    x = add(x, ff_block(norm3->forward(x)));
  } else {
    x = norm1->forward(add(x, self_block(x)));
    x = norm2->forward(add(x, cross_block(x)));
    x = norm3->forward(add(x, ff_block(x)));
  }
  return x;
}

TransformerDecoder::TransformerDecoder(int64_t d_model, int64_t nhead, int64_t num_layers,
                                       TransformerDecoderLayerOptions opts, bool final_norm)
    : Module("TransformerDecoder") {
  if (num_layers <= 0) fail("TransformerDecoder: num_layers must be positive, got {}", num_layers);
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < num_layers; ++i) layers->push_back(std::make_shared<TransformerDecoderLayer>(d_model, nhead, opts));
  if (final_norm) norm = register_module("norm", std::make_shared<LayerNorm>(Shape{d_model}, opts.layer_norm_eps));
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask,
                                   const Tensor& memory_mask, const Tensor& tgt_key_padding_mask,
                                   const Tensor& memory_key_padding_mask) {
  Tensor x = tgt;
  for (const auto& m : *layers) {
    x = std::static_pointer_cast<TransformerDecoderLayer>(m)->forward(x, memory, tgt_mask, memory_mask,
                                                                      tgt_key_padding_mask, memory_key_padding_mask);
  }
  return norm ? norm->forward(x) : x;
}

Transformer::Transformer(TransformerOptions opts) : Module("Transformer"), options(std::move(opts)) {
  const TransformerEncoderLayerOptions layer{.dim_feedforward = options.dim_feedforward,
                                             .dropout = options.dropout,
                                             .activation = options.activation,
                                             .layer_norm_eps = options.layer_norm_eps,
                                             .batch_first = options.batch_first,
                                             .norm_first = options.norm_first};
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(options.d_model, options.nhead,
                                                                            options.num_encoder_layers, layer, true));
  decoder = register_module("decoder", std::make_shared<TransformerDecoder>(options.d_model, options.nhead,
                                                                            options.num_decoder_layers, layer, true));
  reset_parameters();
}

void Transformer::reset_parameters() {
  for (auto& [name, p] : named_parameters()) {
    if (p.dim() > 1) init::xavier_uniform_(p);
  }
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask, const Tensor& tgt_mask,
                            const Tensor& memory_mask, const Tensor& src_key_padding_mask,
                            const Tensor& tgt_key_padding_mask, const Tensor& memory_key_padding_mask) {
  if (!src.defined() || !tgt.defined() || src.dim() != tgt.dim() || (src.dim() != 3 && src.dim() != 2)) {
    fail("Transformer: expected src and tgt both 3-D ({}) or both 2-D unbatched, got {} and {}",
         options.batch_first ? "[N, S, E] and [N, T, E]" : "[S, N, E] and [T, N, E]",
         src.defined() ? shape_str(src.sizes()) : "undefined", tgt.defined() ? shape_str(tgt.sizes()) : "undefined");
  }
  if (src.dim() == 2) {  // unbatched: a batch of one
    const int64_t batch_dim = options.batch_first ? 0 : 1;
    auto one = [&](const Tensor& m) { return m.defined() ? m.unsqueeze(0) : m; };
    return forward(src.unsqueeze(batch_dim), tgt.unsqueeze(batch_dim), src_mask, tgt_mask, memory_mask,
                   one(src_key_padding_mask), one(tgt_key_padding_mask), one(memory_key_padding_mask))
        .squeeze(batch_dim);
  }
  const int64_t batch_dim = options.batch_first ? 0 : 1;
  if (src.size(batch_dim) != tgt.size(batch_dim)) {
    fail("Transformer: the batch sizes of src {} and tgt {} must be equal", shape_str(src.sizes()),
         shape_str(tgt.sizes()));
  }
  if (src.size(2) != options.d_model || tgt.size(2) != options.d_model) {
    fail("Transformer: the feature sizes of src {} and tgt {} must equal d_model={}", shape_str(src.sizes()),
         shape_str(tgt.sizes()), options.d_model);
  }
  const Tensor memory = encoder->forward(src, src_mask, src_key_padding_mask);
  return decoder->forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask);
}

Tensor Transformer::generate_square_subsequent_mask(int64_t size, const TensorOptions& options) {
  if (size < 0) fail("Transformer::generate_square_subsequent_mask: size must be >= 0, got {}", size);
  const TensorOptions index_options{.dtype = kInt64, .device = options.device};
  const Tensor above = gt(arange(size, index_options).unsqueeze(0), arange(size, index_options).unsqueeze(1));
  return where(above, full({1}, -std::numeric_limits<double>::infinity(), options), zeros({1}, options));
}

}  // namespace chorus::nn
