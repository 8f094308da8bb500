// ProcessGroup: collectives among a fixed set of processes (ranks). Every call returns a Work at
// once and runs asynchronously in issue order; Work::wait() blocks until it finished and rethrows
// its error (a chorus::Error naming the op, its sequence number, the ranks and the timeout).
// Backends: ProcessGroupGloo (CPU tensors over TCP); device tensors go through a StreamOrderedGroup
// (stream_group.h) over a communicator: Gloo on the stream (sim; CUDA staged) or NCCL (CUDA).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::distributed {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}
  virtual ~Work() = default;

  bool is_completed() const;
  bool is_success() const;
  std::exception_ptr exception() const;
  // Blocks until done and rethrows a failure. With a timeout, a collective still running after it
  // is reported as a chorus::Error (the collective itself also has the group's timeout).
  virtual void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Blocks the host until the work has finished and its then() callbacks have run; never raises.
  // Unlike wait(), which a device work answers by ordering the current stream, this is what an
  // owner must call before freeing anything a callback or the collective still touches.
  void wait_finished();
  // The tensors the op wrote (allreduce: its inputs, in place; allgather: the outputs).
  virtual const TensorList& result() const { return result_; }
  // Runs `fn` once the work has finished (at once if it already has), on the completing thread.
  void then(std::function<void(Work&)> fn);
  const std::string& description() const { return description_; }

  // Backend side.
  void finish(TensorList result, std::exception_ptr error = nullptr);

 protected:
  // A Work that its waiter can complete on its own thread (Gloo's point-to-point: wait() blocks in
  // the transport itself, with no thread in between to wake) overrides this to start completing it
  // in the background, for is_completed() and then(), which must not block. Called by them while the
  // work is not done; the default does nothing (the backend finishes the work by itself).
  virtual void complete_in_background() const {}

 private:
  std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  bool has_result_ = false;  // set before callbacks run; done_ after
  std::exception_ptr error_;
  TensorList result_;
  std::vector<std::function<void(Work&)>> callbacks_;
};

// A Work that has already finished (world size 1, or an op computed locally).
std::shared_ptr<Work> completed_work(std::string description, TensorList result);

// A write to a socket whose peer died raises SIGPIPE, whose default action kills the process
// before the write can fail with an error. Stores and process groups call this once: when
// SIGPIPE still has its default action it is ignored (as Python does at start-up), so a dead
// peer becomes a chorus::Error on the live ranks. A handler the program installed is kept.
void ignore_sigpipe();

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;

  // In place on every tensor (all must have the same shape and dtype across ranks).
  virtual std::shared_ptr<Work> allreduce(const TensorList& tensors, ReduceOp op = ReduceOp::Sum) = 0;
  virtual std::shared_ptr<Work> broadcast(const TensorList& tensors, int root) = 0;
  // outputs[r] receives rank r's input.
  virtual std::shared_ptr<Work> allgather(const TensorList& outputs, const Tensor& input) = 0;
  // output receives the reduction of inputs[rank] over all ranks.
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& output, const TensorList& inputs,
                                               ReduceOp op = ReduceOp::Sum) = 0;
  // inputs[r] goes to rank r; outputs[r] receives rank r's inputs[this rank]. One tensor per rank
  // in each list, all of one dtype; sizes may differ between pairs (as torch's all_to_all).
  virtual std::shared_ptr<Work> all_to_all(const TensorList& outputs, const TensorList& inputs) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;
  virtual std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) = 0;

  // Coalescing: the operations issued between start_coalescing() and end_coalescing() form one
  // group, and end_coalescing() returns one Work that completes when all of them have (its result:
  // every op's result, in order). On a device that is one launch on the communication stream (NCCL:
  // ncclGroupStart/End); a CPU group runs the ops as issued. Nesting is an error; the Works the ops
  // return while coalescing are their own (on a device: the group's, completing with it).
  virtual void start_coalescing();
  virtual std::shared_ptr<Work> end_coalescing();
  bool is_coalescing() const { return coalescing_; }

 protected:
  // Subclasses pass every Work they create through here, so end_coalescing() can join them.
  std::shared_ptr<Work> track(std::shared_ptr<Work> work);

  int rank_;
  int size_;
  bool coalescing_ = false;
  std::vector<std::shared_ptr<Work>> coalesced_;
};

// A Work that completes when every one of `parts` has (result: their results, concatenated; error:
// the first part's that failed).
std::shared_ptr<Work> joined_work(std::string description, std::vector<std::shared_ptr<Work>> parts);

}  // namespace chorus::distributed
