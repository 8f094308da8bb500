// examples/models/gpt: the GPT-2 124M preset has GPT-2's 124,439,808 parameters under Hugging
// Face's names and shapes (Conv1D weights [in, out], the LM head tied to wte); a later token never
// changes an earlier position's logits; GPT-2's initialization; sampling with top-k 1 is greedy;
// a KVCache gives the whole forward's logits piece by piece, and the same greedy tokens.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>

#include "autograd/grad_mode.h"
#include "examples/models/gpt.h"
#include "tensor/ops.h"

using namespace chorus;

namespace {

std::map<std::string, Shape> shapes(const nn::Module& m) {
  std::map<std::string, Shape> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = p.sizes();
  return out;
}

models::GPTConfig tiny() {
  models::GPTConfig c = models::GPTConfig::named("tiny");
  c.n_positions = 16;
  c.vocab_size = 50;
  return c;
}

}  // namespace

TEST_CASE("gpt2 preset: 124,439,808 parameters under Hugging Face's names and shapes", "[gpt]") {
  models::GPTConfig c = models::GPTConfig::named("gpt2");
  c.initialize = false;  // the shapes are the point; drawing 124M numbers takes seconds
  models::GPT2LMHeadModel model(c);
  int64_t count = 0;
  for (const Tensor& p : model.parameters()) count += p.numel();
  CHECK(count == 124439808);
  const auto s = shapes(model);
  CHECK(s.size() == 2 + 12 * 12 + 2);  // wte, wpe, 12 tensors per block, ln_f
  CHECK(s.at("transformer.wte.weight") == Shape{50257, 768});
  CHECK(s.at("transformer.wpe.weight") == Shape{1024, 768});
  CHECK(s.at("transformer.h.0.ln_1.weight") == Shape{768});
  CHECK(s.at("transformer.h.0.attn.c_attn.weight") == Shape{768, 2304});  // Conv1D: [in, out]
  CHECK(s.at("transformer.h.0.attn.c_attn.bias") == Shape{2304});
  CHECK(s.at("transformer.h.5.attn.c_proj.weight") == Shape{768, 768});
  CHECK(s.at("transformer.h.11.ln_2.bias") == Shape{768});
  CHECK(s.at("transformer.h.11.mlp.c_fc.weight") == Shape{768, 3072});
  CHECK(s.at("transformer.h.11.mlp.c_proj.weight") == Shape{3072, 768});
  CHECK(s.at("transformer.ln_f.weight") == Shape{768});
  // The head is the embedding: one tensor, not a second parameter.
  CHECK(s.count("lm_head.weight") == 0);
  CHECK(model.lm_head_weight().data_ptr<float>() == model.transformer->wte->weight.data_ptr<float>());
  CHECK(model.state_dict().size() == s.size());
}

TEST_CASE("gpt: GPT-2's initialization, residual projections scaled by 1/sqrt(2 n_layer)", "[gpt]") {
  manual_seed(1);
  models::GPTConfig c = models::GPTConfig::named("mini");  // 4 layers: c_proj std 0.02 / sqrt(8)
  models::GPT2LMHeadModel model(c);
  std::map<std::string, Tensor> p;
  for (const auto& [name, t] : model.named_parameters()) p[name] = t;
  CHECK(p["transformer.h.0.attn.c_attn.weight"].std().item<double>() == Approx(0.02).epsilon(0.02));
  CHECK(p["transformer.h.3.mlp.c_proj.weight"].std().item<double>() == Approx(0.02 / std::sqrt(8.0)).epsilon(0.02));
  CHECK(p["transformer.h.3.attn.c_proj.weight"].std().item<double>() == Approx(0.02 / std::sqrt(8.0)).epsilon(0.03));
  CHECK(p["transformer.wte.weight"].std().item<double>() == Approx(0.02).epsilon(0.02));
  CHECK(p["transformer.h.1.mlp.c_fc.bias"].abs().max().item<float>() == 0.0f);
  CHECK(p["transformer.h.1.ln_2.weight"].min().item<float>() == 1.0f);
  CHECK(p["transformer.ln_f.bias"].abs().max().item<float>() == 0.0f);
}

TEST_CASE("gpt: changing a later token leaves earlier positions' logits unchanged", "[gpt]") {
  manual_seed(2);
  models::GPT2LMHeadModel model(tiny());
  model.eval();
  NoGradGuard no_grad;
  Tensor a = randint(0, 50, {2, 12});
  Tensor b = a.clone();
  b.select(1, 7).copy_(remainder(a.select(1, 7).add(1), 50));  // a different token at position 7
  Tensor la = model.forward(a), lb = model.forward(b);
  REQUIRE(la.sizes() == Shape{2, 12, 50});
  CHECK(la.narrow(1, 0, 7).sub(lb.narrow(1, 0, 7)).abs().max().item<float>() == 0.0f);
  CHECK(la.narrow(1, 7, 5).sub(lb.narrow(1, 7, 5)).abs().max().item<float>() > 1e-4f);
}

TEST_CASE("gpt: the loss trains, and gradients reach the tied embedding through the head", "[gpt]") {
  manual_seed(3);
  models::GPT2LMHeadModel model(tiny());
  Tensor x = randint(0, 50, {2, 12});
  Tensor loss = model.loss(x, roll(x, {-1}, {1}));
  CHECK(loss.item<double>() == Approx(std::log(50.0)).margin(0.1));
  loss.backward();
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
  }
  // Rows of tokens absent from the input still get a gradient, through the head only.
  CHECK(model.transformer->wte->weight.grad().abs().sum({1}).min().item<float>() > 0.0f);
}

TEST_CASE("gpt: top-k 1 sampling is greedy decoding, and a seeded sample repeats", "[gpt]") {
  manual_seed(4);
  models::GPT2LMHeadModel model(tiny());
  const std::vector<int64_t> prompt = {3, 1, 4, 1, 5};
  const auto greedy = model.generate(prompt, {.max_new_tokens = 20, .temperature = 0});
  Generator g1(7);
  const auto top1 = model.generate(prompt, {.max_new_tokens = 20, .temperature = 1.5, .top_k = 1, .generator = &g1});
  CHECK(greedy.size() == 20);
  CHECK(top1 == greedy);
  Generator h1(9), h2(9);
  const auto s1 = model.generate(prompt, {.max_new_tokens = 20, .temperature = 1.0, .top_k = 10, .generator = &h1});
  const auto s2 = model.generate(prompt, {.max_new_tokens = 20, .temperature = 1.0, .top_k = 10, .generator = &h2});
  CHECK(s1 == s2);
  CHECK(s1 != greedy);
  // The context window slides past n_positions (16) without error.
  CHECK(model.generate(prompt, {.max_new_tokens = 30, .temperature = 0}).size() == 30);
  CHECK(model.is_training());
}

// Larger weights than GPT-2's N(0, 0.02), so that attention is far from uniform and a key seen
// that should not be (or a position off by one) moves the logits by much more than round-off.
models::GPTConfig sharp() {
  models::GPTConfig c = tiny();
  c.initializer_range = 0.5;
  return c;
}

TEST_CASE("gpt: a KVCache fed in pieces gives the whole forward's logits", "[gpt][kv]") {
  manual_seed(5);
  models::GPT2LMHeadModel model(sharp());
  model.eval();
  NoGradGuard no_grad;
  Tensor ids = randint(0, 50, {2, 16});
  // Pieces of 5 (the prompt: a causal mask), 1 (no mask), 4 (an offset mask) and 6 (up to capacity).
  const std::vector<int64_t> pieces = {5, 1, 4, 6};
  for (const DType dtype : {kFloat64, kFloat32}) {
    INFO("dtype " << dtype_name(dtype));
    model.to(dtype);
    const Tensor whole = model.forward(ids);
    const double scale = whole.abs().max().item<double>();
    REQUIRE(scale > 1.0);
    models::KVCache cache = model.make_cache(2);
    REQUIRE(cache.keys.size() == 2);
    CHECK(cache.keys[0].sizes() == Shape{2, 4, 16, 16});
    CHECK(cache.keys[0].dtype() == dtype);
    int64_t at = 0;
    for (int64_t n : pieces) {
      INFO("positions " << at << " .. " << at + n - 1);
      const Tensor part = model.forward(ids.narrow(1, at, n), cache);
      at += n;
      CHECK(cache.length == at);
      REQUIRE(part.sizes() == Shape{2, n, 50});
      // float64: agreement to round-off of the different GEMM shapes; float32 the same at its epsilon.
      const double tol = (dtype == kFloat64 ? 1e-13 : 2e-6) * scale;
      CHECK(part.sub(whole.narrow(1, at - n, n)).abs().max().item<double>() <= tol);
    }
    CHECK_THROWS_WITH(model.forward(ids.narrow(1, 0, 1), cache), Catch::Contains("16 cached + 1 new positions exceed"));
    cache.clear();
    CHECK(model.forward(ids.narrow(1, 3, 2), cache).sub(model.forward(ids.narrow(1, 3, 2))).abs().max().item<double>() <=
          (dtype == kFloat64 ? 1e-13 : 2e-6) * scale);
  }
}

TEST_CASE("gpt: generation through the KVCache picks the uncached path's tokens", "[gpt][kv]") {
  manual_seed(6);
  models::GPT2LMHeadModel model(sharp());
  const std::vector<int64_t> prompt = {7, 2, 9};
  // 30 new tokens: the context passes n_positions (16), so the window slides on both paths.
  const auto cached = model.generate(prompt, {.max_new_tokens = 30, .temperature = 0});
  const auto uncached = model.generate(prompt, {.max_new_tokens = 30, .temperature = 0, .use_cache = false});
  CHECK(cached.size() == 30);
  CHECK(cached == uncached);
  // Not a constant sequence (which any cache bug could still produce).
  CHECK(std::set<int64_t>(cached.begin(), cached.end()).size() >= 5);
  Generator g1(11), g2(11);
  CHECK(model.generate(prompt, {.max_new_tokens = 30, .temperature = 1.0, .top_k = 5, .generator = &g1}) ==
        model.generate(prompt, {.max_new_tokens = 30, .temperature = 1.0, .top_k = 5, .generator = &g2, .use_cache = false}));
}

TEST_CASE("gpt: a KVCache used wrongly is refused with a message", "[gpt][kv]") {
  models::GPT2LMHeadModel model(tiny());
  models::KVCache cache = model.make_cache(1, 8);
  const Tensor ids = zeros({1, 3}, {.dtype = kInt64});
  CHECK_THROWS_WITH(model.forward(ids, cache), Catch::Contains("call it under NoGradGuard"));
  NoGradGuard no_grad;
  CHECK_THROWS_WITH(model.forward(zeros({2, 3}, {.dtype = kInt64}), cache), Catch::Contains("batch 2, the KVCache was made for batch 1"));
  CHECK_THROWS_WITH(model.forward(zeros({1, 9}, {.dtype = kInt64}), cache), Catch::Contains("0 cached + 9 new positions exceed the KVCache's capacity 8"));
  CHECK_THROWS_WITH(model.make_cache(1, 17), Catch::Contains("capacity 17 within 1 .. n_positions 16"));
  CHECK_THROWS_WITH(model.make_cache(0), Catch::Contains("batch 0 must be >= 1"));
  models::GPTConfig deeper = tiny();
  deeper.n_layer = 3;
  models::KVCache other = models::GPT2LMHeadModel(deeper).make_cache(1);
  CHECK_THROWS_WITH(model.forward(ids, other), Catch::Contains("holds 3 layers, the model has 2"));
  CHECK(cache.length == 0);  // nothing was written by a refused call
}

TEST_CASE("gpt: bad configurations and inputs are refused with a message", "[gpt]") {
  CHECK_THROWS_WITH(models::GPTConfig::named("gpt5"), Catch::Contains("unknown configuration 'gpt5'"));
  models::GPTConfig c = tiny();
  c.n_head = 5;
  CHECK_THROWS_WITH(models::GPT2LMHeadModel(c), Catch::Contains("not a multiple of n_head"));
  models::GPT2LMHeadModel model(tiny());
  CHECK_THROWS_WITH(model.forward(zeros({1, 17}, {.dtype = kInt64})), Catch::Contains("exceeds n_positions 16"));
  CHECK_THROWS_WITH(model.generate({}, {}), Catch::Contains("at least one token"));
  CHECK_THROWS_WITH(model.generate({50}, {}), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_WITH(model.generate({1}, {.temperature = -1}), Catch::Contains("temperature"));
}
