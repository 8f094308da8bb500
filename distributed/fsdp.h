// FullyShardedDataParallel: ZeRO stages 2 and 3 (Rajbhandari et al., SC 2020) with PyTorch FSDP's
// names (docs/sharding.md). The model is given as blocks (distributed/pipeline/blocks.h: GPT's,
// BERT's and ResNet's pipeline_blocks(), or blocks_of(a Sequential)); each block is a unit whose
// parameters live as one flat parameter per unit, cut into equal shards, one per rank:
//
//   FullyShardedDataParallel fsdp(model->pipeline_blocks(), group, {.sharding_strategy = ShardingStrategy::FullShard});
//   optim::AdamW opt(fsdp.parameters(), {...});       // the shards: each rank steps its own
//   opt.zero_grad();
//   Tensor loss = loss_fn(fsdp.forward({x})[0], y);   // the blocks in order, gathered as they run
//   loss.backward();                                   // gradients reduce-scattered into the shards
//   fsdp.clip_grad_norm_(1.0);                         // the whole model's norm
//   opt.step();
//
// - FullShard (ZeRO-3): a unit's parameters are all-gathered before its forward and freed after
//   it, all-gathered again before its backward (a hook on the block's outputs) and freed once its
//   gradients are reduce-scattered; the next unit's all-gather is issued before the current one
//   runs (prefetch), forward and backward. The last block stays gathered into its backward.
// - ShardGradOp (ZeRO-2): a unit stays gathered from its forward to the end of backward.
// - Either way gradients are reduce-scattered per flat parameter as soon as all of its parameters'
//   gradients have been accumulated (overlapping the rest of backward, in a fixed order on every
//   rank), each rank keeping the average over ranks of its shard; the full gradients are dropped.
// - Parameters that several blocks own (GPT's and BERT's tied word embedding) and those no block
//   owns form the root unit: gathered at the start of forward, resharded after backward.
// - Buffers are not sharded: every rank keeps its own (copied from rank 0 at construction).
// - Memory between steps: each rank holds 1/N of the parameters (padded to a multiple of N), of
//   the gradients and of the optimizer state (the optimizer sees only shards).
// - Every rank must run the same blocks in forward and backward (no rank-dependent control flow
//   over units): the collectives are issued in the same order on all ranks.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/pipeline/blocks.h"
#include "distributed/process_group.h"
#include "nn/serialize.h"
#include "optim/optimizer.h"
#include "optim/schedulers.h"

namespace chorus::distributed {

enum class ShardingStrategy { FullShard, ShardGradOp };
const char* sharding_strategy_name(ShardingStrategy s);
// "full_shard" / "shard_grad_op" (PyTorch's names, lower case); a chorus::Error for others.
ShardingStrategy parse_sharding_strategy(const std::string& name);

struct FSDPOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::FullShard;
  // Issue the next unit's all-gather before the current unit computes (forward and backward).
  bool prefetch = true;
  // Splits each unit's parameters into several flat parameters, one per key (e.g. "decay" for
  // matrices and "no_decay" for biases and norms, so an optimizer can give them their own groups:
  // parameters(key)); called with each parameter's whole-model name. Default: one key, "".
  std::function<std::string(const std::string& name, const Tensor& parameter)> flat_group;
  // Mixed precision (PyTorch's MixedPrecision(param_dtype=...)): floating-point parameters are
  // all-gathered and computed in this dtype (bfloat16: half the all-gather traffic and gathered
  // memory) while the shards the optimizer steps keep theirs (float32); gradients are
  // reduce-scattered in it and accumulated into the shards' dtype. Floating-point inputs of the
  // first block are cast to it. Unset: parameters are gathered as they are.
  std::optional<DType> param_dtype;
};

class FullyShardedDataParallel {
 public:
  // Copies every parameter and buffer from rank 0 (one broadcast each), then shards the
  // parameters: the model's parameter tensors become views of their unit's gathered buffer, whose
  // memory is freed between uses. Every rank must pass the same model (checked: unit names,
  // parameter names and sizes); all parameters must require gradients and share one device.
  FullyShardedDataParallel(pipeline::BlockModel model, std::shared_ptr<ProcessGroup> group, FSDPOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The blocks in order from `inputs` (the first block's) to the last block's outputs.
  TensorList forward(const TensorList& inputs);

  // The shards the optimizer steps (1-D, each rank's own), all or those of one flat_group key.
  std::vector<Tensor> parameters() const;
  std::vector<Tensor> parameters(const std::string& key) const;
  // "<unit>" or "<unit>[<key>]" -> shard.
  nn::NamedTensors named_parameters() const;

  // Clips the gradients of all shards by the whole model's 2-norm (one allreduce of a scalar) as
  // optim::clip_grad_norm_ does for one process; returns the norm before clipping.
  double clip_grad_norm_(double max_norm);

  // The whole model's state dict (parameters from the shards, in their dtype, and this rank's
  // buffers) on the CPU, names and order as model->state_dict(). A collective: every rank calls it
  // and gets the same.
  nn::NamedTensors full_state_dict();
  // Loads a whole model's state dict (as full_state_dict gives, or a one-process model's) into the
  // shards and buffers; every entry of the model must be present with its shape. Every rank calls
  // it with the same values.
  void load_full_state_dict(const nn::NamedTensors& state);

  // [Sharded checkpoints] Every rank writes its shards, its optimizer state (over the shards), the
  // scheduler's state and its generator to fsdp-step<N>-rank<r>-of-<W>.safetensors in `dir`
  // (atomically, CRC-checked as every chorus checkpoint; rank 0's file also holds the buffers);
  // once all are on disk rank 0 writes the index fsdp-checkpoint.json (atomically) naming them,
  // the world size and every flat parameter's layout, and the previous step's files go. A crash
  // at any point leaves the previous complete checkpoint or the new one. Every rank calls it.
  void save_checkpoint(const std::string& dir, const optim::Optimizer& optimizer, const optim::LRScheduler* scheduler,
                       int64_t epoch, int64_t step, const nn::Metadata& extra = {});
  // Restores a checkpoint save_checkpoint wrote, at this world size (each rank its own file:
  // bit-exact) or another (every file read, each flat parameter and each optimizer buffer of a
  // shard's size reassembled and cut again for this world size). The optimizer must hold this
  // wrapper's shards in the same groups as the one saved. Each key of `expect` must have the same
  // value in the checkpoint's extras (a key it lacks is an error). Returns the checkpoint (step,
  // epoch, extras) of this rank's file (another world size: rank 0's). Every rank calls it; an
  // error on one rank (a damaged file, say) is raised on every rank, naming the cause there.
  nn::Checkpoint load_checkpoint(const std::string& dir, optim::Optimizer& optimizer, optim::LRScheduler* scheduler,
                                 const nn::Metadata& expect = {});

  void train(bool on = true) { model_.model->train(on); }
  void eval() { train(false); }
  nn::Module& module() { return *model_.model; }
  ShardingStrategy sharding_strategy() const { return options_.sharding_strategy; }

  // Elements of the whole model's parameters, and of this rank's shards (with padding).
  int64_t numel() const;
  int64_t shard_numel() const;

 private:
  struct Flat;
  struct Unit;
  void build(const FSDPOptions& options);
  void start_gather(size_t unit);
  void finish_gather(size_t unit);
  void gather(size_t unit);
  void reshard(size_t unit);
  void pre_backward(size_t unit);
  void on_gradient(size_t flat);
  void launch_reductions_after(size_t unit);
  void launch_ready_reductions();
  void launch_reduction(size_t flat);
  void finish_backward();
  void reset_iteration();
  // One allreduce of failures: an error on any rank ends the call on every rank.
  void agree(const std::string& error, const std::string& what);
  // load_checkpoint's work on this rank, before the ranks agree that every one of them succeeded.
  nn::Checkpoint load_checkpoint_here(const std::string& dir, optim::Optimizer& optimizer,
                                      optim::LRScheduler* scheduler, const nn::Metadata& expect);
  // For each of the optimizer's parameters, in its order: the index of the flat parameter whose
  // shard it is (an error for any other tensor).
  std::vector<size_t> optimizer_flats(const optim::Optimizer& optimizer) const;

  pipeline::BlockModel model_;
  std::shared_ptr<ProcessGroup> group_;
  FSDPOptions options_;
  std::vector<std::unique_ptr<Flat>> flats_;
  std::vector<std::unique_ptr<Unit>> units_;  // the root (when it has parameters) first, then one per block
  std::vector<size_t> reduction_order_;       // flats, last block's first
  size_t next_reduction_ = 0;
  bool backward_queued_ = false;
  std::vector<HookHandle> hooks_;
};

// The index of an FSDP checkpoint folder, and whether one is there.
std::string fsdp_checkpoint_index(const std::string& dir);
bool has_fsdp_checkpoint(const std::string& dir);
// The whole model's state dict (parameters and buffers, in the model's state_dict order) from an
// FSDP checkpoint folder of any world size: what loads into a one-process model.
nn::NamedTensors load_fsdp_model(const std::string& dir);

}  // namespace chorus::distributed
