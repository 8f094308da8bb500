// The DAPPLE runtime (Fan et al., PPoPP 2021): synchronous hybrid data + pipeline parallelism.
// Every rank builds the whole model (an nn::Sequential, or any model given as an ordered list of
// blocks that pass several tensors: blocks.h; same seed) and keeps only its stage's blocks; a
// training step splits the global batch into micro-batches and runs the stage's action list from
// the schedule (schedule.h): forwards and backwards, activations and gradients to and from the
// neighbouring stages by point-to-point send/recv through the ProcessGroup interface (so it works
// on any backend), then one gradient average among the stage's replicas (DDP's Reducer on a
// subgroup, overlapped with the last micro-batch's backward), the tied parameters' gradients summed
// over the stages that hold them, and one optimizer step.
//
//   auto plan = pipeline::load_plan("plan.json");                 // or uniform_plan(...)
//   pipeline::PipelineStage stage(model, plan, distributed::init_process_group());
//   optim::SGD opt(stage.parameters(), {.lr = 0.1});
//   for (...) stage.train_step(x, y, F::cross_entropy, opt);       // x, y: the whole global batch
//
// [Replica mapping] A micro-batch of B rows is cut among a stage's r replicas in order: replica j
// owns rows [j B/r, (j+1) B/r) of every tensor (inputs, targets, and each tensor crossing a
// boundary: their first dimension is the batch). At a boundary between stages with r and r'
// replicas, replica j of the first sends each replica k of the second the rows both own (the
// intersection of their ranges), and receives the gradients of exactly those rows back; a replica
// concatenates what it receives in row order. So 2 replicas feeding 1 each send their half; 1
// feeding 2 sends each its half; 2 feeding 3 (B = 6) send 2+1 and 1+2 rows.
//
// [Loss scaling] loss_fn returns the mean over the rows it is given (as F::cross_entropy). A
// last-stage replica's loss on its b rows of a micro-batch is scaled by b / global_batch, so the
// gradients reaching every activation are those of the mean over the global batch. A replica's
// parameter gradients are then its rows' share of the whole; DDP averages over the r replicas, and
// GradSync multiplies by r to make the average the sum of the shares: exactly the single-process
// gradient of the global batch. (A loss that is a mean over something else, such as BERT's masked
// tokens, whose count differs from row to row, is the row-weighted mean of the parts' means:
// gradient accumulation's loss, not the global batch's.)
//
// [Tied parameters] A parameter owned by blocks of several stages (a word embedding reused by the
// output head) lives on each of them. After GradSync, each rank of those stages scales its
// gradient by 1 / (its stage's replicas) and one allreduce over all their ranks sums them: every
// copy gets the sum of the stages' gradients, and identical optimizer steps keep the copies equal.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/ddp.h"
#include "distributed/pipeline/blocks.h"
#include "distributed/pipeline/plan.h"
#include "distributed/pipeline/schedule.h"
#include "distributed/process_group.h"
#include "nn/container.h"
#include "nn/serialize.h"
#include "optim/schedulers.h"
#include "optim/optimizer.h"

namespace chorus::distributed::pipeline {

// Blocks [first_block, end_block) of a BlockModel: each owned module registered as a child, each
// owned single tensor as a parameter or buffer, under its whole-model name with '/' for '.'
// (Module names hold no dots); PipelineStage::state_dict() gives them back under the whole model's
// names ("transformer.h.3.attn.c_attn.weight", "3.weight" for a Sequential).
class StageModule : public nn::Module {
 public:
  StageModule(const BlockModel& model, int first_block, int end_block);
  // The stage's blocks in order, each one's outputs the next one's inputs.
  TensorList forward_blocks(const TensorList& inputs);
  // For a stage of one-tensor blocks.
  Tensor forward(const Tensor& input) override;
  int first_block() const { return first_block_; }
  int end_block() const { return end_block_; }

 private:
  int first_block_, end_block_;
  std::vector<Block> blocks_;
};

struct PipelineOptions {
  DDPOptions ddp{};  // for stages with more than one replica
  // Sum the step's loss over the last stage's replicas and send it to every rank (one scalar
  // allreduce over the whole group per step); without it only last-stage ranks know the loss.
  bool report_loss = true;
  // Activation recomputation (--recompute): a micro-batch's forward through this stage keeps only
  // its input and output (nn::utils::checkpoint); backward runs the stage's forward again, with the
  // generator's state of the first run (dropout draws the same masks). Gradients are unchanged; the
  // activation memory per micro-batch in flight drops to the stage's input and output.
  bool recompute = false;
  // Gradient clipping before each optimizer step (0: off): the norm of the whole model's gradient
  // (every stage's parameters, a tied one once) is measured with one scalar allreduce over the
  // group, and every stage scales by max_grad_norm / norm when it is larger, as
  // clip_grad_norm_ on the whole model would.
  double max_grad_norm = 0;
  // Mixed precision: each stage's forward and the loss under autocast to this dtype on the stage's
  // device (bfloat16 only: float16 would need one loss scale and one overflow check across all
  // stages, which is not built); parameters and gradients stay in their dtype, boundary tensors
  // cross in whatever dtype the blocks produce. Recomputation replays it.
  std::optional<DType> autocast{};
};

// Mean loss over the rows of `output` (the last stage's output slice) and `target`.
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
// The same for stages of several tensors: the last block's outputs and this replica's rows of the
// targets (which may be an empty list: a model can carry its labels through the stages).
using MultiLossFn = std::function<Tensor(const TensorList& outputs, const TensorList& targets)>;

struct StepStats {
  double loss = 0;  // mean over the global batch (on every rank with report_loss, else last stage)
  // Micro-batches whose activations this rank held at once (forwarded, backward not yet run).
  int max_in_flight = 0;
  // Activation memory: the bytes (on the stage's device) each forward left allocated (what autograd saved for
  // backward, the output, and the received input), summed over the micro-batches held at once, at
  // the most (tensor/cpu_memory.h counts them).
  size_t peak_activation_bytes = 0;
  // Bytes allocated during the step above what was allocated when it started, at the peak:
  // activations plus the step's temporaries and gradients (every thread's allocations; memory
  // from before the step that is freed during it makes it read low).
  size_t peak_step_bytes = 0;
  double grad_norm = 0;  // the whole model's gradient norm before clipping (with max_grad_norm)
  double step_ms = 0;
  // Of step_ms: blocked receiving activations and gradients and waiting for the step's sends to
  // complete (the pipeline's bubbles and its communication as this rank saw them); the rest is
  // computation and the gradient sync.
  double communication_wait_ms = 0;
};

// What eval_step returns.
struct EvalStats {
  double loss = 0;  // mean over the global batch (on every rank with report_loss, else last stage)
  // The last block's outputs for this rank's rows of each micro-batch (last stage only; empty
  // elsewhere), for metrics beyond the loss.
  std::vector<TensorList> outputs;
  double step_ms = 0;
};

class PipelineStage {
 public:
  // model: the whole model as blocks (blocks.h), built identically on every rank (and moved to this
  // rank's device, if not the CPU: the stage runs where its parameters are); plan: its layers are
  // the blocks, validated against the group's size; group: the default group (the stages' replica
  // groups and the tied parameters' groups are made with new_group, which every rank calls here in
  // the same order). The stage keeps its own blocks only: drop other references to the model.
  // Every rank checks with the others (one allgather) that they run the same blocks and plan on
  // the same kind of device; a mismatch is an error on every rank.
  PipelineStage(BlockModel model, PipelinePlan plan, std::shared_ptr<ProcessGroup> group, PipelineOptions options = {});
  // A Sequential's children are the blocks (blocks_of).
  PipelineStage(const std::shared_ptr<nn::Sequential>& model, PipelinePlan plan, std::shared_ptr<ProcessGroup> group,
                PipelineOptions options = {});

  // One optimizer step over the global batch. inputs: the first block's inputs, each
  // [global_batch, ...], used on the first stage's ranks; targets: each [global_batch, ...] (or
  // none), used on the last stage's; other ranks may pass empty lists. Gradients are set to none
  // at the start; optimizer must hold parameters().
  StepStats train_step(const TensorList& inputs, const TensorList& targets, const MultiLossFn& loss_fn,
                       optim::Optimizer& optimizer);
  // One-tensor stages: input and target (undefined where unused).
  StepStats train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn, optim::Optimizer& optimizer);
  // Pipelined evaluation: the forward of every micro-batch through the stages, without gradients,
  // in eval mode (dropout off; the training mode is restored after), and the loss over the global
  // batch; no backward, no optimizer. Same inputs, targets and loss as train_step, a batch of the
  // plan's global_batch rows. The boundary tensors are agreed separately from training's (they
  // carry no gradients). Every rank calls it.
  EvalStats eval_step(const TensorList& inputs, const TensorList& targets, const MultiLossFn& loss_fn);

  // This rank's position in the pipeline (interleaved: it holds virtual stages c * num_stages() +
  // stage() for c < num_chunks()), and the number of positions.
  int stage() const { return stage_; }
  int num_stages() const { return positions_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  int replica() const { return replica_; }
  int num_replicas() const { return static_cast<int>(plan_.stages[stage_].ranks.size()); }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == positions_ - 1; }
  const PipelinePlan& plan() const { return plan_; }
  const Schedule& schedule() const { return schedule_; }
  // The stage's module (interleaved: its first chunk's).
  const std::shared_ptr<StageModule>& module() const { return chunks_.front().module; }
  // Every parameter this rank holds (all its chunks'), each once.
  std::vector<Tensor> parameters() const;
  // This stage's parameters under their names in the whole model (for optimizer groups by name).
  nn::NamedTensors named_parameters() const;
  // Names (whole model's) of this stage's parameters that other stages hold too (tied).
  std::vector<std::string> tied_parameters() const;
  // This stage's parameters and buffers, named and ordered as in the whole model's state_dict().
  nn::NamedTensors state_dict() const;
  // The whole model's state dict, on the CPU, assembled on rank dst (replica 0 of each stage sends its part;
  // every rank must call it); an empty list on the other ranks. Same names and order as the
  // whole model's state_dict(): a tied parameter once, and tensors no block owns with the values
  // they had when the stage was made (or were loaded since).
  nn::NamedTensors gather_state_dict(int dst = 0);
  // Loads this stage's entries of a whole-model state dict, and the tensors no block owns (every
  // name must be the model's; strict: every entry of this stage present with its shape, a tensor
  // no block owns with its shape, and on stage 0, which saves those, present too).
  void load_state_dict(const nn::NamedTensors& whole_model, bool strict = true);

  // [Pipeline checkpoints] A training checkpoint sharded by stage, in folder `dir` (made if
  // missing): replica 0 of each stage writes its stage's model state, optimizer state, scheduler
  // state (when given), its generator's state, epoch, step and `extra` to
  // pipeline-step<step>-stage<s>-of-<S>.safetensors; once every stage's file is written, rank 0
  // writes the manifest pipeline-checkpoint.json (atomically) naming them and the plan, and the
  // previous step's files are removed. Every rank calls it; it returns when the manifest is written
  // and the old files are gone.
  // A crash at any point leaves the previous complete checkpoint or the new one.
  void save_checkpoint(const std::string& dir, const optim::Optimizer& optimizer, const optim::LRScheduler* scheduler,
                       int64_t epoch, int64_t step, const nn::Metadata& extra = {});
  // Restores what save_checkpoint wrote for this rank's stage (generator included) and returns it
  // (step, epoch, extra). The manifest's plan must be this stage's plan (else an error naming
  // both: a checkpoint of another plan is read whole with load_pipeline_model instead). Each key of
  // `expect` must have the same value in the checkpoint's extras, checked before any state is
  // loaded (resuming with another model configuration names both values).
  nn::Checkpoint load_checkpoint(const std::string& dir, optim::Optimizer& optimizer, optim::LRScheduler* scheduler,
                                 const nn::Metadata& expect = {});

 private:
  // What crosses a boundary per micro-batch: each tensor's shape (this link's rows), dtype, and
  // whether its gradient travels back (a floating-point tensor the sender computed with grad).
  struct Spec {
    Shape shape;
    DType dtype = kFloat32;
    bool grad = false;
  };
  // One point-to-point connection to a neighbouring stage's replica: which rows of this rank's
  // part of a micro-batch travel on it.
  struct Link {
    int peer = -1;       // global rank
    int64_t offset = 0;  // first row, within this rank's rows of the micro-batch
    int64_t rows = 0;
    std::vector<Spec> specs;  // agreed in the first step (a header before the first activations)
    bool agreed = false;
  };
  // The parameters of this stage that stages in `stages` hold too, summed over their ranks.
  struct Tie {
    std::vector<int> stages;
    std::shared_ptr<ProcessGroup> group;
    std::vector<std::string> names;  // whole-model names
    TensorList params;
  };
  std::vector<Link> make_links(int other_stage) const;
  // kind kActivation: every tensor (with its header on a link's first use); kGrad: the gradients
  // of the tensors whose Spec says so.
  // `boundary`: the lower virtual stage of the link's two (both ends name it alike), in the tags.
  TensorList receive(std::vector<Link>& links, int kind, int boundary, int micro_batch, const char* what);
  void send(std::vector<Link>& links, const TensorList& values, int kind, int boundary, int micro_batch,
            const char* what);
  // Waits for every send still in flight; the first failure is raised naming this stage.
  void wait_sends();
  void check_agreement(const BlockModel& model);
  void reduce_tied_gradients();
  double clip_gradients(double max_norm);
  // train_step's and eval_step's argument checks (`call` names which in the errors).
  void check_step_inputs(const char* call, const TensorList& inputs, const TensorList& targets, bool has_loss) const;
  // This replica's rows of micro-batch m of each tensor, on the stage's device.
  TensorList rows_of(const TensorList& list, int micro_batch) const;
  // Every rank calls it with its error ("" if none); then all fail if any did.
  void agree(const std::string& error, const std::string& what);
  [[noreturn]] void rethrow(const std::exception& e, const std::string& what, int micro_batch, int peer) const;
  std::string where() const;

  PipelinePlan plan_;
  std::shared_ptr<ProcessGroup> group_;
  PipelineOptions options_;
  Schedule schedule_;
  int rank_ = 0, stage_ = 0, replica_ = 0;
  int64_t rows_ = 0;  // this rank's rows of each micro-batch
  Device device_ = kCPU;  // where the stage's parameters are
  // One per virtual stage this rank holds (one unless interleaved): chunk c is virtual stage
  // c * positions_ + stage_.
  struct Chunk {
    int vstage = 0;
    std::shared_ptr<StageModule> module;
    std::shared_ptr<DistributedDataParallel> ddp;  // with replicas
    int sync_micro_batch = 0;  // the micro-batch of its last backward: it carries the allreduce
    std::vector<Link> prev, next;
    std::vector<Link> eval_prev, eval_next;  // eval_step's (agreed on its first use)
  };
  std::vector<Chunk> chunks_;
  int positions_ = 1;
  // Whole-model state names in order; the stage's own (whole name -> chunk and the module's name);
  // copies of the tensors no block owns.
  std::vector<std::string> whole_names_;
  std::map<std::string, std::pair<int, std::string>> local_name_;
  std::map<std::string, Tensor> unowned_;
  std::vector<Tie> ties_;
  std::shared_ptr<ProcessGroup> replica_group_;  // null with one replica
  std::vector<std::shared_ptr<Work>> pending_sends_;
  int64_t steps_ = 0;
};

// The manifest of a pipeline checkpoint in `dir` (PipelineStage::save_checkpoint).
std::string pipeline_checkpoint_manifest(const std::string& dir);
// Whether `dir` holds a complete pipeline checkpoint (its manifest).
bool has_pipeline_checkpoint(const std::string& dir);
// The whole model's state (every stage's tensors, a tied parameter once) from a pipeline
// checkpoint, for a one-process model's load_state_dict; the step it was written at in *step.
nn::NamedTensors load_pipeline_model(const std::string& dir, int64_t* step = nullptr);

}  // namespace chorus::distributed::pipeline
