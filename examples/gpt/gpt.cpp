// Causal language modelling with GPT-2 (Hugging Face GPT2LMHeadModel's names; examples/models/gpt.h)
// on the State of the Union corpus, on one process or data-parallel under chorusrun, then text
// sampled from a prompt:
//
//   bazel-bin/distributed/launcher/chorusrun --nproc-per-node 2 bazel-bin/examples/gpt/gpt --steps 300
//   bazel-bin/examples/gpt/gpt --config tiny --steps 50 --sample 200 --temperature 0.8 --top-k 20
//
// Tokens are bytes (--tokenizer bytes, the default: a 256-symbol vocabulary) or byte-level BPE
// (--tokenizer bpe: data/bpe.h, --vocab-size tokens learned from the training addresses by every
// rank alike, so nothing needs a vocabulary file); either way every text round-trips. The addresses (233, 1790-2021, in file-name order, so by date) are joined with a blank
// line between them; the last --heldout-addresses are held out. Each stream is cut into
// --seq-len token windows, the targets being the same tokens shifted by one. AdamW with GPT-2's
// betas (0.9, 0.95) and weight decay on the 2-D weights only (projections and embeddings, as
// nanoGPT's; none on biases and LayerNorm), linear warm-up over --warmup of the steps then cosine
// decay to a tenth of --lr, gradient clipping at norm 1.
// --batch-size is the global batch per step, split over the processes. The held-out loss (nats per
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
#include "distributed/ddp.h"
#include "examples/common/example_util.h"
#include "examples/common/pipeline_flags.h"
#include "examples/models/gpt.h"
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
  int64_t batch_size = 16;
  int64_t steps = 300;
  int64_t max_steps = 0;
  double lr = 1e-3;
  double weight_decay = 0.1;
  double warmup = 0.1;
  int64_t heldout_addresses = 3;
  int64_t eval_sequences = 64;
  uint64_t seed = 1;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 100;
  std::string resume = "no";  // no, always (the bare flag), auto (when a checkpoint exists)
  int threads = 0;
  std::string data_dir;
  double log_every_s = 10;
  std::string amp = "none";
  std::string device = "auto";
  int64_t sample = 0;
  std::string prompt = "Mr. Speaker, ";
  double temperature = 0.8;
  int64_t top_k = 0;
  std::string tokenizer = "bytes";
  int64_t vocab_size = 1024;
  examples::PipelineFlags pipeline;
};

// Text to token ids and back: bytes, or byte-level BPE learned from the training text.
struct Tokenizer {
  std::optional<data::BytePairTokenizer> bpe;
  int64_t vocab_size() const { return bpe ? bpe->vocab_size() : 256; }
  std::vector<int64_t> encode(const std::string& text) const {
    if (bpe) return bpe->encode(text);
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (char ch : text) ids.push_back(static_cast<unsigned char>(ch));
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const {
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
// embeddings), none on biases and LayerNorm.
std::unique_ptr<optim::AdamW> make_optimizer(const std::vector<Tensor>& params, const Flags& f) {
  optim::ParamGroup decay, no_decay;
  for (const Tensor& p : params) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  decay.options["weight_decay"] = f.weight_decay;
  no_decay.options["weight_decay"] = 0.0;
  optim::AdamOptions o = optim::AdamW::default_options();
  o.lr = f.lr;
  o.beta2 = 0.95;
  return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{decay, no_decay}, o);
}

// Mean held-out loss per token over the first `limit` windows, each rank taking every world-th,
// summed over ranks.
double evaluate(models::GPT2LMHeadModel& model, const data::TensorDataset& heldout, int64_t limit,
                const examples::Job& job, Device device) {
  NoGradGuard no_grad;
  model.eval();
  double loss_sum = 0, count = 0;
  const int64_t n = std::min(limit, heldout.size());
  std::vector<int64_t> mine;
  for (int64_t i = job.rank; i < n; i += job.world) mine.push_back(i);
  for (size_t start = 0; start < mine.size(); start += 16) {
    std::vector<int64_t> chunk(mine.begin() + start, mine.begin() + std::min(mine.size(), start + 16));
    data::Batch b = heldout.get_batch(chunk);
    Tensor loss = model.loss(b.data.to(device), b.target.to(device));
    loss_sum += loss.item<double>() * b.target.numel();
    count += static_cast<double>(b.target.numel());
  }
  model.train();
  if (job.group) {
    Tensor t = tensor<double>({loss_sum, count});
    job.group->allreduce({t})->wait();
    loss_sum = t[0].item<double>();
    count = t[1].item<double>();
  }
  return loss_sum / std::max(count, 1.0);
}

// The same through the pipeline's stages (PipelineStage::eval_step: forward only): the first
// `limit` windows rounded down to whole global batches, every rank reading the same.
double evaluate_pipelined(distributed::pipeline::PipelineStage& stage, const data::TensorDataset& heldout, int64_t limit) {
  const int64_t batch = stage.plan().global_batch;
  const int64_t n = std::min(limit, heldout.size()) / batch * batch;
  double loss_sum = 0, count = 0;
  for (int64_t start = 0; start < n; start += batch) {
    std::vector<int64_t> rows(static_cast<size_t>(batch));
    std::iota(rows.begin(), rows.end(), start);
    data::Batch b = heldout.get_batch(rows);
    // Every window has seq_len tokens: the global batch's mean is the mean per token.
    loss_sum += stage.eval_step({b.data}, {b.target}, models::GPT2LMHeadModel::pipeline_loss).loss * b.target.numel();
    count += static_cast<double>(b.target.numel());
  }
  return loss_sum / std::max(count, 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Causal language modelling with GPT-2 on the State of the Union corpus (run under chorusrun for DDP)"};
  app.add_option("--config", f.config, "tiny, mini, gpt2, gpt2-medium, gpt2-large or gpt2-xl (with a byte vocabulary)")
      ->check(CLI::IsMember({"tiny", "mini", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}));
  app.add_option("--tokenizer", f.tokenizer, "bytes, or bpe (byte-level BPE learned from the training addresses)")
      ->check(CLI::IsMember({"bytes", "bpe"}));
  app.add_option("--vocab-size", f.vocab_size, "BPE vocabulary size (256 bytes + merges) with --tokenizer bpe")
      ->check(CLI::Range(257, 65536));
  app.add_option("--seq-len", f.seq_len, "tokens per sequence")->check(CLI::Range(2, 1024));
  app.add_option("--batch-size", f.batch_size, "global sequences per optimizer step")->check(CLI::PositiveNumber);
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
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "write checkpoint.safetensors here");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints")->check(CLI::PositiveNumber);
  examples::add_resume_option(app, f.resume);
  app.add_option("--threads", f.threads, "CPU threads per process (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data-dir", f.data_dir, "folder holding sotu/ (default: $CHORUS_DATA_DIR or ~/.cache/chorus/data)");
  app.add_option("--log-every", f.log_every_s, "seconds between progress lines");
  app.add_option("--sample", f.sample, "after training, generate this many tokens from --prompt")
      ->check(CLI::Range(0, 100000));
  app.add_option("--prompt", f.prompt, "text the sample continues");
  app.add_option("--temperature", f.temperature, "sampling temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-k", f.top_k, "sample among the k most likely tokens (0: all)")->check(CLI::Range(0, 65536));
  examples::add_amp_option(app, f.amp);
  examples::add_device_option(app, f.device);
  examples::add_pipeline_options(app, f.pipeline);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t_start = Clock::now();
    if (f.threads > 0) set_num_threads(f.threads);
    if (f.resume != "no" && f.checkpoint_dir.empty()) fail("gpt: --resume needs --checkpoint-dir");
    if (f.sample > 0 && f.prompt.empty()) fail("gpt: --sample needs a --prompt of at least one byte");
    const Device device = examples::training_device(f.device);
    examples::Job job = examples::Job::join(device);
    const bool pipelined = f.pipeline.enabled();
    if (pipelined) {
      examples::join_pipeline("gpt", f.amp, job);
    } else if (f.batch_size % job.world != 0) {
      fail("gpt: --batch-size {} must be divisible by the {} processes", f.batch_size, job.world);
    }
    // Data parallel: each process reads its share of the global batch; pipelined: every process
    // reads the whole global batch (the stages cut it into micro-batches and replicas).
    const int64_t micro = pipelined ? f.batch_size : f.batch_size / job.world;

    models::GPTConfig config = models::GPTConfig::named(f.config);
    if (f.seq_len > config.n_positions) {
      fail("gpt: --seq-len {} exceeds the {} positions of --config {}", f.seq_len, config.n_positions, f.config);
    }
    const std::string data_dir = f.data_dir.empty() ? data::default_data_dir() : f.data_dir;
    const ByteCorpus corpus = load_corpus(data_dir + "/sotu", f.heldout_addresses);
    Tokenizer tok;
    if (f.tokenizer == "bpe") {
      const auto t_bpe = Clock::now();
      tok.bpe = data::BytePairTokenizer::train(corpus.train, f.vocab_size);
      job.log(fmt::format("byte-level BPE: {} tokens learned from the training addresses in {:.1f} s", tok.vocab_size(),
                          std::chrono::duration<double>(Clock::now() - t_bpe).count()));
    }
    if (f.top_k > tok.vocab_size()) fail("gpt: --top-k {} exceeds the vocabulary of {} tokens", f.top_k, tok.vocab_size());
    config.vocab_size = tok.vocab_size();
    const std::vector<int64_t> train_ids = tok.encode(corpus.train), heldout_ids = tok.encode(corpus.heldout);
    auto train = windows(train_ids, f.seq_len);
    auto heldout = windows(heldout_ids, f.seq_len);
    job.log(fmt::format("corpus: {} addresses, {} training bytes = {} tokens ({} sequences of {}), {} held-out bytes = {} "
                        "tokens ({} addresses, {} sequences)",
                        corpus.documents, corpus.train.size(), train_ids.size(), train->size(), f.seq_len,
                        corpus.heldout.size(), heldout_ids.size(), corpus.heldout_documents, heldout->size()));
    auto sampler = std::make_shared<data::DistributedSampler>(train->size(), pipelined ? 1 : job.world,
                                                              pipelined ? 0 : job.rank, true, f.seed);
    data::DataLoader loader(train, {.batch_size = micro, .drop_last = true, .num_workers = 0, .sampler = sampler});
    const int64_t steps_per_epoch = loader.size();
    if (steps_per_epoch < 1) fail("gpt: {} sequences give no full step of batch {}", train->size(), f.batch_size);

    manual_seed(f.seed);
    auto model = std::make_shared<models::GPT2LMHeadModel>(config);
    model->to(device);
    const int64_t parameters = examples::count_parameters(*model);
    double before = -1;
    // A pipelined run's checkpoint is a folder of stage files and their manifest (docs/pipeline.md).
    const std::string ckpt_path =
        f.checkpoint_dir.empty() ? ""
        : pipelined              ? distributed::pipeline::pipeline_checkpoint_manifest(f.checkpoint_dir)
                                 : f.checkpoint_dir + "/checkpoint.safetensors";
    const bool resuming = examples::should_resume(f.resume, ckpt_path);
    std::shared_ptr<distributed::DistributedDataParallel> ddp;
    examples::PipelinedModel piped;
    if (pipelined) {
      distributed::pipeline::BlockModel blocks = model->pipeline_blocks();
      model.reset();  // the stage keeps its own blocks only
      piped = examples::make_pipelined_model("gpt", f.pipeline, f.amp, std::move(blocks), job, f.batch_size,
                                             f.eval_sequences, 1.0);
    } else if (job.group) {
      ddp = std::make_shared<distributed::DistributedDataParallel>(model, job.group);
    }
    std::unique_ptr<distributed::pipeline::PipelineStage>& stage = piped.stage;  // null unless pipelined
    auto opt = make_optimizer(stage ? stage->parameters() : model->parameters(), f);
    optim::WarmupDecayLR sched(*opt, static_cast<int64_t>(f.warmup * f.steps), f.steps,
                               optim::WarmupDecayLR::Decay::Cosine, f.lr / 10);
    examples::MixedPrecision amp(f.amp, device.type);

    int64_t step = 0;
    const nn::Metadata identity = {{"model", "gpt"},
                                   {"config", f.config},
                                   {"seq_len", std::to_string(f.seq_len)},
                                   {"tokenizer", f.tokenizer},
                                   {"vocab_size", std::to_string(tok.vocab_size())}};
    if (resuming && stage) {
      step = stage->load_checkpoint(f.checkpoint_dir, *opt, &sched, identity).step;
      job.log(fmt::format("resumed from {} at step {}", ckpt_path, step));
    } else if (resuming) {
      step = examples::load_checkpoint(ckpt_path, *model, *opt, sched, identity, amp.scaler()).step;
      job.log(fmt::format("resumed from {} at step {}", ckpt_path, step));
    }
    if (!ckpt_path.empty() && job.rank == 0) std::filesystem::create_directories(f.checkpoint_dir);
    auto save = [&] {
      if (ckpt_path.empty()) return;
      nn::Metadata extra = identity;
      extra["amp"] = f.amp;
      if (stage) {  // every rank takes part; each stage's first replica writes its file
        stage->save_checkpoint(f.checkpoint_dir, *opt, &sched, step / steps_per_epoch, step, extra);
        job.log(fmt::format("saved {} at step {}", ckpt_path, step));
        return;
      }
      if (job.rank != 0) return;
      examples::save_checkpoint(ckpt_path, *model, *opt, sched, step / steps_per_epoch, step, extra, amp.scaler());
      job.log(fmt::format("saved {} at step {}", ckpt_path, step));
    };

    job.log(fmt::format("GPT-2 {}: {} parameters ({} layers, {} wide, {} heads, {} vocabulary of {}), world size {}, batch {} "
                        "= {} sequences of {}, {} steps ({} per epoch), {} threads per process",
                        f.config, parameters, config.n_layer, config.n_embd, config.n_head, f.tokenizer,
                        tok.vocab_size(), job.world, f.batch_size,
                        pipelined ? "the pipeline's" : fmt::format("{} processes x {}", job.world, micro), f.seq_len,
                        f.steps, steps_per_epoch, get_num_threads()));
    if (f.eval_sequences > 0 && !resuming) {
      before = stage ? evaluate_pipelined(*stage, *heldout, f.eval_sequences)
                     : evaluate(*model, *heldout, f.eval_sequences, job, device);
      job.log(fmt::format("held-out before training: loss {:.4f} (ln {} = {:.4f}), perplexity {:.2f}", before,
                          tok.vocab_size(), std::log(static_cast<double>(tok.vocab_size())), std::exp(before)));
    }

    const int64_t stop = f.max_steps > 0 ? std::min(f.steps, f.max_steps) : f.steps;
    double loss_window = 0, last_loss = 0, first_loss = -1;
    int64_t window_n = 0, tokens = 0;
    const auto t_train = Clock::now();
    auto t_log = t_train;
    while (step < stop) {
      const int64_t epoch = step / steps_per_epoch;
      loader.set_epoch(epoch);
      loader.skip_batches(step % steps_per_epoch);
      for (data::Batch& b : loader) {
        if (stage) {
          // Forward, backward, the replicas' and tied gradients' sums, clipping and the step.
          last_loss = stage->train_step({b.data}, {b.target}, models::GPT2LMHeadModel::pipeline_loss, *opt).loss;
        } else {
          opt->zero_grad();
          auto call = [&] {
            auto scope = amp.autocast();
            return model->loss(b.data.to(device), b.target.to(device));
          };
          Tensor loss = ddp ? ddp->forward(call) : call();
          amp.backward(loss);
          amp.unscale(*opt);
          optim::clip_grad_norm_(model->parameters(), 1.0);
          amp.step(*opt);
          last_loss = loss.item<double>();
        }
        sched.step();
        ++step;
        tokens += b.data.numel() * (pipelined ? 1 : job.world);
        if (first_loss < 0) first_loss = last_loss;
        loss_window += last_loss;
        ++window_n;
        const auto now = Clock::now();
        if (std::chrono::duration<double>(now - t_log).count() >= f.log_every_s || step == stop) {
          t_log = now;
          const double elapsed = std::chrono::duration<double>(now - t_train).count();
          const double rate = tokens / std::max(elapsed, 1e-9);
          job.log(fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.2e} {:.0f} tokens/s ETA {}", step, f.steps, epoch + 1,
                              loss_window / window_n, opt->param_groups()[0].lr(), rate,
                              examples::eta_str((stop - step) * f.batch_size * f.seq_len / std::max(rate, 1e-9))));
          loss_window = 0;
          window_n = 0;
        }
        if (step % f.checkpoint_every == 0) save();
        if (step == stop || step % steps_per_epoch == 0) break;
      }
    }
    const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
    if (step % f.checkpoint_every != 0) save();
    if (stage && f.sample > 0) {
      // Sampling runs on rank 0 with the whole model, gathered from the stages.
      nn::NamedTensors whole = stage->gather_state_dict(0);
      if (job.rank == 0) {
        models::GPTConfig c = config;
        c.initialize = false;
        model = std::make_shared<models::GPT2LMHeadModel>(c);
        model->to(device);
        model->load_state_dict(whole);
      }
    }
    nlohmann::json summary = {{"config", f.config},
                              {"tokenizer", f.tokenizer},
                              {"vocab_size", tok.vocab_size()},
                              {"amp", f.amp},
                              {"parameters", parameters},
                              {"seq_len", f.seq_len},
                              {"batch_size", f.batch_size},
                              {"steps", step},
                              {"first_step_loss", first_loss},
                              {"last_step_loss", last_loss},
                              {"tokens_per_s", tokens / std::max(train_s, 1e-9)},
                              {"train_s", train_s},
                              {"world_size", job.world},
                              {"threads_per_process", get_num_threads()},
                              {"device", device.str()}};
    if (pipelined) {
      summary["pipeline"] = examples::describe(piped.plan);
      summary["recompute"] = f.pipeline.recompute;
    }
    if (f.eval_sequences > 0) {
      const double after = stage ? evaluate_pipelined(*stage, *heldout, f.eval_sequences)
                                 : evaluate(*model, *heldout, f.eval_sequences, job, device);
      job.log(fmt::format("held-out after {} steps: loss {:.4f}, perplexity {:.2f}", step, after, std::exp(after)));
      if (!resuming) {
        summary["heldout_loss_before"] = before;
        summary["heldout_perplexity_before"] = std::exp(before);
      }
      summary["heldout_loss"] = after;
      summary["heldout_perplexity"] = std::exp(after);
    }
    if (f.sample > 0 && job.rank == 0) {
      // Its own generator, seeded by --seed: the sample does not depend on how training drew numbers.
      Generator gen(f.seed);
      const std::vector<int64_t> prompt_ids = tok.encode(f.prompt);
      const std::vector<int64_t> ids = model->generate(
          prompt_ids, {.max_new_tokens = f.sample, .temperature = f.temperature, .top_k = f.top_k, .generator = &gen});
      const std::string text = tok.decode(ids);
      job.log(fmt::format("sample (temperature {}, top-k {}):\n{}{}", f.temperature, f.top_k, f.prompt, text));
      summary["sample"] = text;
    }
    summary["wall_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
    // A sample may cut a UTF-8 character in two: such bytes print as U+FFFD in the JSON line.
    job.log(nlohmann::json{{"summary", summary}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    job.finish();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: error: %s\n", e.what());
    return 1;
  }
}
