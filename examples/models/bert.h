// BERT for masked-LM pretraining with Hugging Face BertForPreTraining's module and parameter names
// (bert.embeddings.word_embeddings, bert.encoder.layer.0.attention.self.query, ...,
// cls.predictions.transform.dense, cls.predictions.bias, cls.seq_relationship), so its state_dict
// lines up with a Hugging Face checkpoint name for name. Post-norm layers, GELU (erf), LayerNorm
// eps 1e-12, weights ~ N(0, 0.02), biases 0 (BERT's initializer_range). The masked-LM decoder is
// tied to the word embeddings (its weight is the embedding matrix; only its bias is a parameter).
#pragma once

#include <memory>
#include <string>

#include "distributed/pipeline/blocks.h"
#include "nn/nn.h"

namespace chorus::models {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;

  // tiny (2 layers, 128 hidden), mini (4, 256), small (4, 512), base (12, 768); heads = hidden / 64,
  // intermediate = 4 x hidden, as the Google BERT miniatures.
  static BertConfig named(const std::string& name);
};

class BertSelfAttention;
class BertLayer;

class BertEmbeddings : public nn::Module {
 public:
  explicit BertEmbeddings(const BertConfig& c);
  // input_ids [B, T] int64; token_type_ids [B, T] or undefined (all zero).
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids);
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, Tensor()); }
  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

class BertModel : public nn::Module {
 public:
  explicit BertModel(const BertConfig& c);
  // Returns the last hidden states [B, T, H]. attention_mask [B, T]: 1 for tokens, 0 for padding.
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids, const Tensor& attention_mask);
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, Tensor(), Tensor()); }
  // tanh(dense(hidden[:, 0])).
  Tensor pool(const Tensor& hidden);
  BertConfig config;
  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<nn::ModuleList> layers;  // registered as encoder.layer
  std::shared_ptr<nn::Linear> pooler_dense;  // registered as pooler.dense
};

struct BertOutputs {
  Tensor prediction_logits;        // [B, T, vocab]
  Tensor seq_relationship_logits;  // [B, 2]
};

class BertForPreTraining : public nn::Module {
 public:
  explicit BertForPreTraining(const BertConfig& c);
  BertOutputs forward(const Tensor& input_ids, const Tensor& token_type_ids, const Tensor& attention_mask);
  // Masked-LM logits only.
  Tensor forward(const Tensor& input_ids) override { return forward(input_ids, Tensor(), Tensor()).prediction_logits; }
  // The masked-LM head on chosen positions only: hidden [B, T, H] from bert->forward, positions
  // int64 [K] indexing the flattened B*T tokens -> logits [K, vocab]. Pretraining predicts ~15% of
  // the tokens; running the head and the 30,522-way decoder on those alone (as NVIDIA's BERT does)
  // gives the same loss and gradients as the full head with ignored labels, at a fraction of the cost.
  Tensor masked_lm_logits(const Tensor& hidden, const Tensor& positions);
  // Mean cross-entropy over the positions whose label is not -100 (labels [B, T]), through
  // masked_lm_logits; the logits come back in *logits when asked (rows in position order).
  // The logits of the labelled positions [K, vocab] (position order) and their labels [K]: what
  // the pipeline's head block gives and pipeline_loss takes.
  TensorList masked_lm_outputs(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& labels);
  Tensor masked_lm_loss(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& labels,
                        Tensor* logits = nullptr, Tensor* targets = nullptr);
  // Masked-LM pretraining as pipeline blocks (distributed/pipeline/blocks.h), num_hidden_layers + 2
  // of them, each passing (hidden or input_ids, attention mask, labels): "embeddings"
  // (bert.embeddings: input_ids [B, T], attention_mask [B, T], labels [B, T] -> hidden [B, T, H],
  // the additive mask [B, 1, 1, T], labels), "encoder.layer.0" ..., "head" (the prediction head and
  // the tied word embeddings: -> logits [K, vocab] of the K labelled positions, their labels [K]).
  // The pooler and the next-sentence head are in no block. The same computation as
  // masked_lm_loss; the model must be held by a shared_ptr.
  distributed::pipeline::BlockModel pipeline_blocks();
  // The pipeline's loss: cross-entropy of the head's logits against its labels (targets unused).
  static Tensor pipeline_loss(const TensorList& outputs, const TensorList& targets);
  std::shared_ptr<BertModel> bert;

 private:
  std::shared_ptr<nn::Linear> transform_dense_, seq_relationship_;
  std::shared_ptr<nn::LayerNorm> transform_norm_;
  Tensor decoder_bias_;
};

}  // namespace chorus::models
