#include "examples/common/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "data/mnist.h"

namespace chorus::examples {

namespace pp = distributed::pipeline;

std::string CommonFlags::data_root() const { return data_dir.empty() ? data::default_data_dir() : data_dir; }

void add_common_options(CLI::App& app, CommonFlags& f, const std::string& data_holds) {
  add_device_option(app, f.device);
  app.add_option("--threads", f.threads, "CPU threads per process (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data-dir", f.data_dir,
                 fmt::format("folder holding {} (default: $CHORUS_DATA_DIR or ~/.cache/chorus/data)", data_holds));
  add_amp_option(app, f.amp);
  app.add_option("--sharding", f.sharding,
                 "data parallel with sharded optimizer state (zero1: ZeroRedundancyOptimizer under DDP), also "
                 "gradients (shard_grad_op: ZeRO-2) and parameters (full_shard: ZeRO-3; FullyShardedDataParallel), or "
                 "none (DDP)")
      ->check(CLI::IsMember({"none", "zero1", "shard_grad_op", "full_shard"}));
  app.add_option("--checkpoint-dir", f.checkpoint_dir,
                 "write checkpoints here (checkpoint.safetensors; pipelined, a folder of stage files and "
                 "pipeline-checkpoint.json; with --sharding shard_grad_op|full_shard, a file per rank and "
                 "fsdp-checkpoint.json)");
  add_resume_option(app, f.resume);
  add_max_loss_growth_option(app, f.max_loss_growth);
  app.add_option("--trace", f.trace, "write a Chrome trace of one DDP iteration (this run's third step) to this file");
  app.add_option("--log-every", f.log_every_s, "seconds between progress lines");
  app.add_option("--tensorboard", f.tensorboard,
                 "write TensorBoard event files here (loss, learning rate, throughput, evaluations; per rank "
                 "in DIR/rank<r>: step time and DDP's timings); `tensorboard --logdir DIR` or tools/plot.py DIR");
  app.add_option("--powersgd-rank", f.powersgd_rank,
                 "data parallel: compress gradients with PowerSGD of this rank (DDP communication hook; 0: off)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--powersgd-start", f.powersgd_start, "PowerSGD: plain allreduce for the first N iterations")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--hierarchical", f.hierarchical,
               "data parallel: sum gradients inside each node, then across nodes, then gather inside "
               "(chorusrun's --nproc-per-node processes per node; PowerSGD's sums too)");
  add_pipeline_options(app, f.pipeline);
}

Job join_job(TrainerOptions& o) {
  const CommonFlags& f = o.flags;
  if (f.threads > 0) set_num_threads(f.threads);
  if (f.resume != "no" && f.checkpoint_dir.empty()) fail("{}: --resume needs --checkpoint-dir", o.program);
  o.device = training_device(f.device);
  Job job = Job::join(o.device);
  if (f.pipeline.enabled()) {
    if (o.accumulate != 1) {
      fail("{}: --accumulate {} with a pipeline; its --micro-batches replace it", o.program, o.accumulate);
    }
    if (f.powersgd_rank > 0) fail("{}: --powersgd-rank compresses DDP's gradients; a pipeline takes none", o.program);
    if (f.hierarchical) fail("{}: --hierarchical sums DDP's gradients; a pipeline takes none", o.program);
    if (f.sharding != "none") fail("{}: --sharding {} with a pipeline; choose one", o.program, f.sharding);
    join_pipeline(o.program, f.amp, job);
  } else if ((f.sharding == "shard_grad_op" || f.sharding == "full_shard") && f.amp == "fp16") {
    fail("{}: --sharding {} with --amp fp16: one loss scale over the shards is not built; use --amp bf16", o.program,
         f.sharding);
  } else if (!keeps_whole_model(f) && f.powersgd_rank > 0) {
    fail("{}: --powersgd-rank compresses DDP's allreduce; --sharding {} reduce-scatters instead", o.program, f.sharding);
  } else if (!keeps_whole_model(f) && f.hierarchical) {
    fail("{}: --hierarchical sums DDP's allreduce; --sharding {} reduce-scatters over the flat group", o.program, f.sharding);
  }
  if (!f.pipeline.enabled() && o.global_batch % (job.world * o.accumulate) != 0) {
    fail("{}: --batch-size {} must be divisible by {} processes x --accumulate {}", o.program, o.global_batch, job.world,
         o.accumulate);
  }
  return job;
}

int64_t micro_batch_size(const TrainerOptions& o, const Job& job) {
  return o.flags.pipeline.enabled() ? o.global_batch : o.global_batch / (job.world * o.accumulate);
}

std::shared_ptr<data::DistributedSampler> training_sampler(const TrainerOptions& o, const Job& job, int64_t size,
                                                           uint64_t seed) {
  const bool whole = o.flags.pipeline.enabled();
  return std::make_shared<data::DistributedSampler>(size, whole ? 1 : job.world, whole ? 0 : job.rank, true, seed);
}

void Trainer::make_stage(pp::BlockModel blocks) {
  PipelinedModel piped = make_pipelined_model(o_.program, o_.flags.pipeline, o_.flags.amp, std::move(blocks), job_,
                                              o_.global_batch, o_.eval_sequences, o_.max_grad_norm);
  plan_ = std::move(piped.plan);
  stage_ = std::move(piped.stage);
  amp_ = std::make_unique<MixedPrecision>(o_.flags.amp, o_.device.type);  // the stages apply bf16 themselves
  if (!o_.flags.checkpoint_dir.empty()) checkpoint_path_ = pp::pipeline_checkpoint_manifest(o_.flags.checkpoint_dir);
}

void Trainer::make_sharded(pp::BlockModel blocks) {
  distributed::FSDPOptions options;
  options.sharding_strategy = distributed::parse_sharding_strategy(o_.flags.sharding);
  options.flat_group = o_.param_group;
  // --amp bf16: parameters gathered and computed in bf16 over float32 shards (and autocast as
  // without sharding, which keeps softmax, norms and losses in float32).
  if (o_.flags.amp == "bf16") options.param_dtype = kBFloat16;
  fsdp_ = std::make_unique<distributed::FullyShardedDataParallel>(std::move(blocks), pipeline_group(job_), options);
  amp_ = std::make_unique<MixedPrecision>(o_.flags.amp, o_.device.type);
  job_.log(fmt::format("sharding: {} over {} processes, {} of {} parameter elements on each", o_.flags.sharding, job_.world,
                       fsdp_->shard_numel(), fsdp_->numel()));
  if (!o_.flags.checkpoint_dir.empty()) checkpoint_path_ = distributed::fsdp_checkpoint_index(o_.flags.checkpoint_dir);
}

void Trainer::make_data_parallel(std::shared_ptr<nn::Module> model) {
  model_ = std::move(model);
  if (job_.group) ddp_ = std::make_shared<distributed::DistributedDataParallel>(model_, job_.group, o_.ddp);
  if (ddp_ && o_.flags.hierarchical) {
    // chorusrun's numbering: each node holds LOCAL_WORLD_SIZE consecutive ranks.
    hierarchy_ = distributed::HierarchicalGroups::make(distributed::env_int("LOCAL_WORLD_SIZE"));
    job_.log(fmt::format("hierarchical allreduce: {} nodes x {} processes", hierarchy_->nodes(), hierarchy_->local_size()));
  }
  if (ddp_ && o_.flags.powersgd_rank > 0) {
    powersgd_ = std::make_shared<distributed::PowerSGDState>();
    powersgd_->matrix_approximation_rank = o_.flags.powersgd_rank;
    powersgd_->start_powerSGD_iter = o_.flags.powersgd_start;
    powersgd_->hierarchical = hierarchy_;
    ddp_->register_comm_hook(distributed::powerSGD_hook(powersgd_));
  } else if (hierarchy_) {
    ddp_->register_comm_hook(distributed::hierarchical_allreduce_hook(hierarchy_));
  }
  amp_ = std::make_unique<MixedPrecision>(o_.flags.amp, o_.device.type);
  if (!o_.flags.checkpoint_dir.empty()) checkpoint_path_ = o_.flags.checkpoint_dir + "/checkpoint.safetensors";
}

std::unique_ptr<optim::Optimizer> Trainer::make_optimizer(std::vector<optim::ParamGroup> groups,
                                                          const OptimizerFactory& make) {
  if (o_.flags.sharding != "zero1") return make(std::move(groups));
  auto zero = std::make_unique<distributed::ZeroRedundancyOptimizer>(std::move(groups), pipeline_group(job_), make);
  zero_ = zero.get();
  return zero;
}

std::unique_ptr<optim::Optimizer> Trainer::make_adamw(const optim::AdamOptions& options, double weight_decay) {
  optim::ParamGroup decay, no_decay;
  decay.params = parameters("decay");
  no_decay.params = parameters("no_decay");
  decay.options["weight_decay"] = weight_decay;
  no_decay.options["weight_decay"] = 0.0;
  return make_optimizer({decay, no_decay}, [options](std::vector<optim::ParamGroup> groups) {
    return std::make_unique<optim::AdamW>(std::move(groups), options);
  });
}

std::vector<Tensor> Trainer::parameters() const {
  return stage_ ? stage_->parameters() : fsdp_ ? fsdp_->parameters() : model_->parameters();
}

std::vector<Tensor> Trainer::parameters(const std::string& key) const {
  if (!o_.param_group) fail("{}: Trainer::parameters(\"{}\") without a param_group in the options", o_.program, key);
  if (fsdp_) return fsdp_->parameters(key);
  std::vector<Tensor> out;
  for (const auto& [name, p] : named_parameters())
    if (o_.param_group(name, p) == key) out.push_back(p);
  return out;
}

nn::NamedTensors Trainer::named_parameters() const {
  return stage_ ? stage_->named_parameters() : fsdp_ ? fsdp_->named_parameters() : model_->named_parameters();
}

nn::NamedTensors Trainer::whole_state_dict() {
  if (stage_) return stage_->gather_state_dict(0);
  if (fsdp_) return fsdp_->full_state_dict();
  return model_->state_dict();
}

int64_t Trainer::start(optim::Optimizer& optimizer, optim::LRScheduler* scheduler) {
  optimizer_ = &optimizer;
  scheduler_ = scheduler;
  if (scheduler == nullptr && !checkpoint_path_.empty()) {
    fail("{}: Trainer::start without a scheduler, but checkpoints hold one (--checkpoint-dir)", o_.program);
  }
  resumed_ = agree_to_resume(o_.program, o_.flags.resume, checkpoint_path_, job_.group.get());
  int64_t step = 0;
  if (resumed_) {
    nn::Checkpoint c;
    if (stage_) {  // (these two agree across ranks themselves)
      c = stage_->load_checkpoint(o_.flags.checkpoint_dir, optimizer, scheduler, o_.identity);
    } else if (fsdp_) {  // any world size: the shards are cut again when it differs
      c = fsdp_->load_checkpoint(o_.flags.checkpoint_dir, optimizer, scheduler, o_.identity);
    } else {
      on_every_rank(job_.group.get(), o_.program, fmt::format("loading the checkpoint {}", checkpoint_path_), [&] {
        c = load_checkpoint(checkpoint_path_, *model_, optimizer, *scheduler, o_.identity, amp_->scaler());
      });
    }
    step = c.step;
    guard_.resumed(c.extra, step, checkpoint_path_);
    job_.log(fmt::format("resumed from {} at step {}", checkpoint_path_, step));
  }
  if (model_ && !checkpoint_path_.empty() && job_.rank == 0) std::filesystem::create_directories(o_.flags.checkpoint_dir);
  global_step_ = step;
  return step;
}

Lists Trainer::on_device(const Lists& batch) const {
  Lists out;
  for (const Tensor& t : batch.inputs) out.inputs.push_back(t.to(o_.device));
  for (const Tensor& t : batch.targets) out.targets.push_back(t.to(o_.device));
  return out;
}

double Trainer::step(const std::vector<Lists>& micro_batches) {
  if (optimizer_ == nullptr) fail("{}: Trainer::step before Trainer::start (which takes the optimizer)", o_.program);
  const int64_t n = static_cast<int64_t>(micro_batches.size());
  const auto started = std::chrono::steady_clock::now();
  const double lr = optimizer_->param_groups().empty() ? 0.0 : optimizer_->param_groups().front().lr();
  double loss_value = 0;
  std::optional<double> grad_norm;  // before clipping, when the step clips
  bool applied = true;              // false: --amp fp16's scaler skipped the step (overflow)
  if (stage_) {
    if (n != 1) fail("{}: a pipelined step takes one global batch, got {} micro-batches", o_.program, n);
    // Forward, backward, the replicas' and tied gradients' sums, clipping and the step.
    loss_value = stage_->train_step(micro_batches[0].inputs, micro_batches[0].targets, task_.loss, *optimizer_).loss;
  } else {
    if (n != o_.accumulate) fail("{}: a step takes {} micro-batches (--accumulate), got {}", o_.program, o_.accumulate, n);
    optimizer_->zero_grad();
    for (int64_t i = 0; i < n; ++i) {
      const Lists batch = on_device(micro_batches[static_cast<size_t>(i)]);
      auto call = [&] {
        auto scope = amp_->autocast();
        return task_.loss(fsdp_ ? fsdp_->forward(batch.inputs) : task_.forward(batch.inputs), batch.targets);
      };
      auto run = [&] {
        const Tensor loss = ddp_ ? ddp_->forward(call) : call();
        amp_->backward(n == 1 ? loss : loss / static_cast<double>(n));
        loss_value += loss.item<double>() / static_cast<double>(n);
      };
      if (ddp_ && i + 1 < n) {  // gradients are reduced once, with the last micro-batch
        auto no_sync = ddp_->no_sync();
        run();
      } else {
        run();
      }
    }
    if (o_.max_grad_norm > 0) {
      amp_->unscale(*optimizer_);
      if (fsdp_) grad_norm = fsdp_->clip_grad_norm_(o_.max_grad_norm);  // the whole model's norm over the shards
      else grad_norm = optim::clip_grad_norm_(model_->parameters(), o_.max_grad_norm);
    }
    applied = amp_->step(*optimizer_);
    if (job_.group && job_.world > 1) {  // the global batch's mean, as a pipeline reports it (not rank 0's share alone)
      Tensor t = tensor<double>({loss_value});
      job_.group->allreduce({t})->wait();
      loss_value = t.item<double>() / job_.world;
    }
  }
  if (++steps_run_ == 3) write_trace(ddp_.get(), o_.flags.trace, job_);
  ++global_step_;
  guard_.observe(global_step_, loss_value, applied);
  if (tensorboard_.enabled()) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    tensorboard_.scalar("train/loss", loss_value, global_step_);
    tensorboard_.scalar("train/lr", lr, global_step_);
    tensorboard_.scalar("train/examples_per_s", static_cast<double>(o_.global_batch) / seconds, global_step_);
    // fp16's loss scale may skip a step (inf/nan gradients): its norm is not a gradient's.
    if (grad_norm && std::isfinite(*grad_norm)) tensorboard_.scalar("train/grad_norm", *grad_norm, global_step_);
    tensorboard_.rank_scalar("train/step_ms", seconds * 1e3, global_step_);
    tensorboard_.ddp_iteration(ddp_.get(), global_step_);
  }
  return loss_value;
}

std::optional<double> Trainer::feed(Lists micro_batch) {
  pending_.push_back(std::move(micro_batch));
  if (static_cast<int64_t>(pending_.size()) < micro_batches_per_step()) return std::nullopt;
  std::vector<Lists> batches = std::move(pending_);
  pending_.clear();
  return step(batches);
}

void Trainer::save(int64_t epochs_done, int64_t step, const nn::Metadata& extra) {
  if (checkpoint_path_.empty()) return;
  if (optimizer_ == nullptr) fail("{}: Trainer::save before Trainer::start (which takes the optimizer)", o_.program);
  // Every rank, before any writes: a diverged model must not replace the last good checkpoint.
  guard_.check(step, checkpoint_path_, job_.group.get());
  nn::Metadata all = o_.identity;
  all["amp"] = o_.flags.amp;
  for (const auto& [key, value] : guard_.metadata()) all[key] = value;
  for (const auto& [key, value] : extra) all[key] = value;
  if (stage_) {  // every rank takes part; each stage's first replica writes its file
    stage_->save_checkpoint(o_.flags.checkpoint_dir, *optimizer_, scheduler_, epochs_done, step, all);
  } else if (fsdp_) {  // every rank writes its shards
    fsdp_->save_checkpoint(o_.flags.checkpoint_dir, *optimizer_, scheduler_, epochs_done, step, all);
  } else {
    // zero1: the whole optimizer state gathered on rank 0 first (a collective), so the file is a
    // plain DDP checkpoint that loads at any world size.
    if (zero_) zero_->consolidate_state_dict(0);
    if (job_.rank == 0) save_checkpoint(checkpoint_path_, *model_, *optimizer_, *scheduler_, epochs_done, step, all, amp_->scaler());
  }
  job_.log(fmt::format("saved {} at step {}", checkpoint_path_, step));
}

std::vector<double> Trainer::evaluate(const data::Dataset& dataset, int64_t limit, int64_t batch, size_t width,
                                      const std::function<Lists(const data::Batch&)>& lists,
                                      const std::function<std::vector<double>(const TensorList&, const TensorList&)>& stats) {
  const int64_t n = limit > 0 ? std::min(limit, dataset.size()) : dataset.size();
  std::vector<double> sums(width, 0.0);
  auto add = [&](const std::vector<double>& s) {
    if (s.size() != width) fail("{}: evaluation statistics of {} values, expected {}", o_.program, s.size(), width);
    for (size_t i = 0; i < width; ++i) sums[i] += s[i];
  };
  if (stage_) {
    const int64_t global = plan_.global_batch;
    auto counting = [&](const TensorList& outputs, const TensorList& targets) {
      add(stats(outputs, targets));
      return task_.loss(outputs, targets);
    };
    for (int64_t start = 0; start + global <= n; start += global) {
      std::vector<int64_t> rows(static_cast<size_t>(global));
      std::iota(rows.begin(), rows.end(), start);
      const Lists b = lists(dataset.get_batch(rows));
      stage_->eval_step(b.inputs, b.targets, counting);
    }
  } else {
    NoGradGuard no_grad;
    nn::Module& model = fsdp_ ? fsdp_->module() : *model_;
    model.eval();
    std::vector<int64_t> mine;
    for (int64_t i = job_.rank; i < n; i += job_.world) mine.push_back(i);
    for (size_t start = 0; start < mine.size(); start += static_cast<size_t>(batch)) {
      std::vector<int64_t> chunk(mine.begin() + start, mine.begin() + std::min(mine.size(), start + batch));
      const Lists b = on_device(lists(dataset.get_batch(chunk)));
      add(stats(fsdp_ ? fsdp_->forward(b.inputs) : task_.forward(b.inputs), b.targets));
    }
    // [Every rank the same number of FSDP forwards] Each FSDP forward all-gathers every unit, so
    // the ranks must run as many as rank 0, whose share is the largest: a rank with one batch fewer
    // runs a forward on one example and counts nothing from it. Until 2026-12-04 33 sequences on 2
    // ranks in batches of 8 gave rank 0 three forwards and rank 1 two, and rank 1's allreduce of
    // the sums met rank 0's all-gathers (a helper's audit; examples_test's gpt --sharding case).
    if (fsdp_ && n > 0) {
      const int64_t most = ((n + job_.world - 1) / job_.world + batch - 1) / batch;
      const int64_t done = (static_cast<int64_t>(mine.size()) + batch - 1) / batch;
      for (int64_t k = done; k < most; ++k) (void)fsdp_->forward(on_device(lists(dataset.get_batch({0}))).inputs);
    }
    model.train();
  }
  if (job_.group && width > 0) {
    Tensor t = tensor<double>(sums);
    job_.group->allreduce({t})->wait();
    const double* p = t.data_ptr<double>();
    sums.assign(p, p + width);
  }
  return sums;
}

nlohmann::json Trainer::summary() const {
  nlohmann::json s = {{"amp", o_.flags.amp},
                      {"skipped_steps", amp_->skipped_steps()},
                      {"loss_scale", amp_->scaler() ? amp_->scaler()->get_scale() : 1.0},
                      {"device", o_.device.str()},
                      {"world_size", job_.world},
                      {"threads_per_process", get_num_threads()}};
  if (hierarchy_) s["hierarchical"] = {{"nodes", hierarchy_->nodes()}, {"local_size", hierarchy_->local_size()}};
  if (powersgd_) {
    s["powersgd"] = {{"rank", powersgd_->matrix_approximation_rank},
                     {"start_iter", powersgd_->start_powerSGD_iter},
                     {"sent_elements", powersgd_->sent_elements},
                     {"allreduce_elements", powersgd_->uncompressed_elements},
                     {"compression", powersgd_->compression_rate()}};
  }
  if (zero_) s["sharding"] = "zero1";
  if (fsdp_) {
    s["sharding"] = o_.flags.sharding;
    s["shard_elements"] = fsdp_->shard_numel();
    s["parameter_elements"] = fsdp_->numel();
  }
  if (stage_) {
    s["pipeline"] = describe(plan_);
    s["recompute"] = o_.flags.pipeline.recompute;
  }
  return s;
}

}  // namespace chorus::examples
