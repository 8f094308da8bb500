#include "examples/models/gpt.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::models {
namespace {
namespace F = nn::functional;

// Hugging Face's Conv1D: a linear layer whose weight is [in, out], so y = x W + b. Kept in that
// layout (not nn::Linear's [out, in]) so GPT-2's published weights load without transposing.
class Conv1D : public nn::Module {
 public:
  Conv1D(int64_t in, int64_t out) : nn::Module("Conv1D") {
    weight = register_parameter("weight", zeros({in, out}));
    bias = register_parameter("bias", zeros({out}));
  }
  Tensor forward(const Tensor& x) override {
    // One GEMM over all rows: [.., in] -> [rows, in] @ [in, out] + bias.
    Shape out_shape = x.sizes();
    out_shape.back() = weight.size(1);
    return addmm(bias, x.reshape({-1, x.size(-1)}), weight).reshape(out_shape);
  }
  Tensor weight, bias;
};

class GPT2Attention : public nn::Module {
 public:
  explicit GPT2Attention(const GPTConfig& c) : nn::Module("GPT2Attention"), heads(c.n_head), dropout(c.dropout) {
    c_attn = register_module("c_attn", std::make_shared<Conv1D>(c.n_embd, 3 * c.n_embd));
    c_proj = register_module("c_proj", std::make_shared<Conv1D>(c.n_embd, c.n_embd));
  }
  // x [B, T, C] -> [B, T, C]; query t attends to keys 0..t.
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    // c_attn's output is [q | k | v] along the last dim, each split into heads as Hugging Face does.
    Tensor qkv = c_attn->forward(x).reshape({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4});
    const double p = is_training() ? dropout : 0.0;
    Tensor y = F::scaled_dot_product_attention(qkv.select(0, 0), qkv.select(0, 1), qkv.select(0, 2),
                                               {.dropout_p = p, .is_causal = true});
    return F::dropout(c_proj->forward(y.permute({0, 2, 1, 3}).reshape({b, t, c})), p, p > 0);
  }
  // As forward(x) for positions past .. past + T - 1: the new keys and values go into `keys` and
  // `values` [B, heads, capacity, d] at those positions, and the queries attend to positions
  // 0 .. past + T - 1 of them (query i to keys 0 .. past + i).
  Tensor forward(const Tensor& x, Tensor& keys, Tensor& values, int64_t past) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    Tensor qkv = c_attn->forward(x).reshape({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4});
    keys.narrow(2, past, t).copy_(qkv.select(0, 1));
    values.narrow(2, past, t).copy_(qkv.select(0, 2));
    F::ScaledDotProductAttentionOptions o{.dropout_p = is_training() ? dropout : 0.0};
    if (past == 0) {
      o.is_causal = t > 1;  // the top-left aligned causal mask is the right one
    } else if (t > 1) {
      // Query i sits at position past + i: it may see keys 0 .. past + i.
      const TensorOptions i64{.dtype = kInt64};
      o.attn_mask = le(arange(0, past + t, 1, i64).unsqueeze(0), arange(past, past + t, 1, i64).unsqueeze(1)).to(x.device());
    }  // one new query sees every key: no mask
    Tensor y = F::scaled_dot_product_attention(qkv.select(0, 0), keys.narrow(2, 0, past + t),
                                               values.narrow(2, 0, past + t), o);
    return F::dropout(c_proj->forward(y.permute({0, 2, 1, 3}).reshape({b, t, c})), o.dropout_p, o.dropout_p > 0);
  }
  int64_t heads;
  double dropout;
  std::shared_ptr<Conv1D> c_attn, c_proj;
};

class GPT2MLP : public nn::Module {
 public:
  explicit GPT2MLP(const GPTConfig& c) : nn::Module("GPT2MLP"), dropout(c.dropout) {
    c_fc = register_module("c_fc", std::make_shared<Conv1D>(c.n_embd, 4 * c.n_embd));
    c_proj = register_module("c_proj", std::make_shared<Conv1D>(4 * c.n_embd, c.n_embd));
  }
  Tensor forward(const Tensor& x) override {
    const double p = is_training() ? dropout : 0.0;
    return F::dropout(c_proj->forward(F::gelu(c_fc->forward(x), "tanh")), p, p > 0);
  }
  double dropout;
  std::shared_ptr<Conv1D> c_fc, c_proj;
};

}  // namespace

class GPT2Block : public nn::Module {
 public:
  explicit GPT2Block(const GPTConfig& c) : nn::Module("GPT2Block") {
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, c.layer_norm_epsilon));
    attn = register_module("attn", std::make_shared<GPT2Attention>(c));
    ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, c.layer_norm_epsilon));
    mlp = register_module("mlp", std::make_shared<GPT2MLP>(c));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + attn->forward(ln_1->forward(x));
    return h + mlp->forward(ln_2->forward(h));
  }
  Tensor forward(const Tensor& x, Tensor& keys, Tensor& values, int64_t past) {
    Tensor h = x + attn->forward(ln_1->forward(x), keys, values, past);
    return h + mlp->forward(ln_2->forward(h));
  }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<GPT2Attention> attn;
  std::shared_ptr<GPT2MLP> mlp;
};

GPTConfig GPTConfig::named(const std::string& name) {
  GPTConfig c;
  auto shape = [&](int64_t layers, int64_t width, int64_t heads) {
    c.n_layer = layers;
    c.n_embd = width;
    c.n_head = heads;
  };
  if (name == "gpt2") shape(12, 768, 12);
  else if (name == "gpt2-medium") shape(24, 1024, 16);
  else if (name == "gpt2-large") shape(36, 1280, 20);
  else if (name == "gpt2-xl") shape(48, 1600, 25);
  else if (name == "mini" || name == "tiny") {
    name == "mini" ? shape(4, 256, 4) : shape(2, 64, 4);
    c.vocab_size = 256;
    c.n_positions = name == "mini" ? 256 : 128;
    c.dropout = 0.0;
  } else {
    fail("GPTConfig: unknown configuration '{}' (expected tiny, mini, gpt2, gpt2-medium, gpt2-large or gpt2-xl)", name);
  }
  return c;
}

GPT2Model::GPT2Model(const GPTConfig& c) : nn::Module("GPT2Model"), config(c) {
  if (c.n_embd % c.n_head != 0) fail("GPT2Model: n_embd {} is not a multiple of n_head {}", c.n_embd, c.n_head);
  if (c.vocab_size < 1 || c.n_positions < 1 || c.n_layer < 0) {
    fail("GPT2Model: vocab_size {} and n_positions {} must be positive, n_layer {} not negative", c.vocab_size,
         c.n_positions, c.n_layer);
  }
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.n_positions, c.n_embd));
  h = register_module("h", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<GPT2Block>(c));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(Shape{c.n_embd}, c.layer_norm_epsilon));
}

Tensor GPT2Model::forward(const Tensor& input_ids) {
  if (input_ids.dim() != 2) fail("GPT2Model: input_ids must be [batch, sequence], got {}", shape_str(input_ids.sizes()));
  const int64_t t = input_ids.size(1);
  if (t > config.n_positions) fail("GPT2Model: sequence length {} exceeds n_positions {}", t, config.n_positions);
  Tensor positions = arange(0, t, 1, TensorOptions{.dtype = kInt64}).to(input_ids.device()).unsqueeze(0);
  Tensor x = wte->forward(input_ids) + wpe->forward(positions);
  if (is_training() && config.dropout > 0) x = F::dropout(x, config.dropout);
  for (size_t i = 0; i < h->size(); ++i) x = (*h)[i]->forward(x);
  return ln_f->forward(x);
}

Tensor GPT2Model::forward(const Tensor& input_ids, KVCache& cache) {
  if (autograd::GradMode::is_enabled()) {
    fail("GPT2Model: forward with a KVCache is for inference and writes the cache in place; call it under NoGradGuard");
  }
  if (input_ids.dim() != 2) fail("GPT2Model: input_ids must be [batch, sequence], got {}", shape_str(input_ids.sizes()));
  const int64_t b = input_ids.size(0), t = input_ids.size(1), past = cache.length;
  if (cache.keys.size() != h->size() || cache.values.size() != h->size()) {
    fail("GPT2Model: the KVCache holds {} layers, the model has {} (make it with GPT2LMHeadModel::make_cache)",
         cache.keys.size(), h->size());
  }
  if (b != cache.batch) fail("GPT2Model: input_ids has batch {}, the KVCache was made for batch {}", b, cache.batch);
  if (t < 1) fail("GPT2Model: input_ids has no positions ({})", shape_str(input_ids.sizes()));
  if (past + t > cache.capacity) {
    fail("GPT2Model: {} cached + {} new positions exceed the KVCache's capacity {} (n_positions {})", past, t,
         cache.capacity, config.n_positions);
  }
  Tensor positions = arange(past, past + t, 1, TensorOptions{.dtype = kInt64}).to(input_ids.device()).unsqueeze(0);
  Tensor x = wte->forward(input_ids) + wpe->forward(positions);
  if (is_training() && config.dropout > 0) x = F::dropout(x, config.dropout);
  for (size_t i = 0; i < h->size(); ++i) {
    x = std::static_pointer_cast<GPT2Block>((*h)[i])->forward(x, cache.keys[i], cache.values[i], past);
  }
  cache.length = past + t;
  return ln_f->forward(x);
}

GPT2LMHeadModel::GPT2LMHeadModel(const GPTConfig& c) : nn::Module("GPT2LMHeadModel") {
  transformer = register_module("transformer", std::make_shared<GPT2Model>(c));
  if (!c.initialize) return;
  NoGradGuard no_grad;
  const double residual_std = c.initializer_range / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(c.n_layer, 1)));
  for (auto& [name, p] : named_parameters()) {
    Tensor t = p;
    const bool norm = name.find(".ln_") != std::string::npos;
    if (name.ends_with("bias")) nn::init::zeros_(t);
    else if (norm) nn::init::ones_(t);
    else if (name.ends_with("c_proj.weight")) nn::init::normal_(t, 0.0, residual_std);
    else nn::init::normal_(t, 0.0, c.initializer_range);
  }
}

Tensor GPT2LMHeadModel::forward(const Tensor& input_ids) {
  Tensor hidden = transformer->forward(input_ids);
  const int64_t b = hidden.size(0), t = hidden.size(1);
  // Tied head: logits = hidden @ wte^T, one GEMM over the B*T rows.
  return matmul(hidden.reshape({b * t, hidden.size(2)}), lm_head_weight().t()).reshape({b, t, -1});
}

Tensor GPT2LMHeadModel::forward(const Tensor& input_ids, KVCache& cache) {
  Tensor hidden = transformer->forward(input_ids, cache);
  const int64_t b = hidden.size(0), t = hidden.size(1);
  return matmul(hidden.reshape({b * t, hidden.size(2)}), lm_head_weight().t()).reshape({b, t, -1});
}

KVCache GPT2LMHeadModel::make_cache(int64_t batch, int64_t capacity) const {
  const GPTConfig& c = transformer->config;
  if (capacity == 0) capacity = c.n_positions;
  if (batch < 1 || capacity < 1 || capacity > c.n_positions) {
    fail("GPT2LMHeadModel::make_cache: batch {} must be >= 1 and capacity {} within 1 .. n_positions {}", batch,
         capacity, c.n_positions);
  }
  KVCache cache;
  cache.batch = batch;
  cache.capacity = capacity;
  const TensorOptions options = lm_head_weight().options();
  for (int64_t i = 0; i < c.n_layer; ++i) {
    cache.keys.push_back(zeros({batch, c.n_head, capacity, c.n_embd / c.n_head}, options));
    cache.values.push_back(zeros({batch, c.n_head, capacity, c.n_embd / c.n_head}, options));
  }
  return cache;
}

distributed::pipeline::BlockModel GPT2LMHeadModel::pipeline_blocks() {
  namespace pp = distributed::pipeline;
  pp::BlockModel m;
  m.model = shared_from_this();
  auto wte = transformer->wte, wpe = transformer->wpe;
  const GPTConfig c = transformer->config;
  // As GPT2Model::forward, block by block; each forward holds only the modules it uses.
  m.blocks.push_back({"embeddings", {"transformer.wte", "transformer.wpe"}, [wte, wpe, c](const TensorList& in) {
                        const Tensor& ids = pp::single_input("embeddings", in);
                        if (ids.dim() != 2) fail("GPT2 embeddings: input_ids must be [batch, sequence], got {}", shape_str(ids.sizes()));
                        const int64_t t = ids.size(1);
                        if (t > c.n_positions) fail("GPT2 embeddings: sequence length {} exceeds n_positions {}", t, c.n_positions);
                        Tensor positions = arange(0, t, 1, TensorOptions{.dtype = kInt64}).to(ids.device()).unsqueeze(0);
                        Tensor x = wte->forward(ids) + wpe->forward(positions);
                        if (wte->is_training() && c.dropout > 0) x = F::dropout(x, c.dropout);
                        return TensorList{x};
                      }});
  for (size_t i = 0; i < transformer->h->size(); ++i) {
    std::shared_ptr<nn::Module> block = (*transformer->h)[i];
    const std::string name = fmt::format("h.{}", i);
    m.blocks.push_back({name, {"transformer." + name}, [block, name](const TensorList& in) {
                          return TensorList{block->forward(pp::single_input(name, in))};
                        }});
  }
  auto ln_f = transformer->ln_f;
  m.blocks.push_back({"head", {"transformer.ln_f", "transformer.wte.weight"}, [ln_f, wte](const TensorList& in) {
                        Tensor hidden = ln_f->forward(pp::single_input("head", in));
                        const int64_t b = hidden.size(0), t = hidden.size(1);
                        return TensorList{
                            matmul(hidden.reshape({b * t, hidden.size(2)}), wte->weight.t()).reshape({b, t, -1})};
                      }});
  return m;
}

Tensor GPT2LMHeadModel::pipeline_loss(const TensorList& outputs, const TensorList& targets) {
  distributed::pipeline::expect_inputs("loss", outputs, 1, "the head's logits");
  if (targets.size() != 1) fail("GPT2LMHeadModel::pipeline_loss: expected one target tensor (token ids), got {}", targets.size());
  const Tensor& logits = outputs[0];
  if (targets[0].numel() * logits.size(-1) != logits.numel()) {
    fail("GPT2LMHeadModel::pipeline_loss: targets {} do not match logits {}", shape_str(targets[0].sizes()),
         shape_str(logits.sizes()));
  }
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets[0].reshape({-1}));
}

Tensor GPT2LMHeadModel::loss(const Tensor& input_ids, const Tensor& targets) {
  if (targets.sizes() != input_ids.sizes()) {
    fail("GPT2LMHeadModel::loss: targets {} must have the shape of input_ids {}", shape_str(targets.sizes()),
         shape_str(input_ids.sizes()));
  }
  Tensor logits = forward(input_ids);
  return F::cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
}

std::vector<int64_t> GPT2LMHeadModel::generate(const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  if (prompt.empty()) fail("GPT2LMHeadModel::generate: the prompt needs at least one token");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    fail("GPT2LMHeadModel::generate: temperature {} must be finite and >= 0 (0: greedy)", o.temperature);
  }
  if (o.top_k < 0) fail("GPT2LMHeadModel::generate: top_k {} must be >= 0 (0: all tokens)", o.top_k);
  const int64_t vocab = transformer->config.vocab_size, window = transformer->config.n_positions;
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) fail("GPT2LMHeadModel::generate: prompt token {} is outside the vocabulary of {}", id, vocab);
  }
  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  const Device device = lm_head_weight().device();
  std::vector<int64_t> context = prompt, out;
  KVCache cache;
  // As long as this generation can use it: the prompt and the new tokens, at most the window.
  if (o.use_cache && o.max_new_tokens > 0) {
    cache = make_cache(1, std::min<int64_t>(window, static_cast<int64_t>(prompt.size()) + o.max_new_tokens));
  }
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    const int64_t size = static_cast<int64_t>(context.size());
    // Without a cache, or once the context no longer fits (its positions all shift by one), the
    // last `window` tokens are computed afresh; with one, only the tokens the cache lacks.
    if (o.use_cache && size > window) cache.clear();
    const int64_t start = o.use_cache && size <= window ? cache.length : std::max<int64_t>(0, size - window);
    std::vector<int64_t> ids(context.begin() + start, context.end());
    Tensor ids_t = tensor<int64_t>(ids).to(device).unsqueeze(0);
    Tensor all = o.use_cache ? forward(ids_t, cache) : forward(ids_t);
    Tensor logits = all.select(1, ids_t.size(1) - 1).select(0, 0).to(kCPU).to(kFloat32);
    int64_t next;
    if (o.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      Tensor scaled = logits / o.temperature;
      if (o.top_k > 0 && o.top_k < vocab) {
        // Everything below the k-th largest logit gets probability zero.
        const float kth = topk(scaled, o.top_k).first[o.top_k - 1].item<float>();
        scaled = scaled.masked_fill(scaled.lt(kth), -std::numeric_limits<float>::infinity());
      }
      next = multinomial(softmax(scaled, 0), 1, false, o.generator).item<int64_t>();
    }
    context.push_back(next);
    out.push_back(next);
  }
  train(was_training);
  return out;
}

}  // namespace chorus::models
