// ZeRO stage 1, as torch.distributed.optim.ZeroRedundancyOptimizer: the optimizer state is sharded
// over the ranks of a group. Each rank keeps a local optimizer (any chorus optimizer, made by the
// factory you give) over its shard of the parameters only, steps it with the full gradients (DDP's
// averaged ones), and the updated parameters reach every rank by one broadcast per owner (its
// parameters flattened into one buffer per device and dtype: bucketed). With Adam, each rank holds
// about 1/N of the exp_avg and exp_avg_sq memory plain DDP would.
//
//   DistributedDataParallel ddp(model, group);
//   distributed::ZeroRedundancyOptimizer opt(model->parameters(), group, [](std::vector<optim::ParamGroup> g) {
//     return std::make_unique<optim::Adam>(std::move(g), optim::AdamOptions{.lr = 1e-3});
//   });
//   ... loss.backward(); opt.step(); opt.zero_grad();
//   opt.consolidate_state_dict(0);                 // every rank calls it
//   if (rank == 0) save(opt.state_dict());        // the wrapped optimizer's format, all parameters
//
// - Partition (PyTorch's): within each parameter group, parameters largest first, each to the rank
//   holding the fewest elements so far (counted over all groups); the same on every rank.
// - param_groups() are the wrapper's, with every parameter: a scheduler that sets lr there reaches
//   the local optimizer at the next step().
// - state_dict() after consolidate_state_dict(to), on rank `to`: the wrapped optimizer's format
//   over all parameters (state.<global index>.<buffer>), as a one-process optimizer of the same kind
//   over the same groups would write it; so it loads into one (any world size), and
//   load_state_dict() takes that format at any world size (each rank keeps its shard).
// - Every rank must call the constructor, step() and consolidate_state_dict() in the same order
//   (they are collectives).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "distributed/process_group.h"
#include "optim/optimizer.h"

namespace chorus::distributed {

class ZeroRedundancyOptimizer final : public optim::Optimizer {
 public:
  // Makes the wrapped optimizer over the given groups (a shard of the parameters, the groups'
  // options as given).
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, std::shared_ptr<ProcessGroup> group, Factory make);
  ZeroRedundancyOptimizer(const std::vector<Tensor>& params, std::shared_ptr<ProcessGroup> group, Factory make)
      : ZeroRedundancyOptimizer(optim::single_group(params), std::move(group), std::move(make)) {}

  // Steps this rank's shard, then broadcasts every shard from its owner.
  void step() override;

  // The rank that owns (steps, keeps the state of) parameter `index` (global order over the groups).
  int owner(int64_t index) const { return owner_.at(static_cast<size_t>(index)); }
  // The local optimizer (nullptr on a rank that owns no parameter).
  optim::Optimizer* local() const { return local_.get(); }

  // Gathers every shard's state on rank `to` (every rank must call it).
  void consolidate_state_dict(int to = 0);
  // On the rank that consolidated last: the whole state (see above). Elsewhere, or before a
  // consolidation: a chorus::Error saying so.
  optim::NamedTensors state_dict() const override;
  // A whole state (state_dict()'s format, from any world size or from a one-process optimizer of
  // the wrapped kind): each rank loads its shard.
  void load_state_dict(const optim::NamedTensors& state) override;

 protected:
  // The wrapped kind's checks, through a throwaway optimizer made by the factory (every rank checks
  // every group, whether or not it holds parameters of it).
  void check_options(const optim::Options& options) const override;

 private:
  // The wrapper's options copied into the local groups (a scheduler changes the wrapper's).
  void sync_options();
  // load_state_dict's checks and the local optimizer's load: the wrapper's options to take, or an
  // error with nothing changed.
  std::vector<optim::Options> read_whole_state(const optim::NamedTensors& state);

  std::shared_ptr<ProcessGroup> group_;
  Factory make_;
  std::vector<int> owner_;                      // per global parameter index
  std::vector<int64_t> local_index_;            // per global index: index in the local optimizer, or -1
  std::vector<int> local_group_;                // per wrapper group: the local group, or -1
  std::vector<std::vector<int64_t>> owned_by_;  // per rank: its global indices, in order
  std::unique_ptr<optim::Optimizer> local_;
  std::optional<optim::NamedTensors> consolidated_;
};

}  // namespace chorus::distributed
