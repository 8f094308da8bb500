// `profile`: measures the per-layer profile (profile.h) of a built-in model on this machine and
// writes it as JSON for the `plan` tool.
//   mlp:  784 -> hidden -> ... -> 10, one layer per Linear (+ ReLU), --depth Linears in all;
//   bert: BERT (examples/models, Hugging Face names) as a stack: embeddings, --layers encoder layers,
//         and an untied masked-LM output projection hidden -> vocab (tied weights cannot be split
//         over stages), on --seq-len tokens.
//
// Besides --batch, --batches times every layer at more batch sizes (the micro-batch sizes you will
// plan for: the cost model interpolates between them), and --optimizer times one step of that
// optimizer over each layer's parameters (sgd: momentum 0.9; adam; none).
//
//   profile --model mlp --batch 32 --hidden 1024 --depth 8 --out mlp.json
//   profile --model mlp --batch 128 --batches 16,32,64 --optimizer sgd --out mlp.json
//   profile --model bert --config mini --layers 8 --seq-len 128 --batch 8 --out bert.json  (its pipeline blocks)
//   profile --model gpt --config mini --seq-len 128 --batch 8 --out gpt.json   (its pipeline blocks)
#include <CLI/CLI.hpp>
#include <cstdio>

#include "autograd/grad_mode.h"
#include "distributed/pipeline/planner/profiler.h"
#include "distributed/pipeline/planner/report.h"
#include "distributed/pipeline/pipeline.h"
#include "examples/models/bert.h"
#include "examples/models/gpt.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "utils/cli.h"

using namespace chorus;
using namespace chorus::distributed::pipeline;
using namespace chorus::distributed::pipeline::planner;

namespace {

// A block of several tensors timed as a layer of one: its first input is the layer's input, the
// others (and its outputs but the first) are constants of the profiled batch.
class HiddenStatesBlock : public nn::Module {
 public:
  HiddenStatesBlock(const BlockModel& model, int block, const Tensor& mask, const Tensor& labels)
      : nn::Module("HiddenStatesBlock") {
    stage_ = register_module("stage", std::make_shared<StageModule>(model, block, block + 1));
    mask_ = register_buffer("mask", mask);
    labels_ = register_buffer("labels", labels);
  }
  Tensor forward(const Tensor& x) override {
    for (auto& [name, b] : named_buffers(false)) (name == "mask" ? mask_ : labels_) = b;  // after to(device)
    return stage_->forward_blocks({x, mask_, labels_})[0];
  }

 private:
  std::shared_ptr<StageModule> stage_;
  Tensor mask_, labels_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Per-layer profile of a built-in model (forward/backward ms, activation, saved and parameter bytes)"};
  std::string model = "mlp", config = "mini", out_path;
  int64_t batch = 32, hidden = 1024, seq_len = 128;
  int depth = 8, layers = 0, threads = 0;
  ProfileOptions options;
  bool no_memory = false;
  app.add_option("--model", model, "mlp, bert or gpt")->check(CLI::IsMember({"mlp", "bert", "gpt"}));
  app.add_option("--batch", batch, "samples per profiled forward/backward");
  app.add_option("--hidden", hidden, "mlp: hidden width");
  app.add_option("--depth", depth, "mlp: number of Linear layers");
  app.add_option("--config", config, "bert: tiny, mini, small or base; gpt: tiny, mini, gpt2, ...");
  app.add_option("--layers", layers, "bert, gpt: transformer layers (0: the config's)");
  app.add_option("--seq-len", seq_len, "bert, gpt: tokens per sequence");
  app.add_option("--warmup", options.warmup, "untimed runs per layer");
  app.add_option("--repeats", options.repeats, "timed runs per layer (the median is kept)");
  app.add_option("--threads", threads, "CPU threads (0: the default)");
  app.add_flag("--no-memory", no_memory, "skip the saved-bytes measurement on the sim device");
  std::string optimizer = "sgd";
  app.add_option("--batches", options.extra_batches, "more batch sizes to time (e.g. 16,32,64)")->delimiter(',');
  app.add_option("--optimizer", optimizer, "time one step of: sgd (momentum 0.9), adam or none")
      ->check(CLI::IsMember({"sgd", "adam", "none"}));
  app.add_option("--out", out_path, "write the profile JSON here");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) set_num_threads(threads);
    options.measure_saved_bytes = !no_memory;
    if (optimizer == "sgd") {
      options.make_optimizer = [](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
      };
    } else if (optimizer == "adam") {
      options.make_optimizer = [](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions{.lr = 1e-3});
      };
    }
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
    } else if (model == "gpt") {
      // The pipeline's own blocks (GPT2LMHeadModel::pipeline_blocks): a layer per block, each held
      // as the stage module the runtime would build for it (the tied embedding in the first and
      // the last), so the plan's layers are the runtime's.
      models::GPTConfig c = models::GPTConfig::named(config);
      if (layers > 0) c.n_layer = layers;
      auto gpt = std::make_shared<models::GPT2LMHeadModel>(c);
      BlockModel blocks = gpt->pipeline_blocks();
      for (int i = 0; i < static_cast<int>(blocks.size()); ++i) {
        stack.push_back({blocks.blocks[i].name, std::make_shared<StageModule>(blocks, i, i + 1)});
      }
      input = randint(0, c.vocab_size, {batch, seq_len}, {.dtype = kInt64});
      description = fmt::format("gpt-{} ({} layers, {} wide), batch {} x {} tokens", config, c.n_layer, c.n_embd, batch,
                                seq_len);
    } else {
      // BERT's masked-LM pipeline blocks (BertForPreTraining::pipeline_blocks), each timed on the
      // hidden states alone: the attention mask (all tokens attended) and the labels (every 7th
      // token, about BERT's 15%) the blocks also pass are this batch's constants, held as buffers.
      models::BertConfig c = models::BertConfig::named(config);
      if (layers > 0) c.num_hidden_layers = layers;
      auto bert = std::make_shared<models::BertForPreTraining>(c);
      BlockModel blocks = bert->pipeline_blocks();
      input = randint(0, c.vocab_size, {batch, seq_len}, {.dtype = kInt64});
      Tensor mask = ones({batch, seq_len}, {.dtype = kInt64});
      Tensor labels = full({batch, seq_len}, int64_t{-100}, {.dtype = kInt64});
      int64_t* lp = labels.data_ptr<int64_t>();
      for (int64_t i = 3; i < batch * seq_len; i += 7) lp[i] = 1000 + i % 1000;
      TensorList first;
      {
        NoGradGuard no_grad;
        first = blocks.blocks[0].forward({input, mask, labels});
      }
      for (int i = 0; i < static_cast<int>(blocks.size()); ++i) {
        stack.push_back({blocks.blocks[i].name, std::make_shared<HiddenStatesBlock>(blocks, i, i == 0 ? mask : first[1].detach(),
                                                                                     labels)});
      }
      description = fmt::format("bert-{} masked LM ({} layers, hidden {}), batch {} x {} tokens", config,
                                c.num_hidden_layers, c.hidden_size, batch, seq_len);
    }
    std::vector<std::string> notes;
    ModelProfile profile = profile_layers(stack, input, options, &notes);
    for (const std::string& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    profile.model = description;
    std::printf("%s: median of %d runs after %d warm-up, per batch of %lld\n\n", description.c_str(), options.repeats,
                options.warmup, static_cast<long long>(batch));
    std::printf("| layer | forward ms | backward ms | accumulate ms | optimizer ms | output | saved for backward | parameters |\n"
                "|---|---|---|---|---|---|---|---|\n");
    double f = 0, b = 0;
    for (const LayerProfile& l : profile.layers) {
      std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %s | %s | %s |\n", l.name.c_str(), l.forward_ms, l.backward_ms,
                  l.grad_accumulate_ms, l.optimizer_ms,
                  format_bytes(static_cast<double>(l.activation_bytes)).c_str(),
                  l.saved_bytes >= 0 ? format_bytes(static_cast<double>(l.saved_bytes)).c_str() : "-",
                  format_bytes(static_cast<double>(l.param_bytes)).c_str());
      f += l.forward_ms, b += l.backward_ms;
    }
    std::printf("| total | %.3f | %.3f | | | | | |\n", f, b);
    for (int64_t extra : options.extra_batches) {
      double ef = 0, eb = 0;
      for (const LayerProfile& l : profile.layers) {
        const BatchTiming t = l.time_at(static_cast<double>(extra), profile.batch);
        ef += t.forward_ms, eb += t.backward_ms;
      }
      std::printf("at batch %lld: forward %.3f ms, backward %.3f ms (linear scaling from batch %lld: %.3f, %.3f)\n",
                  static_cast<long long>(extra), ef, eb, static_cast<long long>(batch),
                  f * static_cast<double>(extra) / static_cast<double>(batch),
                  b * static_cast<double>(extra) / static_cast<double>(batch));
    }
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
