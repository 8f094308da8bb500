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
// one JSON line {"summary": {...}}. chorus has no CUDA backend yet, so this runs on the CPU.
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "data/data.h"
#include "distributed/ddp.h"
#include "examples/common/example_util.h"
#include "examples/common/pipeline_flags.h"
#include "examples/models/bert.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/optim.h"
#include "tensor/ops.h"

using namespace chorus;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::string config = "mini";
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
  std::string checkpoint_dir;
  int64_t checkpoint_every = 100;
  std::string resume = "no";  // no, always (the bare flag), auto (when a checkpoint exists)
  int threads = 0;
  std::string data_dir;
  std::string trace;
  double log_every_s = 10;
  std::string amp = "none";  // none, bf16, fp16
  std::string device = "auto";
  examples::PipelineFlags pipeline;
};

// No weight decay on biases and LayerNorm parameters (BERT's recipe).
std::unique_ptr<optim::AdamW> make_optimizer(const nn::NamedTensors& params, const Flags& f) {
  optim::ParamGroup decay, no_decay;
  for (auto& [name, p] : params) {
    const bool exempt = name.find("LayerNorm") != std::string::npos || name.ends_with("bias");
    (exempt ? no_decay : decay).params.push_back(p);
  }
  decay.options["weight_decay"] = f.weight_decay;
  no_decay.options["weight_decay"] = 0.0;
  optim::AdamOptions o = optim::AdamW::default_options();
  o.lr = f.lr;
  o.eps = 1e-6;
  return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{decay, no_decay}, o);
}

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t predicted = 0;
};

// Held-out masked-LM loss (mean over predicted tokens) and masked-token accuracy, with masks fixed
// by the seed; each rank takes every world-th of the first `limit` sequences, summed over ranks.
EvalResult evaluate(models::BertForPreTraining& model, const data::MaskedLMDataset& heldout, int64_t limit,
                    int64_t pad_id, const examples::Job& job, Device device) {
  NoGradGuard no_grad;
  model.eval();
  double loss_sum = 0;
  int64_t correct = 0, count = 0;
  const int64_t n = std::min(limit, heldout.size());
  std::vector<int64_t> mine;
  for (int64_t i = job.rank; i < n; i += job.world) mine.push_back(i);
  for (size_t start = 0; start < mine.size(); start += 16) {
    std::vector<int64_t> chunk(mine.begin() + start, mine.begin() + std::min(mine.size(), start + 16));
    data::Batch b = heldout.get_batch(chunk);
    Tensor logits, targets;
    const Tensor ids = b.data.to(device);
    Tensor loss = model.masked_lm_loss(ids, ne(ids, pad_id).to(kInt64), b.target.to(device), &logits, &targets);
    loss_sum += loss.item<double>() * targets.numel();
    correct += logits.argmax(1).eq(targets).sum().item<int64_t>();
    count += targets.numel();
  }
  model.train();
  if (job.group) {
    Tensor t = tensor<double>({loss_sum, static_cast<double>(correct), static_cast<double>(count)});
    job.group->allreduce({t})->wait();
    loss_sum = t[0].item<double>();
    correct = static_cast<int64_t>(t[1].item<double>());
    count = static_cast<int64_t>(t[2].item<double>());
  }
  return {loss_sum / std::max<int64_t>(count, 1), static_cast<double>(correct) / std::max<int64_t>(count, 1), count};
}

// The same through the pipeline's stages (PipelineStage::eval_step: forward only): the first
// `limit` sequences rounded down to whole global batches, every rank reading the same; the last
// stage's logits and labels give the token-weighted loss and accuracy, summed over the group.
EvalResult evaluate_pipelined(distributed::pipeline::PipelineStage& stage, const distributed::ProcessGroup& group,
                              const data::MaskedLMDataset& heldout, int64_t limit, int64_t pad_id) {
  const int64_t batch = stage.plan().global_batch;
  const int64_t n = std::min(limit, heldout.size()) / batch * batch;
  double loss_sum = 0, correct = 0, count = 0;
  for (int64_t start = 0; start < n; start += batch) {
    std::vector<int64_t> rows(static_cast<size_t>(batch));
    std::iota(rows.begin(), rows.end(), start);
    data::Batch b = heldout.get_batch(rows);
    distributed::pipeline::EvalStats ev = stage.eval_step({b.data, ne(b.data, pad_id).to(kInt64), b.target}, {},
                                                          models::BertForPreTraining::pipeline_loss);
    NoGradGuard no_grad;
    for (const TensorList& out : ev.outputs) {
      if (out[1].numel() == 0) continue;
      loss_sum += models::BertForPreTraining::pipeline_loss(out, {}).item<double>() * out[1].numel();
      correct += out[0].argmax(1).eq(out[1]).sum().item<int64_t>();
      count += out[1].numel();
    }
  }
  Tensor t = tensor<double>({loss_sum, correct, count});
  const_cast<distributed::ProcessGroup&>(group).allreduce({t})->wait();
  const double c = std::max(t[2].item<double>(), 1.0);
  return {t[0].item<double>() / c, t[1].item<double>() / c, static_cast<int64_t>(t[2].item<double>())};
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Masked-LM pretraining of BERT on the State of the Union corpus (run under chorusrun for DDP)"};
  app.add_option("--config", f.config, "tiny, mini, small or base")->check(CLI::IsMember({"tiny", "mini", "small", "base"}));
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
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "write checkpoint.safetensors here");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints")->check(CLI::PositiveNumber);
  examples::add_resume_option(app, f.resume);
  app.add_option("--threads", f.threads, "CPU threads per process (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data-dir", f.data_dir, "folder holding sotu/ and bert/vocab.txt (default: $CHORUS_DATA_DIR or ~/.cache/chorus/data)");
  app.add_option("--trace", f.trace, "write a Chrome trace of one DDP iteration to this file");
  app.add_option("--log-every", f.log_every_s, "seconds between progress lines");
  examples::add_amp_option(app, f.amp);
  examples::add_device_option(app, f.device);
  examples::add_pipeline_options(app, f.pipeline);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t_start = Clock::now();
    if (f.threads > 0) set_num_threads(f.threads);
    if (f.resume != "no" && f.checkpoint_dir.empty()) fail("bert: --resume needs --checkpoint-dir");
    if (f.synthetic && (f.resume != "no" || !f.checkpoint_dir.empty())) fail("bert: --synthetic does not checkpoint");
    const Device device = examples::training_device(f.device);
    examples::Job job = examples::Job::join(device);
    const bool pipelined = f.pipeline.enabled();
    if (pipelined) {
      if (f.accumulate != 1) fail("bert: --accumulate {} with a pipeline; its --micro-batches replace it", f.accumulate);
      examples::join_pipeline("bert", f.amp, job);
    } else if (f.batch_size % (job.world * f.accumulate) != 0) {
      fail("bert: --batch-size {} must be divisible by {} processes x --accumulate {}", f.batch_size, job.world,
           f.accumulate);
    }
    // Data parallel: each process reads its share; pipelined: every process the whole global batch.
    const int64_t micro = pipelined ? f.batch_size : f.batch_size / (job.world * f.accumulate);
    const std::string data_dir = f.data_dir.empty() ? data::default_data_dir() : f.data_dir;

    models::BertConfig config = models::BertConfig::named(f.config);
    if (f.seq_len > config.max_position_embeddings) {
      fail("bert: --seq-len {} exceeds the {} positions of BERT-{}", f.seq_len, config.max_position_embeddings, f.config);
    }
    data::WordPieceTokenizer tokenizer(data_dir + "/bert/vocab.txt");
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
    auto sampler = std::make_shared<data::DistributedSampler>(train->size(), pipelined ? 1 : job.world,
                                                              pipelined ? 0 : job.rank, true, f.seed);
    data::DataLoader loader(train, {.batch_size = micro, .drop_last = true, .num_workers = 1, .sampler = sampler});
    const int64_t steps_per_epoch = loader.size() / f.accumulate;
    if (steps_per_epoch < 1) fail("bert: {} sequences give no full step of batch {}", train->size(), f.batch_size);

    manual_seed(f.seed);
    auto model = std::make_shared<models::BertForPreTraining>(config);
    model->to(device);
    const int64_t parameters = examples::count_parameters(*model);
    EvalResult before;
    std::shared_ptr<distributed::DistributedDataParallel> ddp;
    examples::PipelinedModel piped;
    if (pipelined) {
      distributed::pipeline::BlockModel blocks = model->pipeline_blocks();
      model.reset();  // the stage keeps its own blocks only
      piped = examples::make_pipelined_model("bert", f.pipeline, f.amp, std::move(blocks), job, f.batch_size,
                                             heldout ? f.eval_sequences : 0, 1.0);
    } else if (job.group) {
      // The pooler and the next-sentence head take no part in masked-LM training.
      ddp = std::make_shared<distributed::DistributedDataParallel>(
          model, job.group, distributed::DDPOptions{.find_unused_parameters = true});
    }
    std::unique_ptr<distributed::pipeline::PipelineStage>& stage = piped.stage;  // null unless pipelined
    auto opt = make_optimizer(stage ? stage->named_parameters() : model->named_parameters(), f);
    optim::WarmupDecayLR sched(*opt, static_cast<int64_t>(f.warmup * f.steps), f.steps, optim::WarmupDecayLR::Decay::Linear);
    examples::MixedPrecision amp(f.amp, device.type);

    int64_t step = 0;
    // A pipelined run's checkpoint is a folder of stage files and their manifest (docs/pipeline.md).
    const std::string ckpt_path =
        f.checkpoint_dir.empty() ? ""
        : pipelined              ? distributed::pipeline::pipeline_checkpoint_manifest(f.checkpoint_dir)
                                 : f.checkpoint_dir + "/checkpoint.safetensors";
    const bool resuming = examples::should_resume(f.resume, ckpt_path);
    if (resuming && stage) {
      step = stage->load_checkpoint(f.checkpoint_dir, *opt, &sched, {{"config", f.config}, {"seq_len", std::to_string(f.seq_len)}})
                 .step;
      job.log(fmt::format("resumed from {} at step {}", ckpt_path, step));
    } else if (resuming) {
      step = examples::load_checkpoint(ckpt_path, *model, *opt, sched,
                                       {{"config", f.config}, {"seq_len", std::to_string(f.seq_len)}}, amp.scaler())
                 .step;
      job.log(fmt::format("resumed from {} at step {}", ckpt_path, step));
    }
    if (!ckpt_path.empty() && job.rank == 0) std::filesystem::create_directories(f.checkpoint_dir);
    auto save = [&] {
      if (ckpt_path.empty()) return;
      if (stage) {  // every rank takes part; each stage's first replica writes its file
        stage->save_checkpoint(f.checkpoint_dir, *opt, &sched, step / steps_per_epoch, step,
                               {{"config", f.config}, {"seq_len", std::to_string(f.seq_len)}, {"amp", f.amp}});
        job.log(fmt::format("saved {} at step {}", ckpt_path, step));
        return;
      }
      if (job.rank != 0) return;
      examples::save_checkpoint(ckpt_path, *model, *opt, sched, step / steps_per_epoch, step,
                                {{"config", f.config}, {"seq_len", std::to_string(f.seq_len)}, {"amp", f.amp}},
                                amp.scaler());
      job.log(fmt::format("saved {} at step {}", ckpt_path, step));
    };

    job.log(fmt::format("BERT-{}: {} parameters, world size {}, batch {} = {} sequences of {}, {} steps ({} per epoch), "
                        "{} threads per process",
                        f.config, parameters, job.world, f.batch_size,
                        pipelined ? "the pipeline's"
                                  : fmt::format("{} processes x {} micro-batches x {}", job.world, f.accumulate, micro),
                        f.seq_len, f.steps, steps_per_epoch, get_num_threads()));
    if (heldout && f.eval_sequences > 0 && !resuming) {
      before = stage ? evaluate_pipelined(*stage, *job.group, *heldout, f.eval_sequences, tokenizer.pad_id())
                     : evaluate(*model, *heldout, f.eval_sequences, tokenizer.pad_id(), job, device);
      job.log(fmt::format("held-out before training: masked-LM loss {:.4f} (ln {} = {:.4f}), masked-token accuracy {:.2f}% "
                          "over {} predictions",
                          before.loss, config.vocab_size, std::log(static_cast<double>(config.vocab_size)),
                          100 * before.accuracy, before.predicted));
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
      int64_t micro_i = 0;
      double step_loss = 0;
      auto t_step = Clock::now();
      for (data::Batch& b : loader) {
        const bool last_micro = micro_i + 1 == f.accumulate;
        if (micro_i == 0) {
          opt->zero_grad();
          t_step = Clock::now();
        }
        if (stage) {
          // Forward, backward, the replicas' and tied gradients' sums, clipping and the step.
          const Tensor ids = b.data;
          step_loss = stage->train_step({ids, ne(ids, tokenizer.pad_id()).to(kInt64), b.target}, {},
                                        models::BertForPreTraining::pipeline_loss, *opt)
                          .loss;
          tokens += b.data.numel();
        }
        auto run = [&] {
          Tensor loss;
          // [PAD] (id 0) only ends the corpus's last sequence; masking never writes it.
          auto call = [&] {
            auto scope = amp.autocast();
            const Tensor ids = b.data.to(device);
            return model->masked_lm_loss(ids, ne(ids, tokenizer.pad_id()).to(kInt64), b.target.to(device));
          };
          loss = ddp ? ddp->forward(call) : call();
          amp.backward(loss / static_cast<double>(f.accumulate));
          step_loss += loss.item<double>() / f.accumulate;
        };
        if (stage) {
        } else if (ddp && !last_micro) {
          auto guard = ddp->no_sync();
          run();
        } else {
          run();
        }
        if (!stage) tokens += b.data.numel() * job.world;
        if (!last_micro) {
          ++micro_i;
          continue;
        }
        micro_i = 0;
        if (!stage) {
          amp.unscale(*opt);
          optim::clip_grad_norm_(model->parameters(), 1.0);
          amp.step(*opt);
        }
        sched.step();
        ++step;
        step_times.push_back(std::chrono::duration<double>(Clock::now() - t_step).count());
        last_loss = step_loss;
        if (first_loss < 0) first_loss = step_loss;
        loss_window += step_loss;
        ++window_n;
        step_loss = 0;
        if (step == 3) examples::write_trace(ddp.get(), f.trace, job);
        const auto now = Clock::now();
        if (std::chrono::duration<double>(now - t_log).count() >= f.log_every_s || step == stop) {
          t_log = now;
          const double elapsed = std::chrono::duration<double>(now - t_train).count();
          const double seq_rate = tokens / static_cast<double>(f.seq_len) / std::max(elapsed, 1e-9);
          job.log(fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.2e} {:.1f} seq/s ETA {}", step, f.steps, epoch + 1,
                              loss_window / window_n, opt->param_groups()[0].lr(), seq_rate,
                              examples::eta_str((stop - step) * f.batch_size / std::max(seq_rate, 1e-9))));
          loss_window = 0;
          window_n = 0;
        }
        if (!f.synthetic && step % f.checkpoint_every == 0) save();
        if (step == stop || step % steps_per_epoch == 0) break;
      }
    }
    const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
    if (!f.synthetic && step % f.checkpoint_every != 0) save();
    nlohmann::json summary = {{"mode", f.synthetic ? "synthetic" : "sotu"},
                              {"config", f.config},
                              {"amp", f.amp},
                              {"skipped_steps", amp.skipped_steps()},
                              {"loss_scale", amp.scaler() ? amp.scaler()->get_scale() : 1.0},
                              {"parameters", parameters},
                              {"seq_len", f.seq_len},
                              {"batch_size", f.batch_size},
                              {"accumulate", f.accumulate},
                              {"steps", step},
                              {"first_step_loss", first_loss},
                              {"last_step_loss", last_loss},
                              {"sequences_per_s", tokens / static_cast<double>(f.seq_len) / std::max(train_s, 1e-9)},
                              {"train_s", train_s},
                              {"world_size", job.world},
                              {"threads_per_process", get_num_threads()},
                              {"device", device.str()}};
    if (!step_times.empty()) {
      std::vector<double> sorted = step_times;
      std::sort(sorted.begin(), sorted.end());
      summary["median_step_s"] = sorted[sorted.size() / 2];
    }
    if (pipelined) {
      summary["pipeline"] = examples::describe(piped.plan);
      summary["recompute"] = f.pipeline.recompute;
    }
    if (heldout && f.eval_sequences > 0) {
      EvalResult after = stage ? evaluate_pipelined(*stage, *job.group, *heldout, f.eval_sequences, tokenizer.pad_id())
                               : evaluate(*model, *heldout, f.eval_sequences, tokenizer.pad_id(), job, device);
      job.log(fmt::format("held-out after {} steps: masked-LM loss {:.4f}, masked-token accuracy {:.2f}% over {} predictions",
                          step, after.loss, 100 * after.accuracy, after.predicted));
      if (!resuming) {
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bert: error: %s\n", e.what());
    return 1;
  }
}
