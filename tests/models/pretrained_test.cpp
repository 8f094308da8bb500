// Published-format weights into chorus's models (examples/models/pretrained.h), against PyTorch:
// tests/models/make_pretrained.py (Debian's python3-torch and python3-torchvision, run here at test
// time; nothing downloaded) builds Hugging Face's GPT2LMHeadModel and BertForMaskedLM layouts and
// torchvision's ResNet-18 and ResNet-50 with random weights, writes them as save_pretrained and a
// state-dict conversion would, and writes PyTorch's float32 outputs on fixed inputs. chorus loads
// each file by name and must give the same outputs within float32 round-off; files of another
// model, size or family, and tied copies that disagree, are refused with the file's name.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>

#include "autograd/grad_mode.h"
#include "examples/models/pretrained.h"
#include "nn/serialize.h"
#include "tensor/ops.h"
#include "tests/utils/tfevents_testing.h"

namespace chorus {
namespace {

// The folder make_pretrained.py wrote (once per test process).
const std::string& files() {
  static const std::string dir = chorus::testing::python_made_folder("pretrained", "tests/models/make_pretrained.py",
                                                                     "python3-torch and python3-torchvision");
  return dir;
}

Tensor expected(const std::string& name) {
  static const std::map<std::string, Tensor> all = [] {
    const nn::SafetensorsFile f = nn::load_safetensors(files() + "/expected.safetensors");
    return std::map<std::string, Tensor>(f.tensors.begin(), f.tensors.end());
  }();
  INFO(name);
  REQUIRE(all.count(name) == 1);
  return all.at(name);
}

// max |ours - theirs| over the largest |theirs|: float32 round-off of the same arithmetic in
// another order is ~1e-6 here; a wrong, transposed or missing tensor moves it to O(1).
double relative_error(const Tensor& ours, const Tensor& theirs) {
  REQUIRE(ours.sizes() == theirs.sizes());
  const double largest = theirs.to(kFloat64).abs().max().item<double>();
  REQUIRE(largest > 0.5);
  return ours.to(kFloat64).sub(theirs.to(kFloat64)).abs().max().item<double>() / largest;
}

TEST_CASE("pretrained: Hugging Face GPT2LMHeadModel files give PyTorch's logits", "[pretrained]") {
  for (const std::string layout : {"gpt2", "gpt2_base"}) {
    INFO("layout " << layout);
    models::LoadReport report;
    auto model = models::gpt2_from_pretrained(files() + "/" + layout, &report);
    CHECK(model->transformer->config.n_layer == 3);
    CHECK(model->transformer->config.n_embd == 48);
    CHECK(model->transformer->config.vocab_size == 97);
    CHECK(report.initialized.empty());
    // The bare layout carries the old causal-mask buffers, which chorus computes instead.
    CHECK(report.skipped.size() == (layout == "gpt2" ? 0u : 6u));
    model->eval();
    NoGradGuard no_grad;
    const Tensor logits = model->forward(expected("gpt2.input_ids"));
    CHECK(relative_error(logits, expected("gpt2.logits")) < 2e-6);
    // The KV-cached path on the loaded weights: the last position's logits, one token at a time.
    models::KVCache cache = model->make_cache(2);
    Tensor last;
    for (int64_t t = 0; t < 11; ++t) last = model->forward(expected("gpt2.input_ids").narrow(1, t, 1), cache);
    CHECK(relative_error(last.select(1, 0), expected("gpt2.logits").select(1, 10)) < 2e-6);
  }
}

TEST_CASE("pretrained: a Hugging Face BertForMaskedLM file gives PyTorch's logits", "[pretrained]") {
  models::LoadReport report;
  auto model = models::bert_from_pretrained(files() + "/bert", &report);
  CHECK(model->bert->config.num_hidden_layers == 2);
  CHECK(model->bert->config.hidden_size == 32);
  // BertForMaskedLM has no pooler and no next-sentence head: they stay as initialized, and say so.
  CHECK(report.initialized == std::vector<std::string>{"bert.pooler.dense.weight", "bert.pooler.dense.bias",
                                                        "cls.seq_relationship.weight", "cls.seq_relationship.bias"});
  CHECK(report.skipped == std::vector<std::string>{"bert.embeddings.position_ids"});
  model->eval();
  NoGradGuard no_grad;
  const Tensor logits = model->forward(expected("bert.input_ids"), expected("bert.token_type_ids"), expected("bert.attention_mask"))
                            .prediction_logits;
  CHECK(relative_error(logits, expected("bert.logits")) < 2e-6);
}

TEST_CASE("pretrained: torchvision ResNet-18 and ResNet-50 state dicts give PyTorch's logits", "[pretrained]") {
  for (const std::string name : {"resnet18", "resnet50"}) {
    INFO(name);
    auto model = name == "resnet18" ? models::resnet18() : models::resnet50();
    const models::LoadReport report = models::load_resnet_weights(*model, files() + "/" + name + ".safetensors");
    CHECK(report.initialized.empty());
    CHECK(report.skipped.empty());
    CHECK(model->bn1->num_batches_tracked.item<int64_t>() == 17);
    model->eval();
    NoGradGuard no_grad;
    CHECK(relative_error(model->forward(expected("resnet.input")), expected(name + ".logits")) < 5e-6);
  }
}

// Writes `tensors` as a safetensors file in a fresh folder next to a copy of `config`; returns the folder.
std::string variant(const std::string& name, const nn::NamedTensors& tensors, const std::string& config_from) {
  const std::string dir = chorus::testing::scratch_dir("pretrained_" + name);
  nn::save_safetensors(dir + "/model.safetensors", tensors);
  std::filesystem::copy_file(config_from, dir + "/config.json", std::filesystem::copy_options::overwrite_existing);
  return dir;
}

TEST_CASE("pretrained: weights of another model, size or family are refused, naming the file", "[pretrained]") {
  const std::string gpt_file = files() + "/gpt2/model.safetensors";
  // Another depth: the file has layer 2, the model not.
  models::GPTConfig shallow = models::gpt2_config_from_json(files() + "/gpt2/config.json");
  shallow.n_layer = 2;
  models::GPT2LMHeadModel two(shallow);
  CHECK_THROWS_WITH(models::load_gpt2_weights(two, gpt_file),
                    Catch::Contains(gpt_file) && Catch::Contains("these are not the weights of Hugging Face GPT-2 with n_layer 2") &&
                        Catch::Contains("in the file but not in the model: transformer.h.2.ln_1.weight"));
  // Another width: every shape differs, and the message says which.
  models::GPTConfig wide = shallow;
  wide.n_layer = 3;
  wide.n_embd = 64;
  models::GPT2LMHeadModel w(wide);
  CHECK_THROWS_WITH(models::load_gpt2_weights(w, gpt_file),
                    Catch::Contains("transformer.wte.weight has shape [97, 48] in the file, the model's is [97, 64]"));
  // Another family: BERT's file into GPT-2.
  models::GPT2LMHeadModel right(models::gpt2_config_from_json(files() + "/gpt2/config.json"));
  CHECK_THROWS_WITH(models::load_gpt2_weights(right, files() + "/bert/model.safetensors"),
                    Catch::Contains("missing from the file: transformer.wte.weight") &&
                        Catch::Contains("in the file but not in the model: bert.embeddings"));
  // ResNet-50's state dict into ResNet-18.
  CHECK_THROWS_WITH(models::load_resnet_weights(*models::resnet18(), files() + "/resnet50.safetensors"),
                    Catch::Contains("not the weights of a torchvision ResNet with 11689512 parameters") &&
                        Catch::Contains("has shape [64, 64, 1, 1] in the file, the model's is [64, 64, 3, 3]"));
  // A tied copy with other values: chorus has one tensor, so it cannot hold both.
  nn::NamedTensors tensors = nn::load_safetensors(gpt_file).tensors;
  const Tensor wte = std::find_if(tensors.begin(), tensors.end(), [](const auto& p) { return p.first == "transformer.wte.weight"; })->second;
  tensors.push_back({"lm_head.weight", wte.clone()});
  const std::string same = variant("tied_same", tensors, files() + "/gpt2/config.json");
  CHECK_NOTHROW(models::gpt2_from_pretrained(same));
  tensors.back().second = wte.mul(2.0);
  const std::string other = variant("tied_other", tensors, files() + "/gpt2/config.json");
  CHECK_THROWS_WITH(models::gpt2_from_pretrained(other),
                    Catch::Contains("lm_head.weight differs from transformer.wte.weight; chorus ties them"));
  // Integer data for a float parameter.
  nn::NamedTensors ints = nn::load_safetensors(gpt_file).tensors;
  for (auto& [name, t] : ints) {
    if (name == "transformer.ln_f.bias") t = zeros({48}, {.dtype = kInt64});
  }
  CHECK_THROWS_WITH(models::gpt2_from_pretrained(variant("int_bias", ints, files() + "/gpt2/config.json")),
                    Catch::Contains("transformer.ln_f.bias has dtype int64 in the file, the model's is float32"));
  // No weights file in the folder.
  const std::string empty = chorus::testing::scratch_dir("pretrained_empty");
  std::filesystem::copy_file(files() + "/gpt2/config.json", empty + "/config.json", std::filesystem::copy_options::overwrite_existing);
  CHECK_THROWS_WITH(models::gpt2_from_pretrained(empty), Catch::Contains(empty + "/model.safetensors"));
}

TEST_CASE("pretrained: config.json that chorus's models cannot follow is refused, naming the file and key", "[pretrained]") {
  const std::string dir = chorus::testing::scratch_dir("pretrained_configs");
  auto write = [&](const std::string& name, const std::string& text) {
    chorus::testing::write_file(dir + "/" + name, text);
    return dir + "/" + name;
  };
  CHECK_THROWS_WITH(models::gpt2_config_from_json(dir + "/absent.json"), Catch::Contains(dir + "/absent.json: cannot open it"));
  CHECK_THROWS_WITH(models::gpt2_config_from_json(write("broken.json", "{\"n_embd\": ")), Catch::Contains("broken.json: not valid JSON"));
  CHECK_THROWS_WITH(models::gpt2_config_from_json(write("bert.json", "{\"model_type\": \"bert\"}")),
                    Catch::Contains("model_type is \"bert\", expected \"gpt2\""));
  CHECK_THROWS_WITH(models::gpt2_config_from_json(write("relu.json", "{\"activation_function\": \"relu\"}")),
                    Catch::Contains("activation_function \"relu\""));
  CHECK_THROWS_WITH(models::gpt2_config_from_json(write("inner.json", "{\"n_embd\": 64, \"n_inner\": 100}")),
                    Catch::Contains("n_inner 100 is not 4 x n_embd (256)"));
  CHECK_THROWS_WITH(models::gpt2_config_from_json(write("float.json", "{\"n_layer\": 2.5}")),
                    Catch::Contains("\"n_layer\" is 2.5, expected an integer"));
  CHECK_THROWS_WITH(models::gpt2_config_from_json(write("upcast.json", "{\"reorder_and_upcast_attn\": true}")),
                    Catch::Contains("\"reorder_and_upcast_attn\" is true; chorus implements only false"));
  CHECK_THROWS_WITH(models::gpt2_config_from_json(write("untied.json", "{\"tie_word_embeddings\": false}")),
                    Catch::Contains("\"tie_word_embeddings\" is false; chorus implements only true"));
  CHECK_THROWS_WITH(models::bert_config_from_json(write("untied_bert.json", "{\"tie_word_embeddings\": false}")),
                    Catch::Contains("\"tie_word_embeddings\" is false; chorus implements only true"));
  CHECK_THROWS_WITH(models::bert_config_from_json(write("act.json", "{\"hidden_act\": \"relu\"}")), Catch::Contains("hidden_act \"relu\""));
  CHECK_THROWS_WITH(models::bert_config_from_json(write("rel.json", "{\"position_embedding_type\": \"relative_key\"}")),
                    Catch::Contains("position_embedding_type \"relative_key\""));
  const models::GPTConfig c = models::gpt2_config_from_json(write("ok.json", "{\"n_ctx\": 64, \"n_layer\": 2, \"n_inner\": null}"));
  CHECK(c.n_positions == 64);
  CHECK(c.n_layer == 2);
  CHECK(c.n_embd == 768);
}

}  // namespace
}  // namespace chorus
