// The DAPPLE runtime (Fan et al., PPoPP 2021): synchronous hybrid data + pipeline parallelism.
// Every rank builds the whole model (an nn::Sequential, same seed) and keeps only its stage's
// layers; a training step splits the global batch into micro-batches and runs the stage's action
// list from the schedule (schedule.h): forwards and backwards, activations and gradients to and
// from the neighbouring stages by point-to-point send/recv through the ProcessGroup interface (so
// it works on any backend), then one gradient average among the stage's replicas (DDP's Reducer on
// a subgroup, overlapped with the last micro-batch's backward) and one optimizer step.
//
//   auto plan = pipeline::load_plan("plan.json");                 // or uniform_plan(...)
//   pipeline::PipelineStage stage(model, plan, distributed::init_process_group());
//   optim::SGD opt(stage.parameters(), {.lr = 0.1});
//   for (...) stage.train_step(x, y, F::cross_entropy, opt);       // x, y: the whole global batch
//
// [Replica mapping] A micro-batch of B rows is cut among a stage's r replicas in order: replica j
// owns rows [j B/r, (j+1) B/r). At a boundary between stages with r and r' replicas, replica j of
// the first sends each replica k of the second the rows both own (the intersection of their
// ranges), and receives the gradients of exactly those rows back; a replica concatenates what it
// receives in row order. So 2 replicas feeding 1 each send their half; 1 feeding 2 sends each its
// half; 2 feeding 3 (B = 6) send 2+1 and 1+2 rows. Each link carries one tensor per micro-batch.
//
// [Loss scaling] loss_fn returns the mean over the rows it is given (as F::cross_entropy). A
// last-stage replica's loss on its b rows of a micro-batch is scaled by b / global_batch, so the
// gradients reaching every activation are those of the mean over the global batch. A replica's
// parameter gradients are then its rows' share of the whole; DDP averages over the r replicas, and
// GradSync multiplies by r to make the average the sum of the shares: exactly the single-process
// gradient of the global batch.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/ddp.h"
#include "distributed/pipeline/plan.h"
#include "distributed/pipeline/schedule.h"
#include "distributed/process_group.h"
#include "nn/container.h"
#include "optim/optimizer.h"

namespace chorus::distributed::pipeline {

// Layers [first_layer, end_layer) of a Sequential, registered under their names in the whole model
// ("3", "4", ...), so parameter names are the whole model's ("3.weight") and state dicts merge.
class StageModule : public nn::Module {
 public:
  StageModule(const nn::Sequential& model, int first_layer, int end_layer);
  Tensor forward(const Tensor& input) override;
  int first_layer() const { return first_layer_; }
  int end_layer() const { return end_layer_; }

 private:
  int first_layer_, end_layer_;
  std::vector<std::shared_ptr<nn::Module>> layers_;
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
};

// Mean loss over the rows of `output` (the last stage's output slice) and `target`.
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

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
  double step_ms = 0;
  // Of step_ms: blocked receiving activations and gradients and waiting for the step's sends to
  // complete (the pipeline's bubbles and its communication as this rank saw them); the rest is
  // computation and the gradient sync.
  double communication_wait_ms = 0;
};

class PipelineStage {
 public:
  // model: the whole model, built identically on every rank (and moved to this rank's device, if
  // not the CPU: the stage runs where its parameters are); plan: validated against the group's
  // size; group: the default group (the stages' replica groups are made with new_group, which
  // every rank calls here in the same order).
  PipelineStage(std::shared_ptr<nn::Sequential> model, PipelinePlan plan, std::shared_ptr<ProcessGroup> group,
                PipelineOptions options = {});

  // One optimizer step over the global batch. input: [global_batch, ...], used on the first
  // stage's ranks; target: [global_batch, ...], used on the last stage's (others may pass
  // undefined tensors). Gradients are set to none at the start; optimizer must hold parameters().
  StepStats train_step(const Tensor& input, const Tensor& target, const LossFn& loss_fn, optim::Optimizer& optimizer);

  int stage() const { return stage_; }
  int num_stages() const { return plan_.num_stages(); }
  int replica() const { return replica_; }
  int num_replicas() const { return static_cast<int>(plan_.stages[stage_].ranks.size()); }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == plan_.num_stages() - 1; }
  const PipelinePlan& plan() const { return plan_; }
  const Schedule& schedule() const { return schedule_; }
  const std::shared_ptr<StageModule>& module() const { return module_; }
  std::vector<Tensor> parameters() const { return module_->parameters(); }
  // This stage's parameters and buffers, named as in the whole model.
  nn::NamedTensors state_dict() const { return module_->state_dict(); }
  // The whole model's state dict, on the CPU, assembled on rank dst (replica 0 of each stage sends its part;
  // every rank must call it); an empty list on the other ranks. Same names and order as the
  // whole model's state_dict().
  nn::NamedTensors gather_state_dict(int dst = 0);
  // Loads this stage's entries of a whole-model state dict (names must all belong to the model's
  // layers; strict: every entry of this stage present with its shape).
  void load_state_dict(const nn::NamedTensors& whole_model, bool strict = true);

 private:
  // One point-to-point connection to a neighbouring stage's replica: which rows of this rank's
  // part of a micro-batch travel on it.
  struct Link {
    int peer = -1;       // global rank
    int64_t offset = 0;  // first row, within this rank's rows of the micro-batch
    int64_t rows = 0;
    Shape shape;         // agreed activation shape on the link (known after the first step)
    DType dtype = kFloat32;
    bool agreed = false;
  };
  std::vector<Link> make_links(int other_stage) const;
  Tensor receive(std::vector<Link>& links, int kind, int micro_batch, const char* what, bool header);
  void send(std::vector<Link>& links, const Tensor& value, int kind, int micro_batch, const char* what, bool header);
  // Waits for every send still in flight; the first failure is raised naming this stage.
  void wait_sends();
  [[noreturn]] void rethrow(const std::exception& e, const std::string& what, int micro_batch, int peer) const;
  std::string where() const;

  PipelinePlan plan_;
  std::shared_ptr<ProcessGroup> group_;
  PipelineOptions options_;
  Schedule schedule_;
  int rank_ = 0, stage_ = 0, replica_ = 0;
  int64_t rows_ = 0;  // this rank's rows of each micro-batch
  Device device_ = kCPU;  // where the stage's parameters are
  std::shared_ptr<StageModule> module_;
  std::shared_ptr<ProcessGroup> replica_group_;  // null with one replica
  std::shared_ptr<DistributedDataParallel> ddp_;
  int sync_micro_batch_ = 0;  // the micro-batch of the stage's last backward: it carries the allreduce
  std::vector<Link> prev_links_, next_links_;
  std::vector<std::shared_ptr<Work>> pending_sends_;
  int64_t steps_ = 0;
};

}  // namespace chorus::distributed::pipeline
