// MultiheadAttention, the Transformer encoder and decoder layers and stacks, and nn::Transformer,
// with PyTorch's parameter names (in_proj_weight, in_proj_bias, out_proj.*, self_attn.*,
// multihead_attn.*, linear1/2, norm1/2/3, encoder.*, decoder.*), so state dicts map one to one.
// Masks follow PyTorch: a bool mask is true where attention is NOT allowed; a float mask is added
// to the scores.
#pragma once

#include <memory>
#include <string>

#include "nn/container.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace chorus::nn {

struct MultiheadAttentionOptions {
  double dropout = 0.0;  // on the attention weights, in training
  bool bias = true;
  bool batch_first = false;  // inputs [N, L, E] instead of [L, N, E]
};

class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {});

  struct Output {
    Tensor output;   // like query
    Tensor weights;  // [N, L, S] averaged over heads ([N, H, L, S] if not averaged); undefined if not needed
  };
  // key_padding_mask: [N, S] (bool: true = padding, or float added). attn_mask: [L, S] or [N*H, L, S].
  // is_causal builds the causal mask itself (position i sees keys 0..i). Without need_weights the
  // attention runs in F::scaled_dot_product_attention, where a query whose masks exclude every key
  // gets zeros (PyTorch's fast path); with need_weights that row is NaN, as PyTorch's slow path.
  Output forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = Tensor(),
                 bool need_weights = true, const Tensor& attn_mask = Tensor(), bool average_attn_weights = true,
                 bool is_causal = false);
  // Self-attention without masks (for Sequential).
  Tensor forward(const Tensor& x) override;
  void reset_parameters();

  int64_t embed_dim, num_heads, head_dim;
  MultiheadAttentionOptions options;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;

 protected:
  std::string extra_repr() const override;
};

struct TransformerEncoderLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;  // pre-norm (x + f(norm(x))) instead of post-norm (norm(x + f(x)))
};

class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, TransformerEncoderLayerOptions options = {});
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }

  TransformerEncoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding, bool is_causal);
  Tensor feed_forward_block(const Tensor& x);
};

// num_layers encoder layers ("layers.0", ...) and an optional final LayerNorm ("norm"). Each layer
// is initialized independently (PyTorch deep-copies one layer, so its layers start identical).
class TransformerEncoder : public Module {
 public:
  TransformerEncoder(int64_t d_model, int64_t nhead, int64_t num_layers, TransformerEncoderLayerOptions options = {},
                     bool final_norm = false);
  Tensor forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }

  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<LayerNorm> norm;  // null without final_norm
};

// The decoder layer takes the encoder layer's knobs.
using TransformerDecoderLayerOptions = TransformerEncoderLayerOptions;

// Self-attention over tgt, cross-attention from tgt to memory (the encoder's output), then the
// feed-forward block; each with its residual and LayerNorm (norm1..3), post- or pre-norm.
class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, TransformerDecoderLayerOptions options = {});
  // Masks as MultiheadAttention's: tgt_mask [T, T], memory_mask [T, S], padding masks [N, T] / [N, S].
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                 const Tensor& memory_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor());

  TransformerDecoderLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
};

// num_layers decoder layers ("layers.0", ...) and an optional final LayerNorm ("norm"), each layer
// initialized independently (as TransformerEncoder).
class TransformerDecoder : public Module {
 public:
  TransformerDecoder(int64_t d_model, int64_t nhead, int64_t num_layers, TransformerDecoderLayerOptions options = {},
                     bool final_norm = false);
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                 const Tensor& memory_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor());

  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<LayerNorm> norm;  // null without final_norm
};

// torch::nn::TransformerOptions' knobs, plus the layers' layer_norm_eps, batch_first and norm_first
// (as Python's nn.Transformer).
struct TransformerOptions {
  int64_t d_model = 512;
  int64_t nhead = 8;
  int64_t num_encoder_layers = 6;
  int64_t num_decoder_layers = 6;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
};

// An encoder and a decoder ("encoder.*", "decoder.*"), each with a final LayerNorm, as PyTorch's;
// every parameter with more than one dim starts xavier_uniform (PyTorch's _reset_parameters).
class Transformer : public Module {
 public:
  explicit Transformer(TransformerOptions options = {});
  // src [S, N, E] and tgt [T, N, E] ([N, S, E] / [N, T, E] with batch_first) -> like tgt.
  // src_mask [S, S], tgt_mask [T, T], memory_mask [T, S]; padding masks [N, S] / [N, T] / [N, S].
  Tensor forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask = Tensor(),
                 const Tensor& tgt_mask = Tensor(), const Tensor& memory_mask = Tensor(),
                 const Tensor& src_key_padding_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor());
  void reset_parameters();
  // [size, size] float: 0 on and below the diagonal, -inf above (position i attends to 0..i).
  static Tensor generate_square_subsequent_mask(int64_t size, const TensorOptions& options = {});

  TransformerOptions options;
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<TransformerDecoder> decoder;
};

}  // namespace chorus::nn
