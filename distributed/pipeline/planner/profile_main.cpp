// `profile`: measures the per-layer profile (profile.h) of a built-in model on this machine and
// writes it as JSON for the `plan` tool.
//   mlp:  784 -> hidden -> ... -> 10, one layer per Linear (+ ReLU), --depth Linears in all;
//   bert: BERT (examples/models, Hugging Face names) as a stack: embeddings, --layers encoder layers,
//         and an untied masked-LM output projection hidden -> vocab (tied weights cannot be split
//         over stages), on --seq-len tokens.
//
//   profile --model mlp --batch 32 --hidden 1024 --depth 8 --out mlp.json
//   profile --model bert --config mini --layers 8 --seq-len 128 --batch 8 --out bert.json
#include <CLI/CLI.hpp>
#include <cstdio>

#include "distributed/pipeline/planner/profiler.h"
#include "distributed/pipeline/planner/report.h"
#include "examples/models/bert.h"
#include "nn/nn.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace chorus;
using namespace chorus::distributed::pipeline::planner;

int main(int argc, char** argv) {
  CLI::App app{"Per-layer profile of a built-in model (forward/backward ms, activation, saved and parameter bytes)"};
  std::string model = "mlp", config = "mini", out_path;
  int64_t batch = 32, hidden = 1024, seq_len = 128;
  int depth = 8, layers = 0, threads = 0;
  ProfileOptions options;
  bool no_memory = false;
  app.add_option("--model", model, "mlp or bert")->check(CLI::IsMember({"mlp", "bert"}));
  app.add_option("--batch", batch, "samples per profiled forward/backward");
  app.add_option("--hidden", hidden, "mlp: hidden width");
  app.add_option("--depth", depth, "mlp: number of Linear layers");
  app.add_option("--config", config, "bert: tiny, mini, small or base");
  app.add_option("--layers", layers, "bert: encoder layers (0: the config's)");
  app.add_option("--seq-len", seq_len, "bert: tokens per sequence");
  app.add_option("--warmup", options.warmup, "untimed runs per layer");
  app.add_option("--repeats", options.repeats, "timed runs per layer (the median is kept)");
  app.add_option("--threads", threads, "CPU threads (0: the default)");
  app.add_flag("--no-memory", no_memory, "skip the saved-bytes measurement on the sim device");
  app.add_option("--out", out_path, "write the profile JSON here");
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) set_num_threads(threads);
    options.measure_saved_bytes = !no_memory;
    manual_seed(1);
    NamedLayers stack;
    Tensor input;
    std::string description;
    if (model == "mlp") {
      if (depth < 1 || hidden < 1) fail("got --depth {} --hidden {}, expected both >= 1", depth, hidden);
      for (int i = 0; i < depth; ++i) {
        const int64_t in = i == 0 ? 784 : hidden, out = i == depth - 1 ? 10 : hidden;
        auto block = std::make_shared<nn::Sequential>();
        block->push_back(std::make_shared<nn::Linear>(in, out));
        if (i < depth - 1) block->push_back(std::make_shared<nn::ReLU>());
        stack.push_back({"fc" + std::to_string(i), block});
      }
      input = randn({batch, 784});
      description = fmt::format("mlp 784-{}x{}-10, batch {}", hidden, depth - 1, batch);
    } else {
      models::BertConfig c = models::BertConfig::named(config);
      if (layers > 0) c.num_hidden_layers = layers;
      auto bert = std::make_shared<models::BertModel>(c);
      stack.push_back({"embeddings", bert->embeddings});
      for (size_t i = 0; i < bert->layers->size(); ++i) stack.push_back({"layer" + std::to_string(i), (*bert->layers)[i]});
      stack.push_back({"lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size)});
      input = randint(0, c.vocab_size, {batch, seq_len}, {.dtype = kInt64});
      description = fmt::format("bert-{} ({} layers, hidden {}), batch {} x {} tokens", config, c.num_hidden_layers,
                                c.hidden_size, batch, seq_len);
    }
    std::vector<std::string> notes;
    ModelProfile profile = profile_layers(stack, input, options, &notes);
    for (const std::string& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    profile.model = description;
    std::printf("%s: median of %d runs after %d warm-up, per batch of %lld\n\n", description.c_str(), options.repeats,
                options.warmup, static_cast<long long>(batch));
    std::printf("| layer | forward ms | backward ms | output | saved for backward | parameters |\n|---|---|---|---|---|---|\n");
    double f = 0, b = 0;
    for (const LayerProfile& l : profile.layers) {
      std::printf("| %s | %.3f | %.3f | %s | %s | %s |\n", l.name.c_str(), l.forward_ms, l.backward_ms,
                  format_bytes(static_cast<double>(l.activation_bytes)).c_str(),
                  l.saved_bytes >= 0 ? format_bytes(static_cast<double>(l.saved_bytes)).c_str() : "-",
                  format_bytes(static_cast<double>(l.param_bytes)).c_str());
      f += l.forward_ms, b += l.backward_ms;
    }
    std::printf("| total | %.3f | %.3f | | | |\n", f, b);
    if (!out_path.empty()) {
      save_profile(profile, out_path);
      std::printf("wrote %s\n", out_path.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "profile: %s\n", e.what());
    return 1;
  }
  return 0;
}
