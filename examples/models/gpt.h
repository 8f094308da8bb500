// GPT-2, the causal language model, with Hugging Face GPT2LMHeadModel's module and parameter names
// (transformer.wte, transformer.h.0.attn.c_attn, ..., transformer.ln_f), so a GPT-2 safetensors
// file loads by name. As in Hugging Face's Conv1D, the projections store their weight as
// [in, out] (the transpose of nn::Linear's). Pre-LayerNorm blocks (eps 1e-5), causal self-attention
// through F::scaled_dot_product_attention, a 4x MLP with tanh-approximated GELU, a final LayerNorm,
// and an LM head tied to the token embedding: lm_head.weight is transformer.wte.weight, so it is
// not a parameter of its own (parameters() and state_dict() list it once, as wte; the hub's
// gpt2 checkpoint has no lm_head.weight either). Initialization as GPT-2's: N(0, 0.02) weights and
// embeddings, zero biases, LayerNorm ones/zeros, and the two residual projections (attn.c_proj,
// mlp.c_proj) at N(0, 0.02 / sqrt(2 * n_layer)).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distributed/pipeline/blocks.h"
#include "nn/nn.h"
#include "tensor/generator.h"

namespace chorus::models {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  // One rate for Hugging Face's embd_pdrop, attn_pdrop and resid_pdrop (all 0.1 in GPT-2).
  double dropout = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  // false: keep the layers' own initial values (nn::Embedding's N(0, 1), zero projections,
  // LayerNorm ones/zeros) instead of drawing GPT-2's, for a model whose weights are about to be
  // loaded (drawing another 124M normal numbers takes seconds on a CPU).
  bool initialize = true;

  // gpt2 (124M: 12 layers, 768 wide, 12 heads), gpt2-medium (24, 1024, 16), gpt2-large (36, 1280,
  // 20), gpt2-xl (48, 1600, 25): GPT-2's 50257-token vocabulary and 1024 positions. For training
  // on a CPU: mini (4 layers, 256 wide, 4 heads, 256 positions) and tiny (2, 64, 4, 128 positions),
  // both with a 256-symbol (byte) vocabulary and no dropout.
  static GPTConfig named(const std::string& name);
};

class GPT2Block;
struct KVCache;

// The transformer without its head: embeddings, blocks and the final LayerNorm.
class GPT2Model : public nn::Module {
 public:
  explicit GPT2Model(const GPTConfig& c);
  // input_ids int64 [B, T], T <= n_positions -> hidden states [B, T, n_embd].
  Tensor forward(const Tensor& input_ids) override;
  // As GPT2LMHeadModel::forward(input_ids, cache), without the head.
  Tensor forward(const Tensor& input_ids, KVCache& cache);
  GPTConfig config;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

// Every layer's keys and values for the positions processed so far (Hugging Face's
// past_key_values), so that generation computes one new position per token instead of the whole
// prefix again. Made by GPT2LMHeadModel::make_cache; GPT2LMHeadModel::forward(input_ids, cache)
// appends to it. The buffers are allocated once at full capacity (no copy as the context grows).
struct KVCache {
  std::vector<Tensor> keys, values;  // one per layer: [batch, n_head, capacity, n_embd / n_head]
  int64_t length = 0;                // positions held: the next token's position
  int64_t batch = 0, capacity = 0;
  // Forget every position (the buffers stay allocated).
  void clear() { length = 0; }
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  // 0: greedy (the most likely token each time); otherwise logits are divided by it before sampling.
  double temperature = 1.0;
  // Sample among the k most likely tokens only (0: all).
  int64_t top_k = 0;
  Generator* generator = nullptr;  // the default generator when null
  // true: a KVCache, one position per new token (until the context fills n_positions; from then on
  // every token recomputes the last n_positions tokens, as the uncached path does). false: every
  // token recomputes the whole context. Both give the same tokens (up to float round-off).
  bool use_cache = true;
};

class GPT2LMHeadModel : public nn::Module {
 public:
  explicit GPT2LMHeadModel(const GPTConfig& c);
  // input_ids int64 [B, T] -> next-token logits [B, T, vocab_size]; position t sees tokens 0..t only.
  Tensor forward(const Tensor& input_ids) override;
  // Incremental decoding: input_ids [B, T] continue the cache's cache.length positions (positions
  // cache.length .. cache.length + T - 1; each attends to every cached position and to the new ones
  // up to itself) -> logits [B, T, vocab_size], the same as forward() on the whole sequence would give
  // for those positions. Appends the new keys and values to the cache. Inference only: an error
  // while gradients are enabled (use NoGradGuard), since the cache is written in place.
  Tensor forward(const Tensor& input_ids, KVCache& cache);
  // An empty cache for `batch` sequences of up to `capacity` positions (0: n_positions), in the
  // parameters' dtype and on their device.
  KVCache make_cache(int64_t batch, int64_t capacity = 0) const;
  // Mean cross-entropy of predicting targets [B, T] (usually input_ids shifted by one) from input_ids.
  Tensor loss(const Tensor& input_ids, const Tensor& targets);
  // Appends max_new_tokens tokens to `prompt` (at least one token), one forward pass per token
  // (through a KVCache unless options.use_cache is false), with the context cut to the last
  // n_positions tokens; returns the new tokens only. Runs in eval mode
  // without gradients, on the model's device, and leaves the training mode as it was.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, const GenerateOptions& options);
  // The model as pipeline blocks (distributed/pipeline/blocks.h), n_layer + 2 of them:
  // "embeddings" (transformer.wte, .wpe: input_ids [B, T] -> hidden [B, T, n_embd]), "h.0" ...,
  // "head" (transformer.ln_f and the tied transformer.wte.weight: hidden -> logits
  // [B, T, vocab_size]). The same computation as forward(); the model must be held by a shared_ptr.
  distributed::pipeline::BlockModel pipeline_blocks();
  // The pipeline's loss (PipelineStage::train_step): mean cross-entropy of the head's logits
  // against targets[0] [b, T].
  static Tensor pipeline_loss(const TensorList& outputs, const TensorList& targets);
  // The tied LM head's weight [vocab_size, n_embd]: the token embedding itself.
  Tensor lm_head_weight() const { return transformer->wte->weight; }
  std::shared_ptr<GPT2Model> transformer;
};

}  // namespace chorus::models
