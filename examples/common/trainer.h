// What the training examples (bert, gpt, resnet) share, so that each example's file is its model
// and its data: the flags every one takes (device, threads, data folder, --amp, checkpoints and
// --resume, the DDP trace, progress lines, the pipeline flags), and a Trainer that runs one
// optimizer step whichever way the job is laid out:
//
//   - alone or data-parallel (DDP when chorusrun started several processes): the whole model on
//     each rank, --accumulate micro-batches per step (DDP's no_sync on all but the last), --amp
//     bf16/fp16 (fp16 with a GradScaler), clipping, one checkpoint file written by rank 0;
//   - pipelined (any pipeline flag, docs/pipeline.md): the model's pipeline_blocks() cut into
//     stages, every rank given the whole global batch, a sharded checkpoint folder;
//   - sharded (--sharding shard_grad_op|full_shard, docs/sharding.md): the model's pipeline_blocks()
//     under FullyShardedDataParallel, each rank its share of the batch as with DDP; --sharding zero1
//     is DDP with the optimizer's state sharded (ZeroRedundancyOptimizer, make_optimizer).
//
// An example describes its model once, for both:
//
//   examples::Task task{.forward = [&](const TensorList& in) { return TensorList{model->forward(in[0])}; },
//                       .loss = models::GPT2LMHeadModel::pipeline_loss};
//   examples::Trainer trainer(options, job, model, task);   // pipelined: `model` is released
//   auto opt = make_optimizer(trainer.named_parameters());
//   int64_t step = trainer.start(*opt, &sched);             // resumes when --resume says so
//   for (...) {
//     double loss = trainer.step({{{x}, {y}}});                // {inputs, targets} of one batch
//     sched.step();
//     if (++step % every == 0) trainer.save(epoch, step);     // every rank calls it
//   }
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/pipeline/pipeline.h"
#include "distributed/powersgd.h"
#include "distributed/zero_redundancy_optimizer.h"
#include "examples/common/example_util.h"
#include "examples/common/loss_guard.h"
#include "examples/common/pipeline_flags.h"
#include "examples/common/tensorboard_log.h"

namespace chorus::examples {

// The flags every training example takes, registered by add_common_options.
struct CommonFlags {
  std::string device = "auto";
  int threads = 0;
  std::string data_dir;  // empty: data::default_data_dir()
  std::string amp = "none";
  std::string checkpoint_dir;
  std::string resume = "no";  // no, always (the bare flag), auto (when a checkpoint exists)
  std::string trace;
  double log_every_s = 10;
  std::string sharding = "none";    // none, zero1 (ZeroRedundancyOptimizer), shard_grad_op or full_shard (FSDP)
  int powersgd_rank = 0;            // DDP's PowerSGD hook of this rank (0: plain allreduce)
  int64_t powersgd_start = 10;      // iterations of plain allreduce first
  bool hierarchical = false;        // DDP's sums inside each node, then across (distributed/hierarchical.h)
  std::string tensorboard;          // --tensorboard DIR: TensorBoard event files (tensorboard_log.h)
  double max_loss_growth = 10;      // the divergence check before each save (loss_guard.h; 0: off)
  PipelineFlags pipeline;

  // --data-dir's value or the default folder.
  std::string data_root() const;
};

// Whether the flags keep the whole model on each rank (DDP, zero1), so that an example's
// Task::forward may use it; pipelines and FSDP take the model's blocks instead.
inline bool keeps_whole_model(const CommonFlags& f) {
  return !f.pipeline.enabled() && f.sharding != "shard_grad_op" && f.sharding != "full_shard";
}

// `data_holds`: what --data-dir must hold, for its help ("sotu/ and bert/vocab.txt").
void add_common_options(CLI::App& app, CommonFlags& f, const std::string& data_holds);

// A batch as the model takes it: the first block's inputs and the loss's targets (either may be
// empty: BERT carries its labels through the stages as an input).
struct Lists {
  TensorList inputs, targets;
};

// An example's model, as both ways of training need it: `forward` runs the whole model (data
// parallel, and evaluation without a pipeline) from the inputs to the outputs the last pipeline
// block gives; `loss` is the mean loss of such outputs and targets (the pipeline's loss).
struct Task {
  std::function<TensorList(const TensorList& inputs)> forward;
  distributed::pipeline::MultiLossFn loss;
};

struct TrainerOptions {
  std::string program;           // names the example in errors and logs
  Device device = Device::cpu();
  int64_t global_batch = 1;      // examples per optimizer step, over all processes
  int64_t accumulate = 1;        // data parallel: micro-batches per step on each process
  int64_t eval_sequences = 0;    // pipelined evaluation takes whole global batches: 0 or at least one
  double max_grad_norm = 0;      // clipping of the whole model's gradient norm (0: none)
  distributed::DDPOptions ddp;   // data parallel under chorusrun
  nn::Metadata identity;         // written into every checkpoint; a resumed checkpoint must match it
  // The optimizer group of a parameter, by its whole-model name (e.g. "decay" for matrices): what
  // parameters(key) selects; with --sharding, each key gets flat parameters of its own.
  std::function<std::string(const std::string& name, const Tensor& parameter)> param_group;
  CommonFlags flags;
};

// Sets --threads, resolves --device into o.device (made current), joins the job chorusrun started
// and checks the flags for its layout before any data is read: --resume needs --checkpoint-dir;
// pipelined, --amp fp16 and --accumulate are refused and running alone makes a group of one (a
// one-stage pipeline); data parallel, the global batch must split into processes x accumulate.
Job join_job(TrainerOptions& o);

// The examples each process's loader takes per micro-batch: data parallel, global batch /
// (processes x accumulate); pipelined, the whole global batch.
int64_t micro_batch_size(const TrainerOptions& o, const Job& job);

// The sampler of a training set: data parallel, this rank's shard; pipelined, the whole set on
// every rank (each reads the same global batches).
std::shared_ptr<data::DistributedSampler> training_sampler(const TrainerOptions& o, const Job& job, int64_t size,
                                                           uint64_t seed);

class Trainer {
 public:
  // The model on o.device, built identically on every rank. Pipelined, the model's
  // pipeline_blocks() become this rank's stage and `model` is reset (the stage keeps its own
  // blocks only); data parallel, DDP wraps it when there are several processes.
  template <class Model>
  Trainer(TrainerOptions o, Job& job, std::shared_ptr<Model>& model, Task task)
      : o_(std::move(o)),
        job_(job),
        guard_({.program = o_.program, .max_loss_growth = o_.flags.max_loss_growth, .rank = job.rank}),
        tensorboard_(o_.flags.tensorboard, job) {
    if (o_.flags.pipeline.enabled()) {
      make_stage(model->pipeline_blocks());
      model.reset();
    } else if (!keeps_whole_model(o_.flags)) {
      make_sharded(model->pipeline_blocks());
      model.reset();
    } else {
      make_data_parallel(model);
    }
    task_ = std::move(task);
  }

  bool pipelined() const { return stage_ != nullptr; }
  bool sharded() const { return fsdp_ != nullptr; }
  distributed::pipeline::PipelineStage* stage() { return stage_.get(); }
  const distributed::pipeline::PipelinePlan& plan() const { return plan_; }
  distributed::DistributedDataParallel* ddp() { return ddp_.get(); }
  MixedPrecision& amp() { return *amp_; }
  // The parameters this rank trains (pipelined: its stage's; sharded: its shards), for the
  // optimizer: all, or those of one param_group key.
  std::vector<Tensor> parameters() const;
  std::vector<Tensor> parameters(const std::string& key) const;
  nn::NamedTensors named_parameters() const;

  using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;
  // The optimizer over `groups` (made of parameters()): make(groups), or with --sharding zero1 a
  // ZeroRedundancyOptimizer over them (each rank keeps the state of its share of the parameters,
  // made by `make`, and broadcasts them after its step).
  std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::ParamGroup> groups, const OptimizerFactory& make);

  // AdamW with weight decay on the param_group key "decay" and none on "no_decay" (GPT's and BERT's
  // recipes differ only in which parameters are which), through make_optimizer.
  std::unique_ptr<optim::Optimizer> make_adamw(const optim::AdamOptions& options, double weight_decay);

  // Takes the optimizer and scheduler the steps use and, when --resume says so, restores them and
  // the model from the checkpoint (logged); returns the step to continue from (0 afresh).
  // `scheduler` may be null only without --checkpoint-dir.
  int64_t start(optim::Optimizer& optimizer, optim::LRScheduler* scheduler);
  bool resumed() const { return resumed_; }
  // The checkpoint file (data parallel), manifest (pipelined) or index (sharded); empty without
  // --checkpoint-dir.
  const std::string& checkpoint_path() const { return checkpoint_path_; }

  // One optimizer step: data parallel, this process's `accumulate` micro-batches; pipelined, one,
  // the whole global batch. Returns the loss, the mean over the global batch on every rank (data
  // parallel: the ranks' means averaged by one scalar allreduce). Gradients are zeroed first; the
  // scheduler is not stepped (the example does). Rank 0 writes --trace after this run's third step.
  // With --tensorboard: train/loss, train/lr (the first param_group's, as the step used it),
  // train/examples_per_s, train/grad_norm (when the example clips, as BERT and GPT do: the norm
  // before clipping),
  // and per rank train/step_ms and DDP's iteration timings, at the step's number.
  double step(const std::vector<Lists>& micro_batches);
  // The same one micro-batch at a time, as a loader gives them: holds each until the step's last
  // arrives, then runs the step and returns its loss (nothing before).
  std::optional<double> feed(Lists micro_batch);
  // Micro-batches per step on this process: --accumulate (pipelined: 1, the global batch).
  int64_t micro_batches_per_step() const { return stage_ ? 1 : o_.accumulate; }

  // The whole model's state dict: data parallel, the model's; pipelined, gathered on rank 0 (empty
  // elsewhere); sharded, gathered on every rank. Every rank calls it.
  nn::NamedTensors whole_state_dict();

  // Writes a checkpoint (every rank calls it; nothing without --checkpoint-dir), logged. First the
  // divergence check (loss_guard.h) over the steps since the last save: when their loss went
  // non-finite or grew past --max-loss-growth, nothing is written and every rank throws
  // TrainingDiverged (the example exits with kDivergedExitCode).
  void save(int64_t epochs_done, int64_t step, const nn::Metadata& extra = {});

  // Sums over the first `limit` examples of `dataset` (0: all) of the `width` values `stats`
  // returns for each batch's outputs and targets (e.g. {loss x count, count}), without gradients and
  // with the model in eval mode, summed over the ranks. Data parallel: each rank its strided share,
  // `batch` at a time; pipelined: whole global batches (limit rounded down) through the stages'
  // eval_step, `stats` called on the last stage for each replica's rows of each micro-batch.
  std::vector<double> evaluate(const data::Dataset& dataset, int64_t limit, int64_t batch, size_t width,
                               const std::function<Lists(const data::Batch&)>& lists,
                               const std::function<std::vector<double>(const TensorList& outputs,
                                                                       const TensorList& targets)>& stats);

  // amp, skipped steps and loss scale; pipelined, the plan and recomputation; with PowerSGD, the
  // elements sent against a plain allreduce's.
  nlohmann::json summary() const;

  // --tensorboard's writers (doing nothing without it), for what the example logs itself
  // (evaluations, samples), and the number of the last step run (start's step, then one per step).
  TensorBoardLog& tensorboard() { return tensorboard_; }
  int64_t global_step() const { return global_step_; }

 private:
  void make_stage(distributed::pipeline::BlockModel blocks);
  void make_data_parallel(std::shared_ptr<nn::Module> model);
  void make_sharded(distributed::pipeline::BlockModel blocks);
  Lists on_device(const Lists& batch) const;

  TrainerOptions o_;
  Job& job_;
  LossGuard guard_;  // the losses since the last save, checked before the next
  Task task_;
  std::shared_ptr<nn::Module> model_;  // data parallel
  std::shared_ptr<distributed::DistributedDataParallel> ddp_;
  distributed::pipeline::PipelinePlan plan_;
  std::unique_ptr<distributed::pipeline::PipelineStage> stage_;
  std::unique_ptr<distributed::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<MixedPrecision> amp_;
  std::shared_ptr<distributed::PowerSGDState> powersgd_;  // with --powersgd-rank under DDP
  std::shared_ptr<distributed::HierarchicalGroups> hierarchy_;  // with --hierarchical under DDP
  distributed::ZeroRedundancyOptimizer* zero_ = nullptr;   // with --sharding zero1 (the optimizer)
  optim::Optimizer* optimizer_ = nullptr;
  optim::LRScheduler* scheduler_ = nullptr;
  std::string checkpoint_path_;
  bool resumed_ = false;
  int64_t steps_run_ = 0;
  int64_t global_step_ = 0;  // start()'s step plus the steps run since
  TensorBoardLog tensorboard_;
  std::vector<Lists> pending_;  // feed's micro-batches of the step under way
};

}  // namespace chorus::examples
