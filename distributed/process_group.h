// ProcessGroup: collectives among a fixed set of processes (ranks). Every call returns a Work at
// once and runs asynchronously in issue order; Work::wait() blocks until it finished and rethrows
// its error (a chorus::Error naming the op, its sequence number, the ranks and the timeout).
// Backends: ProcessGroupGloo (CPU tensors over TCP), ProcessGroupNCCL (CUDA, later).
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
  // The tensors the op wrote (allreduce: its inputs, in place; allgather: the outputs).
  virtual const TensorList& result() const { return result_; }
  // Runs `fn` once the work has finished (at once if it already has), on the completing thread.
  void then(std::function<void(Work&)> fn);
  const std::string& description() const { return description_; }

  // Backend side.
  void finish(TensorList result, std::exception_ptr error = nullptr);

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
  virtual std::shared_ptr<Work> barrier() = 0;
  virtual std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) = 0;

 protected:
  int rank_;
  int size_;
};

}  // namespace chorus::distributed
