// DistributedDataParallel: wraps a module so that N processes train one model. At construction it
// checks every rank holds the same parameters and copies rank 0's values to all; each forward
// (optionally) re-broadcasts buffers from rank 0; each backward averages gradients across ranks
// through the Reducer (bucketed, overlapped with backward). The optimizer step then runs the same
// update on every rank, so replicas stay identical.
//
//   auto ddp = std::make_shared<DistributedDataParallel>(model, group, DDPOptions{.bucket_cap_mb = 25});
//   Tensor loss = F::cross_entropy(ddp->forward(x), y);
//   loss.backward();   // gradients are averaged over ranks here
//   optimizer.step();
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "distributed/process_group.h"
#include "distributed/reducer.h"
#include "nn/module.h"

namespace chorus::distributed {

struct DDPOptions {
  double bucket_cap_mb = 25.0;  // > 0; infinity: no cap (one bucket per dtype and device)
  double first_bucket_cap_mb = 1.0;
  bool broadcast_buffers = true;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;
};

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});

  Tensor forward(const Tensor& input) override;
  // For modules with other signatures: runs `call` (which invokes the module) inside DDP's forward
  // bookkeeping and returns its output(s).
  Tensor forward(const std::function<Tensor()>& call);
  TensorList forward_multi(const std::function<TensorList()>& call);

  // Gradients accumulate locally while the guard lives; the next synced backward reduces the sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& r) : reducer_(r), previous_(r.require_sync()) { reducer_.set_require_sync(false); }
    ~NoSyncGuard() { reducer_.set_require_sync(previous_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  void register_comm_hook(CommHook hook) { reducer_->register_comm_hook(std::move(hook)); }

  // Uneven inputs (PyTorch's Join): runs `loop` (this rank's training loop) so that ranks with
  // fewer batches do not hang the others. Inside, each forward first agrees which ranks still
  // have data (one small allreduce). A rank whose loop has returned keeps answering the others'
  // collectives — buffer broadcasts, and every gradient bucket with zeros, so gradients stay
  // divided by the initial world size as PyTorch's default — until every rank is done; then all
  // ranks take the parameters and buffers of the highest rank that trained last. Every forward
  // inside must be a training step followed by a synced backward, and every rank must have run at
  // least one iteration before joining.
  void join(const std::function<void()>& loop);

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }
  Reducer& reducer() { return *reducer_; }
  // Timings of the first iterations and then every 100th (see Reducer).
  const std::vector<IterationStats>& stats() const { return reducer_->stats(); }
  // Writes one iteration's spans as a Chrome trace (open it in Perfetto or chrome://tracing).
  void write_chrome_trace(const std::string& path, int64_t iteration = -1) const;

 private:
  TensorList run_forward(const std::function<TensorList()>& call);
  void verify_same_model_across_ranks();

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool joining_ = false;
  bool require_forward_param_sync_ = true;  // the last forward was synced with gradients on: the next broadcasts buffers
  int last_active_rank_ = -1;  // highest rank that had data in the latest join round with any
  // One join round: allreduce of which ranks still have data; returns how many do.
  int64_t join_round(bool active);
};

}  // namespace chorus::distributed
