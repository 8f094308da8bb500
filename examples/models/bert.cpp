#include "examples/models/bert.h"

#include <fmt/ranges.h>

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::models {
namespace {

Tensor additive_mask(const Tensor& attention_mask, const Tensor& h) {
  // 0 where attended, a large negative number on padding (Hugging Face uses the dtype's minimum).
  return ((1.0 - attention_mask.to(h.dtype())) * -1e9).reshape({h.size(0), 1, 1, h.size(1)});
}

namespace F = nn::functional;

// A Module holding named children, to build Hugging Face's nesting (attention.self.query, ...).
class Holder : public nn::Module {
 public:
  explicit Holder(const char* type) : nn::Module(type) {}
  Tensor forward(const Tensor& x) override { return x; }
};

}  // namespace

BertConfig BertConfig::named(const std::string& name) {
  BertConfig c;
  int64_t layers = 0, hidden = 0;
  if (name == "tiny") layers = 2, hidden = 128;
  else if (name == "mini") layers = 4, hidden = 256;
  else if (name == "small") layers = 4, hidden = 512;
  else if (name == "base") layers = 12, hidden = 768;
  else fail("BertConfig: unknown configuration '{}' (expected tiny, mini, small or base)", name);
  c.num_hidden_layers = layers;
  c.hidden_size = hidden;
  c.num_attention_heads = hidden / 64;
  c.intermediate_size = 4 * hidden;
  return c;
}

class BertSelfAttention : public nn::Module {
 public:
  explicit BertSelfAttention(const BertConfig& c) : nn::Module("BertSelfAttention"), heads(c.num_attention_heads) {
    query = register_module("query", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
    key = register_module("key", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
    value = register_module("value", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
    dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.attention_probs_dropout_prob));
  }
  // x [B, T, H]; additive_mask [B, 1, 1, T] or undefined.
  Tensor forward(const Tensor& x, const Tensor& additive_mask) {
    const int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = h / heads;
    auto split = [&](const Tensor& y) { return y.reshape({b, t, heads, d}).permute({0, 2, 1, 3}); };
    Tensor q = split(query->forward(x)), k = split(key->forward(x)), v = split(value->forward(x));
    // The dropout module keeps its place in the tree (Hugging Face's attention.self.dropout); its
    // probability is applied inside the attention, to the weights, as before.
    Tensor context = F::scaled_dot_product_attention(
        q, k, v, {.attn_mask = additive_mask, .dropout_p = is_training() ? dropout->p : 0.0});
    return context.permute({0, 2, 1, 3}).reshape({b, t, h});
  }
  Tensor forward(const Tensor& x) override { return forward(x, Tensor()); }
  int64_t heads;
  std::shared_ptr<nn::Linear> query, key, value;
  std::shared_ptr<nn::Dropout> dropout;
};

class BertLayer : public nn::Module {
 public:
  explicit BertLayer(const BertConfig& c) : nn::Module("BertLayer") {
    auto attention = register_module("attention", std::make_shared<Holder>("BertAttention"));
    self = attention->register_module("self", std::make_shared<BertSelfAttention>(c));
    auto attn_out = attention->register_module("output", std::make_shared<Holder>("BertSelfOutput"));
    attn_dense = attn_out->register_module("dense", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
    attn_norm = attn_out->register_module("LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
    attn_drop = attn_out->register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout_prob));
    auto inter = register_module("intermediate", std::make_shared<Holder>("BertIntermediate"));
    inter_dense = inter->register_module("dense", std::make_shared<nn::Linear>(c.hidden_size, c.intermediate_size));
    auto out = register_module("output", std::make_shared<Holder>("BertOutput"));
    out_dense = out->register_module("dense", std::make_shared<nn::Linear>(c.intermediate_size, c.hidden_size));
    out_norm = out->register_module("LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
    out_drop = out->register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout_prob));
  }
  Tensor forward(const Tensor& x, const Tensor& additive_mask) {
    Tensor a = attn_norm->forward(x + attn_drop->forward(attn_dense->forward(self->forward(x, additive_mask))));
    Tensor i = F::gelu(inter_dense->forward(a));
    return out_norm->forward(a + out_drop->forward(out_dense->forward(i)));
  }
  Tensor forward(const Tensor& x) override { return forward(x, Tensor()); }
  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<nn::Linear> attn_dense, inter_dense, out_dense;
  std::shared_ptr<nn::LayerNorm> attn_norm, out_norm;
  std::shared_ptr<nn::Dropout> attn_drop, out_drop;
};

BertEmbeddings::BertEmbeddings(const BertConfig& c) : nn::Module("BertEmbeddings") {
  word_embeddings = register_module("word_embeddings", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size, 0));
  position_embeddings =
      register_module("position_embeddings", std::make_shared<nn::Embedding>(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings =
      register_module("token_type_embeddings", std::make_shared<nn::Embedding>(c.type_vocab_size, c.hidden_size));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout_prob));
}

Tensor BertEmbeddings::forward(const Tensor& input_ids, const Tensor& token_type_ids) {
  if (input_ids.dim() != 2) fail("BertEmbeddings: input_ids must be [batch, sequence], got {}", shape_str(input_ids.sizes()));
  const int64_t t = input_ids.size(1);
  if (t > position_embeddings->num_embeddings) {
    fail("BertEmbeddings: sequence length {} exceeds max_position_embeddings {}", t, position_embeddings->num_embeddings);
  }
  // On the ids' device (a model on sim/cuda gets its position and type ids there too).
  const Device device = input_ids.device();
  Tensor positions = arange(0, t, 1, TensorOptions{.dtype = kInt64}).to(device).unsqueeze(0);
  Tensor types =
      token_type_ids.defined() ? token_type_ids : zeros(input_ids.sizes(), {.dtype = kInt64, .device = device});
  Tensor e = word_embeddings->forward(input_ids) + position_embeddings->forward(positions) +
             token_type_embeddings->forward(types);
  return dropout->forward(LayerNorm->forward(e));
}

BertModel::BertModel(const BertConfig& c) : nn::Module("BertModel"), config(c) {
  if (c.hidden_size % c.num_attention_heads != 0) {
    fail("BertModel: hidden_size {} is not a multiple of num_attention_heads {}", c.hidden_size, c.num_attention_heads);
  }
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  auto encoder = register_module("encoder", std::make_shared<Holder>("BertEncoder"));
  layers = encoder->register_module("layer", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(std::make_shared<BertLayer>(c));
  auto pooler = register_module("pooler", std::make_shared<Holder>("BertPooler"));
  pooler_dense = pooler->register_module("dense", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
}

Tensor BertModel::forward(const Tensor& input_ids, const Tensor& token_type_ids, const Tensor& attention_mask) {
  Tensor h = embeddings->forward(input_ids, token_type_ids);
  Tensor additive;
  if (attention_mask.defined()) additive = additive_mask(attention_mask, h);
  for (size_t i = 0; i < layers->size(); ++i) h = std::static_pointer_cast<BertLayer>((*layers)[i])->forward(h, additive);
  return h;
}

Tensor BertModel::pool(const Tensor& hidden) { return tanh(pooler_dense->forward(hidden.select(1, 0))); }

BertForPreTraining::BertForPreTraining(const BertConfig& c) : nn::Module("BertForPreTraining") {
  bert = register_module("bert", std::make_shared<BertModel>(c));
  auto cls = register_module("cls", std::make_shared<Holder>("BertPreTrainingHeads"));
  auto predictions = cls->register_module("predictions", std::make_shared<Holder>("BertLMPredictionHead"));
  auto transform = predictions->register_module("transform", std::make_shared<Holder>("BertPredictionHeadTransform"));
  transform_dense_ = transform->register_module("dense", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
  transform_norm_ = transform->register_module("LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
  decoder_bias_ = predictions->register_parameter("bias", zeros({c.vocab_size}));
  seq_relationship_ = cls->register_module("seq_relationship", std::make_shared<nn::Linear>(c.hidden_size, 2));
  // BERT's initialization: N(0, initializer_range) weights, zero biases, LayerNorm ones/zeros;
  // the padding row of the word embeddings stays zero.
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    const bool norm = name.find("LayerNorm") != std::string::npos;
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    Tensor t = p;
    if (norm) (is_bias ? nn::init::zeros_(t) : nn::init::ones_(t));
    else if (is_bias) nn::init::zeros_(t);
    else nn::init::normal_(t, 0.0, c.initializer_range);
  }
  bert->embeddings->word_embeddings->weight.select(0, 0).zero_();
}

namespace {

// The tied decoder: logits = t E^T + bias. Outside autocast, F::linear's addmm (the bias broadcast
// into the logits, then += t E^T): one pass over the logits fewer than matmul then add, and no
// second logits-sized tensor (BERT-mini's masked LM: 146 x 30522 floats, 17.8 MB). Under autocast,
// matmul then + bias, as the libtorch and PyTorch peers (train_step_bench, tools/torch_peer.py):
// addmm would round the bias to bfloat16 (bf16 logits where they give float32).
Tensor decoder_logits(const Tensor& t, const Tensor& words, const Tensor& bias) {
  if (!autocast::lower_precision({&t, &words, &bias})) return F::linear(t, words, bias);
  return matmul(t, words.t()) + bias;
}

}  // namespace

BertOutputs BertForPreTraining::forward(const Tensor& input_ids, const Tensor& token_type_ids,
                                        const Tensor& attention_mask) {
  Tensor h = bert->forward(input_ids, token_type_ids, attention_mask);
  Tensor t = transform_norm_->forward(F::gelu(transform_dense_->forward(h)));
  Tensor logits = decoder_logits(t, bert->embeddings->word_embeddings->weight, decoder_bias_);
  return {logits, seq_relationship_->forward(bert->pool(h))};
}

Tensor BertForPreTraining::masked_lm_logits(const Tensor& hidden, const Tensor& positions) {
  if (hidden.dim() != 3) fail("BertForPreTraining::masked_lm_logits: expected hidden [B, T, H], got {}", hidden.sizes());
  Tensor picked = index_select(hidden.reshape({-1, hidden.size(2)}), 0, positions);
  Tensor t = transform_norm_->forward(F::gelu(transform_dense_->forward(picked)));
  return decoder_logits(t, bert->embeddings->word_embeddings->weight, decoder_bias_);
}

namespace {

// The positions of flat labels [N] that are not -100, read on the host (one copy of the labels from
// a device, as PyTorch's nonzero() would), then on the labels' device (an empty tensor when none).
Tensor labelled_positions(const Tensor& flat) {
  const Tensor host = flat.to(kCPU).contiguous();
  std::vector<int64_t> positions;
  const int64_t* y = host.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (y[i] != -100) positions.push_back(i);
  }
  if (positions.empty()) return empty({0}, {.dtype = kInt64, .device = flat.device()});
  return tensor<int64_t>(positions).to(flat.device());
}

}  // namespace

distributed::pipeline::BlockModel BertForPreTraining::pipeline_blocks() {
  namespace pp = distributed::pipeline;
  pp::BlockModel m;
  m.model = shared_from_this();
  auto embeddings = bert->embeddings;
  m.blocks.push_back({"embeddings", {"bert.embeddings"}, [embeddings](const TensorList& in) {
                        pp::expect_inputs("embeddings", in, 3, "input_ids, attention_mask, labels");
                        Tensor h = embeddings->forward(in[0], Tensor());
                        return TensorList{h, additive_mask(in[1], h), in[2]};
                      }});
  for (size_t i = 0; i < bert->layers->size(); ++i) {
    auto layer = std::static_pointer_cast<BertLayer>((*bert->layers)[i]);
    const std::string name = fmt::format("encoder.layer.{}", i);
    m.blocks.push_back({name, {"bert." + name}, [layer, name](const TensorList& in) {
                          pp::expect_inputs(name, in, 3, "hidden states, additive mask, labels");
                          return TensorList{layer->forward(in[0], in[1]), in[1], in[2]};
                        }});
  }
  auto dense = transform_dense_;
  auto norm = transform_norm_;
  Tensor bias = decoder_bias_;
  auto words = bert->embeddings->word_embeddings;
  m.blocks.push_back({"head",
                      {"cls.predictions.transform", "cls.predictions.bias", "bert.embeddings.word_embeddings.weight"},
                      [dense, norm, bias, words](const TensorList& in) {
                        pp::expect_inputs("head", in, 3, "hidden states, additive mask, labels");
                        const Tensor& hidden = in[0];
                        Tensor flat = in[2].reshape({-1}).contiguous();
                        Tensor pos = labelled_positions(flat);
                        // Rows without labels (possible in a replica's share): a zero loss whose zero
                        // gradients still reach every parameter of the head (DDP's reducer waits for
                        // each one in the micro-batch that carries the allreduce).
                        if (pos.numel() == 0) {
                          Tensor zero = hidden.sum() * 0.0;
                          for (const Tensor& p : {dense->weight, dense->bias, norm->weight, norm->bias, bias, words->weight})
                            zero = zero + p.sum() * 0.0;
                          return TensorList{zero.reshape({1}), pos};
                        }
                        Tensor picked = index_select(hidden.reshape({-1, hidden.size(2)}), 0, pos);
                        Tensor t = norm->forward(F::gelu(dense->forward(picked)));
                        return TensorList{decoder_logits(t, words->weight, bias), index_select(flat, 0, pos)};
                      }});
  return m;
}

Tensor BertForPreTraining::pipeline_loss(const TensorList& outputs, const TensorList&) {
  distributed::pipeline::expect_inputs("loss", outputs, 2, "the head's logits and labels");
  if (outputs[1].numel() == 0) return outputs[0].sum();  // no labels in these rows: the head's zero
  return F::cross_entropy(outputs[0], outputs[1]);
}

TensorList BertForPreTraining::masked_lm_outputs(const Tensor& input_ids, const Tensor& attention_mask,
                                                const Tensor& labels) {
  if (labels.sizes() != input_ids.sizes()) {
    fail("BertForPreTraining::masked_lm_loss: labels {} must have the shape of input_ids {}", labels.sizes(),
         input_ids.sizes());
  }
  Tensor flat = labels.reshape({-1}).contiguous();
  Tensor pos = labelled_positions(flat);
  if (pos.numel() == 0) fail("BertForPreTraining::masked_lm_loss: no position has a label (all are -100)");
  return {masked_lm_logits(bert->forward(input_ids, Tensor(), attention_mask), pos), index_select(flat, 0, pos)};
}

Tensor BertForPreTraining::masked_lm_loss(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& labels,
                                          Tensor* logits, Tensor* targets) {
  TensorList out = masked_lm_outputs(input_ids, attention_mask, labels);
  if (logits) *logits = out[0];
  if (targets) *targets = out[1];
  return F::cross_entropy(out[0], out[1]);
}

}  // namespace chorus::models
