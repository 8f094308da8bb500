// Causal language modelling with GPT-2 (Hugging Face GPT2LMHeadModel's names; examples/models/gpt.h)
// on the State of the Union corpus, on one process or data-parallel under chorusrun, then text
// sampled from a prompt:
//
//   bazel-bin/distributed/launcher/chorusrun --nproc-per-node 2 bazel-bin/examples/gpt/gpt --steps 300
//   bazel-bin/examples/gpt/gpt --config tiny --steps 50 --sample 200 --temperature 0.8 --top-k 20
//
// Tokens are bytes (--tokenizer bytes, the default: a 256-symbol vocabulary) or byte-level BPE
// (--tokenizer bpe: data/bpe.h, --vocab-size tokens learned from the training addresses by every
// rank alike, so nothing needs a vocabulary file); either way every text round-trips.
// --init-from DIR fine-tunes published GPT-2 weights instead: a Hugging Face folder (config.json,
// model.safetensors; examples/models/pretrained.h) with GPT-2's tokenizer files (vocab.json,
// merges.txt; data/gpt2_tokenizer.h), which then replace --config and --tokenizer. The addresses (233, 1790-2021, in file-name order, so by date) are joined with a blank
// line between them; the last --heldout-addresses are held out. Each stream is cut into
// --seq-len token windows, the targets being the same tokens shifted by one. AdamW with GPT-2's
// betas (0.9, 0.95) and weight decay on the 2-D weights only (projections and embeddings, as
// nanoGPT's; none on biases and LayerNorm), linear warm-up over --warmup of the steps then cosine
// decay to a tenth of --lr, gradient clipping at norm 1.
// --batch-size is the global batch per step, split over the processes and --accumulate micro-batches
// (DDP's no_sync on all but the last: one gradient reduction per step). The held-out loss (nats per
// token) and its perplexity are measured before training (≈ ln of the vocabulary size) and after. Rank 0 prints
// progress, writes checkpoints (--checkpoint-every; --resume continues on the same batches, so the
// final checkpoint equals an uninterrupted run's byte for byte), samples --sample tokens from
// --prompt (greedy with --temperature 0) and ends with one JSON line {"summary": {...}}.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>

#include "data/data.h"
#include "data/gpt2_tokenizer.h"
#include "examples/common/trainer.h"
#include "examples/models/gpt.h"
#include "examples/models/pretrained.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "utils/cli.h"

using namespace chorus;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::string config = "mini";
  int64_t seq_len = 128;
  int64_t batch_size = 16;
  int64_t accumulate = 1;
  int64_t steps = 300;
  int64_t max_steps = 0;
  double lr = 1e-3;
  double weight_decay = 0.1;
  double warmup = 0.1;
  int64_t heldout_addresses = 3;
  int64_t eval_sequences = 64;
  uint64_t seed = 1;
  int64_t checkpoint_every = 100;
  int64_t sample = 0;
  std::string prompt = "Mr. Speaker, ";
  double temperature = 0.8;
  int64_t top_k = 0;
  std::string tokenizer = "bytes";
  int64_t vocab_size = 1024;
  std::string init_from;
  examples::CommonFlags common;  // device, threads, data, amp, checkpoints, trace, logging, pipeline
};

// Text to token ids and back: bytes, byte-level BPE learned from the training text, or GPT-2's own
// tokenizer files (with --init-from).
struct Tokenizer {
  std::optional<data::BytePairTokenizer> bpe;
  std::optional<data::GPT2Tokenizer> gpt2;
  int64_t vocab_size() const { return gpt2 ? gpt2->vocab_size() : bpe ? bpe->vocab_size() : 256; }
  std::vector<int64_t> encode(const std::string& text) const {
    if (gpt2) return gpt2->encode(text);
    if (bpe) return bpe->encode(text);
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (char ch : text) ids.push_back(static_cast<unsigned char>(ch));
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    if (gpt2) return gpt2->decode(ids);
    if (bpe) return bpe->decode(ids);
    std::string text;
    for (int64_t id : ids) text += static_cast<char>(id);
    return text;
  }
};

// The addresses' bytes, in file-name order: {training stream, held-out stream, documents}.
struct ByteCorpus {
  std::string train, heldout;
  int64_t documents = 0, heldout_documents = 0;
};

ByteCorpus load_corpus(const std::string& folder, int64_t heldout) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(folder)) fail("gpt: no corpus folder {} (tools/setup.sh installs it)", folder);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(folder)) {
    if (e.path().extension() == ".txt") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (static_cast<int64_t>(files.size()) <= heldout) {
    fail("gpt: {} holds {} addresses; --heldout-addresses {} leaves none to train on", folder, files.size(), heldout);
  }
  ByteCorpus c;
  c.documents = static_cast<int64_t>(files.size());
  c.heldout_documents = heldout;
  for (size_t i = 0; i < files.size(); ++i) {
    std::ifstream in(files[i], std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::string& to = static_cast<int64_t>(i) >= c.documents - heldout ? c.heldout : c.train;
    if (!to.empty()) to += "\n\n";
    to += text.str();
  }
  return c;
}

// Windows of seq_len tokens: data [N, T] and targets [N, T] (the next token of each position).
std::shared_ptr<data::TensorDataset> windows(const std::vector<int64_t>& ids, int64_t seq_len) {
  const int64_t n = (static_cast<int64_t>(ids.size()) - 1) / seq_len;
  Tensor x = empty({std::max<int64_t>(n, 0), seq_len}, {.dtype = kInt64});
  Tensor y = empty({std::max<int64_t>(n, 0), seq_len}, {.dtype = kInt64});
  int64_t* xp = x.data_ptr<int64_t>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n * seq_len; ++i) {
    xp[i] = ids[static_cast<size_t>(i)];
    yp[i] = ids[static_cast<size_t>(i + 1)];
  }
  return std::make_shared<data::TensorDataset>(x, y);
}

// GPT-2's recipe (as nanoGPT): weight decay on the matrices (dim >= 2: projections and
// embeddings), none on biases and LayerNorm. The groups are the trainer's ("decay", "no_decay"):
// parameters or, with --sharding, shards of them.
std::string param_group(const std::string&, const Tensor& p) { return p.dim() >= 2 ? "decay" : "no_decay"; }

std::unique_ptr<optim::Optimizer> make_optimizer(examples::Trainer& trainer, const Flags& f) {
  optim::AdamOptions o = optim::AdamW::default_options();
  o.lr = f.lr;
  o.beta2 = 0.95;
  return trainer.make_adamw(o, f.weight_decay);
}

// Mean held-out loss per token over the first `limit` windows (every window has seq_len tokens),
// data-parallel or through the pipeline's stages (Trainer::evaluate).
double evaluate(examples::Trainer& trainer, const data::TensorDataset& heldout, int64_t limit) {
  const std::vector<double> sums = trainer.evaluate(
      heldout, limit, 16, 2, [](const data::Batch& b) { return examples::Lists{{b.data}, {b.target}}; },
      [](const TensorList& outputs, const TensorList& targets) {
        const double n = static_cast<double>(targets[0].numel());
        return std::vector<double>{models::GPT2LMHeadModel::pipeline_loss(outputs, targets).item<double>() * n, n};
      });
  return sums[0] / std::max(sums[1], 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Causal language modelling with GPT-2 on the State of the Union corpus (run under chorusrun for DDP)"};
  CLI::Option* config_opt =
      app.add_option("--config", f.config, "tiny, mini, gpt2, gpt2-medium, gpt2-large or gpt2-xl (with a byte vocabulary)")
          ->check(CLI::IsMember({"tiny", "mini", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}));
  CLI::Option* tokenizer_opt =
      app.add_option("--tokenizer", f.tokenizer, "bytes, or bpe (byte-level BPE learned from the training addresses)")
          ->check(CLI::IsMember({"bytes", "bpe"}));
  app.add_option("--init-from", f.init_from,
                 "fine-tune a Hugging Face GPT-2 folder: config.json, model.safetensors and GPT-2's tokenizer "
                 "(vocab.json, merges.txt)")
      ->excludes(config_opt)
      ->excludes(tokenizer_opt);
  app.add_option("--vocab-size", f.vocab_size, "BPE vocabulary size (256 bytes + merges) with --tokenizer bpe")
      ->check(CLI::Range(257, 65536));
  app.add_option("--seq-len", f.seq_len, "tokens per sequence")->check(CLI::Range(2, 1024));
  app.add_option("--batch-size", f.batch_size, "global sequences per optimizer step")->check(CLI::PositiveNumber);
  app.add_option("--accumulate", f.accumulate, "micro-batches per optimizer step (no_sync on all but the last)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", f.steps, "optimizer steps (the schedule's length)")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", f.max_steps, "stop after this many steps, as if interrupted (0: run --steps)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", f.lr, "peak learning rate (AdamW)")->check(CLI::Range(1e-9, 10.0));
  app.add_option("--weight-decay", f.weight_decay, "AdamW decoupled weight decay of the 2-D weights")
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--warmup", f.warmup, "share of the steps with a linear warm-up")->check(CLI::Range(0.0, 1.0));
  app.add_option("--heldout-addresses", f.heldout_addresses, "the last k addresses are held out")
      ->check(CLI::Range(1, 200));
  app.add_option("--eval-sequences", f.eval_sequences, "held-out sequences evaluated (before and after training)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", f.seed, "seed of initialization, shuffling and sampling");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints")->check(CLI::PositiveNumber);
  app.add_option("--sample", f.sample, "after training, generate this many tokens from --prompt")
      ->check(CLI::Range(0, 100000));
  app.add_option("--prompt", f.prompt, "text the sample continues");
  app.add_option("--temperature", f.temperature, "sampling temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-k", f.top_k, "sample among the k most likely tokens (0: all)")->check(CLI::Range(0, 65536));
  examples::add_common_options(app, f.common, "sotu/");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t_start = Clock::now();
    if (f.sample > 0 && f.prompt.empty()) fail("gpt: --sample needs a --prompt of at least one byte");
    examples::TrainerOptions o;
    o.program = "gpt";
    o.global_batch = f.batch_size;
    o.accumulate = f.accumulate;
    o.eval_sequences = f.eval_sequences;
    o.max_grad_norm = 1.0;
    o.param_group = param_group;
    o.flags = f.common;
    examples::Job job = examples::join_job(o);
    const bool pipelined = f.common.pipeline.enabled();
    const int64_t micro = examples::micro_batch_size(o, job);

    const bool pretrained = !f.init_from.empty();
    if (pretrained) f.tokenizer = "gpt2";
    const std::string config_name = pretrained ? f.init_from : f.config;
    models::GPTConfig config = pretrained ? models::gpt2_config_from_json(f.init_from + "/config.json") : models::GPTConfig::named(f.config);
    if (f.seq_len > config.n_positions) {
      fail("gpt: --seq-len {} exceeds the {} positions of {}", f.seq_len, config.n_positions,
           pretrained ? f.init_from : "--config " + f.config);
    }
    const ByteCorpus corpus = load_corpus(f.common.data_root() + "/sotu", f.heldout_addresses);
    Tokenizer tok;
    if (pretrained) {
      tok.gpt2 = data::GPT2Tokenizer::from_pretrained(f.init_from);
      if (tok.vocab_size() > config.vocab_size) {
        fail("gpt: the tokenizer in {} has {} tokens, more than the model's vocab_size {}", f.init_from, tok.vocab_size(),
             config.vocab_size);
      }
    } else if (f.tokenizer == "bpe") {
      const auto t_bpe = Clock::now();
      tok.bpe = data::BytePairTokenizer::train(corpus.train, f.vocab_size);
      job.log(fmt::format("byte-level BPE: {} tokens learned from the training addresses in {:.1f} s", tok.vocab_size(),
                          std::chrono::duration<double>(Clock::now() - t_bpe).count()));
    }
    if (f.top_k > tok.vocab_size()) fail("gpt: --top-k {} exceeds the vocabulary of {} tokens", f.top_k, tok.vocab_size());
    if (!pretrained) config.vocab_size = tok.vocab_size();
    const std::vector<int64_t> train_ids = tok.encode(corpus.train), heldout_ids = tok.encode(corpus.heldout);
    auto train = windows(train_ids, f.seq_len);
    auto heldout = windows(heldout_ids, f.seq_len);
    job.log(fmt::format("corpus: {} addresses, {} training bytes = {} tokens ({} sequences of {}), {} held-out bytes = {} "
                        "tokens ({} addresses, {} sequences)",
                        corpus.documents, corpus.train.size(), train_ids.size(), train->size(), f.seq_len,
                        corpus.heldout.size(), heldout_ids.size(), corpus.heldout_documents, heldout->size()));
    data::DataLoader loader(train, {.batch_size = micro,
                                    .drop_last = true,
                                    .num_workers = 0,
                                    .sampler = examples::training_sampler(o, job, train->size(), f.seed)});
    const int64_t steps_per_epoch = loader.size() / f.accumulate;
    if (steps_per_epoch < 1) fail("gpt: {} sequences give no full step of batch {}", train->size(), f.batch_size);

    manual_seed(f.seed);
    auto model = std::make_shared<models::GPT2LMHeadModel>(config);
    if (pretrained) {
      const models::LoadReport report = models::load_gpt2_weights(*model, f.init_from + "/model.safetensors");
      job.log(fmt::format("weights: {} tensors from {}/model.safetensors ({} buffers skipped)", model->state_dict().size(),
                          f.init_from, report.skipped.size()));
    }
    model->to(o.device);
    const int64_t parameters = examples::count_parameters(*model);
    o.identity = {{"model", "gpt"},
                  {"config", config_name},
                  {"seq_len", std::to_string(f.seq_len)},
                  {"tokenizer", f.tokenizer},
                  {"vocab_size", std::to_string(tok.vocab_size())}};
    // Null once a pipeline or FullyShardedDataParallel holds the blocks.
    models::GPT2LMHeadModel* whole = examples::keeps_whole_model(f.common) ? model.get() : nullptr;
    examples::Trainer trainer(o, job, model,
                              {.forward = [whole](const TensorList& in) { return TensorList{whole->forward(in[0])}; },
                               .loss = models::GPT2LMHeadModel::pipeline_loss});
    auto opt = make_optimizer(trainer, f);
    optim::WarmupDecayLR sched(*opt, static_cast<int64_t>(f.warmup * f.steps), f.steps,
                               optim::WarmupDecayLR::Decay::Cosine, f.lr / 10);
    int64_t step = trainer.start(*opt, &sched);

    job.log(fmt::format("GPT-2 {}: {} parameters ({} layers, {} wide, {} heads, {} vocabulary of {}), world size {}, batch {} "
                        "= {} sequences of {}, {} steps ({} per epoch), {} threads per process",
                        config_name, parameters, config.n_layer, config.n_embd, config.n_head, f.tokenizer,
                        tok.vocab_size(), job.world, f.batch_size,
                        pipelined ? "the pipeline's"
                                  : fmt::format("{} processes x {} micro-batches x {}", job.world, f.accumulate, micro), f.seq_len,
                        f.steps, steps_per_epoch, get_num_threads()));
    double before = -1;
    if (f.eval_sequences > 0 && !trainer.resumed()) {
      before = evaluate(trainer, *heldout, f.eval_sequences);
      job.log(fmt::format("held-out before training: loss {:.4f} (ln {} = {:.4f}), perplexity {:.2f}", before,
                          tok.vocab_size(), std::log(static_cast<double>(tok.vocab_size())), std::exp(before)));
      trainer.tensorboard().scalar("heldout/loss", before, step);
      trainer.tensorboard().scalar("heldout/perplexity", std::exp(before), step);
    }

    const int64_t stop = f.max_steps > 0 ? std::min(f.steps, f.max_steps) : f.steps;
    double loss_window = 0, last_loss = 0, first_loss = -1;
    int64_t window_n = 0, tokens = 0;
    const auto t_train = Clock::now();
    auto t_log = t_train;
    while (step < stop) {
      const int64_t epoch = step / steps_per_epoch;
      loader.set_epoch(epoch);
      loader.skip_batches(step % steps_per_epoch * f.accumulate);
      for (data::Batch& b : loader) {
        tokens += b.data.numel() * (pipelined ? 1 : job.world);
        const std::optional<double> loss = trainer.feed({{b.data}, {b.target}});
        if (!loss) continue;  // the step's micro-batches are not all in yet
        last_loss = *loss;
        sched.step();
        ++step;
        if (first_loss < 0) first_loss = last_loss;
        loss_window += last_loss;
        ++window_n;
        const auto now = Clock::now();
        if (std::chrono::duration<double>(now - t_log).count() >= f.common.log_every_s || step == stop) {
          t_log = now;
          const double elapsed = std::chrono::duration<double>(now - t_train).count();
          const double rate = tokens / std::max(elapsed, 1e-9);
          job.log(fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.2e} {:.0f} tokens/s ETA {}", step, f.steps, epoch + 1,
                              loss_window / window_n, opt->param_groups()[0].lr(), rate,
                              examples::eta_str((stop - step) * f.batch_size * f.seq_len / std::max(rate, 1e-9))));
          loss_window = 0;
          window_n = 0;
        }
        if (step % f.checkpoint_every == 0) trainer.save(step / steps_per_epoch, step);
        if (step == stop || step % steps_per_epoch == 0) break;
      }
    }
    const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
    if (step % f.checkpoint_every != 0) trainer.save(step / steps_per_epoch, step);
    nlohmann::json summary = trainer.summary();
    summary.update({{"config", config_name},
                    {"init_from", f.init_from},
                    {"tokenizer", f.tokenizer},
                    {"vocab_size", tok.vocab_size()},
                    {"parameters", parameters},
                    {"seq_len", f.seq_len},
                    {"batch_size", f.batch_size},
                    {"accumulate", f.accumulate},
                    {"steps", step},
                    {"first_step_loss", first_loss},
                    {"last_step_loss", last_loss},
                    {"tokens_per_s", tokens / std::max(train_s, 1e-9)},
                    {"train_s", train_s}});
    if (f.eval_sequences > 0) {
      const double after = evaluate(trainer, *heldout, f.eval_sequences);
      job.log(fmt::format("held-out after {} steps: loss {:.4f}, perplexity {:.2f}", step, after, std::exp(after)));
      trainer.tensorboard().scalar("heldout/loss", after, step);
      trainer.tensorboard().scalar("heldout/perplexity", std::exp(after), step);
      if (!trainer.resumed()) {
        summary["heldout_loss_before"] = before;
        summary["heldout_perplexity_before"] = std::exp(before);
      }
      summary["heldout_loss"] = after;
      summary["heldout_perplexity"] = std::exp(after);
    }
    if (f.sample > 0) {
      // Sampling runs on rank 0 with the whole model (pipelined or sharded: gathered).
      std::shared_ptr<models::GPT2LMHeadModel> sampler = model;
      if (!sampler) {
        nn::NamedTensors state = trainer.whole_state_dict();
        if (job.rank == 0) {
          models::GPTConfig c = config;
          c.initialize = false;
          sampler = std::make_shared<models::GPT2LMHeadModel>(c);
          sampler->to(o.device);
          sampler->load_state_dict(state);
        }
      }
      if (job.rank == 0) {
        // Its own generator, seeded by --seed: the sample does not depend on how training drew numbers.
        Generator gen(f.seed);
        const std::vector<int64_t> ids = sampler->generate(
            tok.encode(f.prompt), {.max_new_tokens = f.sample, .temperature = f.temperature, .top_k = f.top_k, .generator = &gen});
        const std::string text = tok.decode(ids);
        job.log(fmt::format("sample (temperature {}, top-k {}):\n{}{}", f.temperature, f.top_k, f.prompt, text));
        summary["sample"] = text;
        trainer.tensorboard().text("sample", f.prompt + text, step);
      }
    }
    summary["wall_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
    // A sample may cut a UTF-8 character in two: such bytes print as U+FFFD in the JSON line.
    job.log(nlohmann::json{{"summary", summary}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    job.finish();
    return 0;
  } catch (const examples::TrainingDiverged&) {
    return examples::kDivergedExitCode;  // rank 0 said why; the last good checkpoint is untouched
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: error: %s\n", e.what());
    return 1;
  }
}
