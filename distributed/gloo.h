// ProcessGroupGloo: collectives over TCP with Gloo (Debian libgloo-dev). One worker thread runs the
// group's operations in the order they were issued, so every rank runs the same sequence; each op
// carries the group's timeout, and a failure (timeout, a dead peer) becomes a chorus::Error naming
// the op, its sequence number, this rank, the group size and the timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/store.h"

namespace gloo {
class Context;
}

namespace chorus::distributed {

struct GlooOptions {
  std::chrono::milliseconds timeout{300000};
  // Address this process listens on for its peers. Empty: the interface GLOO_SOCKET_IFNAME names,
  // else 127.0.0.1 when MASTER_ADDR is a loopback address (or unset), else the local address of the
  // route to MASTER_ADDR (gloo.cpp, [Peer address]).
  std::string hostname;
  // The flight recorder's name for this group (flight_recorder.h), the same on every rank, and the
  // members' ranks in the job, in group order: init_process_group and new_group set both, and a
  // timed-out collective's ranks then exchange their records through the job's store. Left empty,
  // they meet in this group's own store, numbered by their ranks in the group.
  std::string name = "gloo";
  std::vector<int> global_ranks;
};

class ProcessGroupGloo : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options = {});
  ~ProcessGroupGloo() override;
  std::string backend_name() const override { return "gloo"; }

  std::shared_ptr<Work> allreduce(const TensorList& tensors, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const TensorList& tensors, int root) override;
  std::shared_ptr<Work> allgather(const TensorList& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_to_all(const TensorList& outputs, const TensorList& inputs) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) override;

  std::chrono::milliseconds timeout() const { return options_.timeout; }

 private:
  // Queues `body` on the worker thread; the Work finishes with `result` or the error body threw.
  // `op` and `tensors` go to the flight recorder: what must agree across ranks.
  std::shared_ptr<Work> enqueue(std::string op, std::string tensors, TensorList result,
                                std::function<void(uint32_t tag)> body);
  // The desync report for timed-out collective `seq` (flight_recorder.h).
  std::string desync_report(uint64_t seq) const;
  // Records a send or receive as posted; returns the record's id.
  uint64_t recorded_p2p(uint64_t seq, std::string op, const Tensor& tensor) const;
  void worker_loop();
  void check_tensor(const Tensor& t, const char* op) const;

  GlooOptions options_;
  std::shared_ptr<Store> store_;  // the group's, for desync reports of a group made outside init_process_group
  std::shared_ptr<gloo::Context> context_;
  // Collectives are numbered apart from point-to-point ops: the collective's number is also its
  // Gloo tag, which must agree on every rank, and ranks send and receive different numbers of
  // point-to-point messages (a pipeline's middle stage twice its neighbours').
  // Atomic: a stream-ordered group issues sends and receives from two communication streams'
  // threads at once (ThreadSanitizer found the plain counter's race).
  std::atomic<uint64_t> sequence_{0};
  std::atomic<uint64_t> p2p_sequence_{0};

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace chorus::distributed
