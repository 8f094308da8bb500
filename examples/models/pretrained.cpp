#include "examples/models/pretrained.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "nn/serialize.h"
#include "tensor/ops.h"

namespace chorus::models {
namespace {

using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open it ({})", path, std::strerror(errno));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
}

// config.json fields: the value when present and not null, else the fallback; a value of another
// kind is an error naming the file, the key and the value.
int64_t int_field(const json& j, const std::string& key, int64_t fallback, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) fail("{}: \"{}\" is {}, expected an integer", path, key, it->dump());
  return it->get<int64_t>();
}
double double_field(const json& j, const std::string& key, double fallback, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) fail("{}: \"{}\" is {}, expected a number", path, key, it->dump());
  return it->get<double>();
}
std::string string_field(const json& j, const std::string& key, const std::string& fallback, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail("{}: \"{}\" is {}, expected a string", path, key, it->dump());
  return it->get<std::string>();
}
void expect_bool(const json& j, const std::string& key, bool supported, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_boolean() || it->get<bool>() != supported) {
    fail("{}: \"{}\" is {}; chorus implements only {}", path, key, it->dump(), supported);
  }
}
void expect_model_type(const json& j, const std::string& type, const std::string& path) {
  const std::string given = string_field(j, "model_type", type, path);
  if (given != type) fail("{}: model_type is \"{}\", expected \"{}\"", path, given, type);
}

// How a family's files name their tensors relative to chorus's model.
struct Layout {
  std::string what;    // "Hugging Face GPT-2 (n_layer 12, ...)", for messages
  std::string prefix;  // the head model's prefix, which the bare base model's files lack
  std::vector<std::string> skipped_suffixes;             // buffers chorus computes instead
  std::map<std::string, std::string> tied;               // a head's copy -> the model tensor it is
  std::vector<std::string> optional_prefixes;            // model tensors a file may lack
};

std::string some(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::vector<std::string> shown(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(std::min(names.size(), kShown)));
  std::string s = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > kShown) s += fmt::format(", ... ({} in all)", names.size());
  return s;
}

LoadReport load_mapped(nn::Module& model, const std::string& path, const Layout& layout) {
  nn::SafetensorsFile file = nn::load_safetensors(path);
  const nn::NamedTensors own = model.state_dict();
  std::map<std::string, Tensor> want(own.begin(), own.end());
  std::map<std::string, Tensor> given;
  struct Tie {
    std::string model_name, file_name;
    Tensor tensor;
  };
  std::vector<Tie> ties;
  std::vector<std::string> unexpected, problems, missing;
  LoadReport report;
  auto check = [&](const std::string& file_name, const Tensor& t, const Tensor& target) {
    if (t.sizes() != target.sizes()) {
      problems.push_back(fmt::format("{} has shape {} in the file, the model's is {}", file_name, shape_str(t.sizes()),
                                     shape_str(target.sizes())));
    } else if (t.is_floating_point() != target.is_floating_point()) {
      problems.push_back(fmt::format("{} has dtype {} in the file, the model's is {}", file_name, dtype_name(t.dtype()),
                                     dtype_name(target.dtype())));
    }
  };
  for (const auto& [file_name, t] : file.tensors) {
    if (std::any_of(layout.skipped_suffixes.begin(), layout.skipped_suffixes.end(),
                    [&file_name = file_name](const std::string& s) { return file_name.ends_with(s); })) {
      report.skipped.push_back(file_name);
      continue;
    }
    std::string name = file_name;
    if (name.ends_with(".gamma")) name = name.substr(0, name.size() - 6) + ".weight";
    if (name.ends_with(".beta")) name = name.substr(0, name.size() - 5) + ".bias";
    const auto known = [&](const std::string& n) { return want.count(n) > 0 || layout.tied.count(n) > 0; };
    if (!known(name) && known(layout.prefix + name)) name = layout.prefix + name;
    if (const auto tie = layout.tied.find(name); tie != layout.tied.end()) {
      ties.push_back({tie->second, file_name, t});
      continue;
    }
    if (!want.count(name)) {
      unexpected.push_back(file_name);
      continue;
    }
    if (given.count(name)) {
      problems.push_back(fmt::format("{} is in the file twice (once as {})", name, file_name));
      continue;
    }
    check(file_name, t, want.at(name));
    given[name] = t;
  }
  // A head's copy of a tied tensor: the same values as the tensor itself, or that tensor when the
  // file has only the copy.
  for (const Tie& tie : ties) {
    const auto it = given.find(tie.model_name);
    if (it == given.end()) {
      check(tie.file_name, tie.tensor, want.at(tie.model_name));
      given[tie.model_name] = tie.tensor;
    } else if (it->second.sizes() != tie.tensor.sizes() ||
               it->second.to(kFloat64).sub(tie.tensor.to(kFloat64)).abs().max().item<double>() != 0.0) {
      problems.push_back(fmt::format("{} differs from {}; chorus ties them (one tensor), so they must be equal",
                                     tie.file_name, tie.model_name));
    }
  }
  for (const auto& [name, t] : own) {
    if (given.count(name)) continue;
    const bool optional = std::any_of(layout.optional_prefixes.begin(), layout.optional_prefixes.end(),
                                      [&name = name](const std::string& p) { return name.starts_with(p); });
    (optional ? report.initialized : missing).push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !problems.empty()) {
    std::string msg = fmt::format("{}: these are not the weights of {}:", path, layout.what);
    if (!missing.empty()) msg += "\n  missing from the file: " + some(missing);
    if (!unexpected.empty()) msg += "\n  in the file but not in the model: " + some(unexpected);
    for (const std::string& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }
  NoGradGuard no_grad;
  for (auto& [name, t] : want) {
    if (const auto it = given.find(name); it != given.end()) t.copy_(it->second);
  }
  return report;
}

}  // namespace

GPTConfig gpt2_config_from_json(const std::string& path) {
  const json j = read_json(path);
  expect_model_type(j, "gpt2", path);
  GPTConfig c;
  c.vocab_size = int_field(j, "vocab_size", c.vocab_size, path);
  c.n_positions = int_field(j, "n_positions", int_field(j, "n_ctx", c.n_positions, path), path);
  c.n_embd = int_field(j, "n_embd", c.n_embd, path);
  c.n_layer = int_field(j, "n_layer", c.n_layer, path);
  c.n_head = int_field(j, "n_head", c.n_head, path);
  c.layer_norm_epsilon = double_field(j, "layer_norm_epsilon", c.layer_norm_epsilon, path);
  c.initializer_range = double_field(j, "initializer_range", c.initializer_range, path);
  c.dropout = double_field(j, "resid_pdrop", c.dropout, path);
  const std::string act = string_field(j, "activation_function", "gelu_new", path);
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    fail("{}: activation_function \"{}\"; chorus's GPT-2 uses the tanh approximation (\"gelu_new\" or "
         "\"gelu_pytorch_tanh\")", path, act);
  }
  const int64_t inner = int_field(j, "n_inner", 4 * c.n_embd, path);
  if (inner != 4 * c.n_embd) fail("{}: n_inner {} is not 4 x n_embd ({}), the only MLP width chorus's GPT-2 has", path, inner, 4 * c.n_embd);
  expect_bool(j, "scale_attn_weights", true, path);
  expect_bool(j, "tie_word_embeddings", true, path);
  expect_bool(j, "scale_attn_by_inverse_layer_idx", false, path);
  expect_bool(j, "reorder_and_upcast_attn", false, path);
  c.initialize = false;  // the weights are about to be loaded
  return c;
}

BertConfig bert_config_from_json(const std::string& path) {
  const json j = read_json(path);
  expect_model_type(j, "bert", path);
  BertConfig c;
  c.vocab_size = int_field(j, "vocab_size", c.vocab_size, path);
  c.hidden_size = int_field(j, "hidden_size", c.hidden_size, path);
  c.num_hidden_layers = int_field(j, "num_hidden_layers", c.num_hidden_layers, path);
  c.num_attention_heads = int_field(j, "num_attention_heads", c.num_attention_heads, path);
  c.intermediate_size = int_field(j, "intermediate_size", c.intermediate_size, path);
  c.max_position_embeddings = int_field(j, "max_position_embeddings", c.max_position_embeddings, path);
  c.type_vocab_size = int_field(j, "type_vocab_size", c.type_vocab_size, path);
  c.hidden_dropout_prob = double_field(j, "hidden_dropout_prob", c.hidden_dropout_prob, path);
  c.attention_probs_dropout_prob = double_field(j, "attention_probs_dropout_prob", c.attention_probs_dropout_prob, path);
  c.layer_norm_eps = double_field(j, "layer_norm_eps", c.layer_norm_eps, path);
  c.initializer_range = double_field(j, "initializer_range", c.initializer_range, path);
  expect_bool(j, "tie_word_embeddings", true, path);
  const std::string act = string_field(j, "hidden_act", "gelu", path);
  if (act != "gelu") fail("{}: hidden_act \"{}\"; chorus's BERT uses \"gelu\" (the erf form)", path, act);
  const std::string pos = string_field(j, "position_embedding_type", "absolute", path);
  if (pos != "absolute") fail("{}: position_embedding_type \"{}\"; chorus's BERT has \"absolute\" only", path, pos);
  return c;
}

LoadReport load_gpt2_weights(GPT2LMHeadModel& model, const std::string& safetensors_path) {
  const GPTConfig& c = model.transformer->config;
  return load_mapped(model, safetensors_path,
                     {.what = fmt::format("Hugging Face GPT-2 with n_layer {}, n_embd {}, n_head {}, vocab_size {}, n_positions {}",
                                          c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.n_positions),
                      .prefix = "transformer.",
                      .skipped_suffixes = {".attn.bias", ".attn.masked_bias"},
                      .tied = {{"lm_head.weight", "transformer.wte.weight"}},
                      .optional_prefixes = {}});
}

LoadReport load_bert_weights(BertForPreTraining& model, const std::string& safetensors_path) {
  const BertConfig& c = model.bert->config;
  return load_mapped(model, safetensors_path,
                     {.what = fmt::format("Hugging Face BERT (BertForMaskedLM or BertForPreTraining) with {} layers, "
                                          "hidden_size {}, vocab_size {}",
                                          c.num_hidden_layers, c.hidden_size, c.vocab_size),
                      .prefix = "bert.",
                      .skipped_suffixes = {"embeddings.position_ids"},
                      .tied = {{"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"},
                               {"cls.predictions.decoder.bias", "cls.predictions.bias"}},
                      .optional_prefixes = {"bert.pooler.", "cls.seq_relationship."}});
}

LoadReport load_resnet_weights(ResNet& model, const std::string& safetensors_path) {
  int64_t params = 0;
  for (const Tensor& p : model.parameters()) params += p.numel();
  return load_mapped(model, safetensors_path,
                     {.what = fmt::format("a torchvision ResNet with {} parameters", params),
                      .prefix = "",
                      .skipped_suffixes = {},
                      .tied = {},
                      .optional_prefixes = {}});
}

std::shared_ptr<GPT2LMHeadModel> gpt2_from_pretrained(const std::string& dir, LoadReport* report) {
  auto model = std::make_shared<GPT2LMHeadModel>(gpt2_config_from_json(dir + "/config.json"));
  const LoadReport r = load_gpt2_weights(*model, dir + "/model.safetensors");
  if (report) *report = r;
  return model;
}

std::shared_ptr<BertForPreTraining> bert_from_pretrained(const std::string& dir, LoadReport* report) {
  auto model = std::make_shared<BertForPreTraining>(bert_config_from_json(dir + "/config.json"));
  const LoadReport r = load_bert_weights(*model, dir + "/model.safetensors");
  if (report) *report = r;
  return model;
}

}  // namespace chorus::models
