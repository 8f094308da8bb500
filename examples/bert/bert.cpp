// Masked-LM pretraining of BERT (Hugging Face BertForPreTraining's names; tiny/mini/small/base) on
// the State of the Union corpus, on one process or data-parallel under chorusrun, or throughput on
// synthetic token batches:
//
//   bazel-bin/distributed/launcher/chorusrun --nproc-per-node 2 bazel-bin/examples/bert/bert --steps 300
//   bazel-bin/examples/bert/bert --synthetic --config mini --batch-size 8 --steps 10
//
// The corpus (233 addresses, 1790-2021) is WordPiece-tokenized with bert-base-uncased's vocabulary,
// every 20th address is held out, and the rest are packed into [CLS] ... [SEP] sequences of
// --seq-len tokens; 15% of tokens are chosen for prediction (80% [MASK], 10% random, 10% kept),
// freshly each epoch. AdamW (weight decay 0.01, none on biases and LayerNorm), linear warm-up over
// the first 10% of steps and linear decay to zero, gradient clipping at norm 1. --batch-size is the
// global batch per optimizer step: each of N processes runs --accumulate micro-batches of
// batch / (N * accumulate) sequences, the first accumulate-1 of them under DDP's no_sync, so
// gradients are reduced once per step. The held-out masked-LM loss and masked-token accuracy are
// measured before training (≈ ln 30522 = 10.33 and ~0) and after. Rank 0 prints progress, writes
// checkpoints (--checkpoint-every, --resume continues on the same batches and masks) and ends with
// one JSON line {"summary": {...}}. --device cuda or sim trains on a device; the pipeline flags
// (examples/common/pipeline_flags.h) cut the model into stages instead of DDP.
// --init-from DIR fine-tunes published weights instead of --config: a Hugging Face BertForMaskedLM
// or BertForPreTraining folder (config.json, model.safetensors; examples/models/pretrained.h), with
// its vocab.txt when it has one (else the installed bert-base-uncased vocabulary).
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "data/data.h"
#include "examples/common/trainer.h"
#include "examples/models/bert.h"
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
  std::string init_from;
  int64_t seq_len = 128;
  int64_t batch_size = 32;
  int64_t accumulate = 1;
  int64_t steps = 300;
  int64_t max_steps = 0;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double warmup = 0.1;
  bool synthetic = false;
  int64_t eval_sequences = 256;
  int64_t heldout_every = 20;
  uint64_t seed = 1;
  int64_t checkpoint_every = 100;
  examples::CommonFlags common;  // device, threads, data, amp, checkpoints, trace, logging, pipeline
};

// No weight decay on biases and LayerNorm parameters (BERT's recipe). The groups are the
// trainer's ("decay", "no_decay"): parameters or, with --sharding, shards of them.
std::string param_group(const std::string& name, const Tensor&) {
  const bool exempt = name.find("LayerNorm") != std::string::npos || name.ends_with("bias");
  return exempt ? "no_decay" : "decay";
}

std::unique_ptr<optim::Optimizer> make_optimizer(examples::Trainer& trainer, const Flags& f) {
  optim::AdamOptions o = optim::AdamW::default_options();
  o.lr = f.lr;
  o.eps = 1e-6;
  return trainer.make_adamw(o, f.weight_decay);
}

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t predicted = 0;
};

// A batch as the model takes it: token ids, the attention mask (0 on [PAD], which only ends the
// corpus's last sequence; masking never writes it) and the labels, which the pipeline carries
// through its stages as an input (no separate targets).
examples::Lists model_inputs(const data::Batch& b, int64_t pad_id) {
  return {{b.data, ne(b.data, pad_id).to(kInt64), b.target}, {}};
}

// Held-out masked-LM loss (mean over predicted tokens) and masked-token accuracy, with masks fixed
// by the seed, over the first `limit` sequences: data-parallel or through the pipeline's stages
// (Trainer::evaluate).
EvalResult evaluate(examples::Trainer& trainer, const data::MaskedLMDataset& heldout, int64_t limit, int64_t pad_id) {
  const std::vector<double> sums = trainer.evaluate(
      heldout, limit, 16, 3, [pad_id](const data::Batch& b) { return model_inputs(b, pad_id); },
      [](const TensorList& out, const TensorList& targets) {
        if (out[1].numel() == 0) return std::vector<double>{0, 0, 0};  // no labelled token in these rows
        const double n = static_cast<double>(out[1].numel());
        return std::vector<double>{models::BertForPreTraining::pipeline_loss(out, targets).item<double>() * n,
                                   static_cast<double>(out[0].argmax(1).eq(out[1]).sum().item<int64_t>()), n};
      });
  const double n = std::max(sums[2], 1.0);
  return {sums[0] / n, sums[1] / n, static_cast<int64_t>(sums[2])};
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Masked-LM pretraining of BERT on the State of the Union corpus (run under chorusrun for DDP)"};
  CLI::Option* config_opt =
      app.add_option("--config", f.config, "tiny, mini, small or base")->check(CLI::IsMember({"tiny", "mini", "small", "base"}));
  app.add_option("--init-from", f.init_from,
                 "fine-tune a Hugging Face BERT folder (config.json, model.safetensors, and vocab.txt if it has one)")
      ->excludes(config_opt);
  app.add_option("--seq-len", f.seq_len, "tokens per sequence")->check(CLI::Range(8, 512));
  app.add_option("--batch-size", f.batch_size, "global sequences per optimizer step")->check(CLI::PositiveNumber);
  app.add_option("--accumulate", f.accumulate, "micro-batches per optimizer step (no_sync on all but the last)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", f.steps, "optimizer steps (the schedule's length)")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", f.max_steps, "stop after this many steps, as if interrupted (0: run --steps)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", f.lr, "peak learning rate (AdamW)")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", f.weight_decay, "AdamW decoupled weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", f.warmup, "share of the steps with a linear warm-up")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--synthetic", f.synthetic, "time training steps on random token batches");
  app.add_option("--eval-sequences", f.eval_sequences, "held-out sequences evaluated (before and after training)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--heldout-every", f.heldout_every, "every k-th address is held out")->check(CLI::Range(2, 1000));
  app.add_option("--seed", f.seed, "seed of initialization, shuffling and masking");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints")->check(CLI::PositiveNumber);
  examples::add_common_options(app, f.common, "sotu/ and bert/vocab.txt");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t_start = Clock::now();
    if (f.synthetic && (f.common.resume != "no" || !f.common.checkpoint_dir.empty())) {
      fail("bert: --synthetic does not checkpoint");
    }
    examples::TrainerOptions o;
    o.program = "bert";
    o.global_batch = f.batch_size;
    o.accumulate = f.accumulate;
    o.max_grad_norm = 1.0;
    // The pooler and the next-sentence head take no part in masked-LM training.
    o.ddp.find_unused_parameters = true;
    o.param_group = param_group;
    o.flags = f.common;
    examples::Job job = examples::join_job(o);
    const bool pipelined = f.common.pipeline.enabled();
    const int64_t micro = examples::micro_batch_size(o, job);
    const std::string data_dir = f.common.data_root();

    const bool pretrained = !f.init_from.empty();
    const std::string config_name = pretrained ? f.init_from : f.config;
    models::BertConfig config =
        pretrained ? models::bert_config_from_json(f.init_from + "/config.json") : models::BertConfig::named(f.config);
    if (f.seq_len > config.max_position_embeddings) {
      fail("bert: --seq-len {} exceeds the {} positions of {}", f.seq_len, config.max_position_embeddings,
           pretrained ? f.init_from : "BERT-" + f.config);
    }
    const std::string vocab_file = pretrained && std::filesystem::exists(f.init_from + "/vocab.txt")
                                       ? f.init_from + "/vocab.txt"
                                       : data_dir + "/bert/vocab.txt";
    data::WordPieceTokenizer tokenizer(vocab_file);
    if (tokenizer.vocab_size() > config.vocab_size) {
      fail("bert: {} has {} word pieces, more than the model's vocab_size {} ({})", vocab_file, tokenizer.vocab_size(),
           config.vocab_size, config_name);
    }
    const int64_t pad_id = tokenizer.pad_id();
    std::shared_ptr<data::MaskedLMDataset> train, heldout;
    int64_t corpus_tokens = 0;
    if (f.synthetic) {
      // Random word pieces, the same shape and masking as real batches.
      manual_seed(f.seed + 7);
      Tensor seqs = randint(999, config.vocab_size, {std::max<int64_t>(f.batch_size, 1), f.seq_len});
      seqs.select(1, 0).fill_(tokenizer.cls_id());
      seqs.select(1, f.seq_len - 1).fill_(tokenizer.sep_id());
      train = std::make_shared<data::MaskedLMDataset>(seqs, tokenizer, data::MaskingOptions{.seed = f.seed});
    } else {
      data::TextCorpus corpus = data::TextCorpus::load(data_dir + "/sotu", tokenizer);
      corpus_tokens = corpus.num_tokens();
      auto [kept, held] = corpus.split(f.heldout_every);
      train = std::make_shared<data::MaskedLMDataset>(kept.pack(f.seq_len, tokenizer), tokenizer,
                                                      data::MaskingOptions{.seed = f.seed});
      heldout = std::make_shared<data::MaskedLMDataset>(held.pack(f.seq_len, tokenizer), tokenizer,
                                                        data::MaskingOptions{.seed = f.seed + 1000});
      job.log(fmt::format("corpus: {} addresses, {} tokens; {} training sequences, {} held-out ({} addresses) of {} tokens",
                          corpus.documents.size(), corpus_tokens, train->size(), heldout->size(), held.documents.size(),
                          f.seq_len));
    }
    const bool evaluating = heldout && f.eval_sequences > 0;
    o.eval_sequences = evaluating ? f.eval_sequences : 0;
    data::DataLoader loader(train, {.batch_size = micro,
                                    .drop_last = true,
                                    .num_workers = 1,
                                    .sampler = examples::training_sampler(o, job, train->size(), f.seed)});
    const int64_t steps_per_epoch = loader.size() / f.accumulate;
    if (steps_per_epoch < 1) fail("bert: {} sequences give no full step of batch {}", train->size(), f.batch_size);

    manual_seed(f.seed);
    auto model = std::make_shared<models::BertForPreTraining>(config);
    if (pretrained) {
      const models::LoadReport report = models::load_bert_weights(*model, f.init_from + "/model.safetensors");
      job.log(fmt::format("weights: {}/model.safetensors ({} tensors kept as initialized: {})", f.init_from,
                          report.initialized.size(), fmt::join(report.initialized, ", ")));
    }
    model->to(o.device);
    const int64_t parameters = examples::count_parameters(*model);
    o.identity = {{"config", config_name}, {"seq_len", std::to_string(f.seq_len)}};
    // Null once a pipeline or FullyShardedDataParallel holds the blocks.
    models::BertForPreTraining* whole = examples::keeps_whole_model(f.common) ? model.get() : nullptr;
    examples::Trainer trainer(o, job, model,
                              {.forward = [whole](const TensorList& in) { return whole->masked_lm_outputs(in[0], in[1], in[2]); },
                               .loss = models::BertForPreTraining::pipeline_loss});
    auto opt = make_optimizer(trainer, f);
    optim::WarmupDecayLR sched(*opt, static_cast<int64_t>(f.warmup * f.steps), f.steps, optim::WarmupDecayLR::Decay::Linear);
    int64_t step = trainer.start(*opt, &sched);

    job.log(fmt::format("{}: {} parameters, world size {}, batch {} = {} sequences of {}, {} steps ({} per epoch), "
                        "{} threads per process",
                        pretrained ? "BERT " + f.init_from : "BERT-" + f.config, parameters, job.world, f.batch_size,
                        pipelined ? "the pipeline's"
                                  : fmt::format("{} processes x {} micro-batches x {}", job.world, f.accumulate, micro),
                        f.seq_len, f.steps, steps_per_epoch, get_num_threads()));
    EvalResult before;
    if (evaluating && !trainer.resumed()) {
      before = evaluate(trainer, *heldout, f.eval_sequences, pad_id);
      job.log(fmt::format("held-out before training: masked-LM loss {:.4f} (ln {} = {:.4f}), masked-token accuracy {:.2f}% "
                          "over {} predictions",
                          before.loss, config.vocab_size, std::log(static_cast<double>(config.vocab_size)),
                          100 * before.accuracy, before.predicted));
      trainer.tensorboard().scalar("heldout/mlm_loss", before.loss, step);
      trainer.tensorboard().scalar("heldout/mlm_accuracy", before.accuracy, step);
    }

    const int64_t stop = f.max_steps > 0 ? std::min(f.steps, f.max_steps) : f.steps;
    std::vector<double> step_times;
    double loss_window = 0, last_loss = 0, first_loss = -1;
    int64_t window_n = 0, tokens = 0;
    const auto t_train = Clock::now();
    auto t_log = t_train;
    while (step < stop) {
      const int64_t epoch = step / steps_per_epoch;
      train->set_epoch(epoch);
      loader.set_epoch(epoch);
      loader.skip_batches((step % steps_per_epoch) * f.accumulate);
      auto t_step = Clock::now();
      int64_t fed = 0;
      for (data::Batch& b : loader) {
        if (fed++ % trainer.micro_batches_per_step() == 0) t_step = Clock::now();
        tokens += b.data.numel() * (pipelined ? 1 : job.world);
        const std::optional<double> loss = trainer.feed(model_inputs(b, pad_id));
        if (!loss) continue;  // the step's micro-batches are not all in yet
        last_loss = *loss;
        sched.step();
        ++step;
        step_times.push_back(std::chrono::duration<double>(Clock::now() - t_step).count());
        if (first_loss < 0) first_loss = last_loss;
        loss_window += last_loss;
        ++window_n;
        const auto now = Clock::now();
        if (std::chrono::duration<double>(now - t_log).count() >= f.common.log_every_s || step == stop) {
          t_log = now;
          const double elapsed = std::chrono::duration<double>(now - t_train).count();
          const double seq_rate = tokens / static_cast<double>(f.seq_len) / std::max(elapsed, 1e-9);
          job.log(fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.2e} {:.1f} seq/s ETA {}", step, f.steps, epoch + 1,
                              loss_window / window_n, opt->param_groups()[0].lr(), seq_rate,
                              examples::eta_str((stop - step) * f.batch_size / std::max(seq_rate, 1e-9))));
          loss_window = 0;
          window_n = 0;
        }
        if (!f.synthetic && step % f.checkpoint_every == 0) trainer.save(step / steps_per_epoch, step);
        if (step == stop || step % steps_per_epoch == 0) break;
      }
    }
    const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
    if (!f.synthetic && step % f.checkpoint_every != 0) trainer.save(step / steps_per_epoch, step);
    nlohmann::json summary = trainer.summary();
    summary.update({{"mode", f.synthetic ? "synthetic" : "sotu"},
                    {"config", config_name},
                    {"init_from", f.init_from},
                    {"parameters", parameters},
                    {"seq_len", f.seq_len},
                    {"batch_size", f.batch_size},
                    {"accumulate", f.accumulate},
                    {"steps", step},
                    {"first_step_loss", first_loss},
                    {"last_step_loss", last_loss},
                    {"sequences_per_s", tokens / static_cast<double>(f.seq_len) / std::max(train_s, 1e-9)},
                    {"train_s", train_s}});
    if (!step_times.empty()) {
      std::vector<double> sorted = step_times;
      std::sort(sorted.begin(), sorted.end());
      summary["median_step_s"] = sorted[sorted.size() / 2];
    }
    if (evaluating) {
      EvalResult after = evaluate(trainer, *heldout, f.eval_sequences, pad_id);
      job.log(fmt::format("held-out after {} steps: masked-LM loss {:.4f}, masked-token accuracy {:.2f}% over {} predictions",
                          step, after.loss, 100 * after.accuracy, after.predicted));
      trainer.tensorboard().scalar("heldout/mlm_loss", after.loss, step);
      trainer.tensorboard().scalar("heldout/mlm_accuracy", after.accuracy, step);
      if (!trainer.resumed()) {
        summary["heldout_loss_before"] = before.loss;
        summary["heldout_accuracy_before"] = before.accuracy;
      }
      summary["heldout_loss"] = after.loss;
      summary["heldout_accuracy"] = after.accuracy;
      summary["heldout_predictions"] = after.predicted;
    }
    summary["wall_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
    job.log(nlohmann::json{{"summary", summary}}.dump());
    job.finish();
    return 0;
  } catch (const examples::TrainingDiverged&) {
    return examples::kDivergedExitCode;  // rank 0 said why; the last good checkpoint is untouched
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bert: error: %s\n", e.what());
    return 1;
  }
}
