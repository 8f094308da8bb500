// A stream-ordered process group: collectives on device tensors run on a dedicated, high-priority
// communication stream, ordered against the compute stream by events, so the host never blocks
// inside a training step. Written once over the device runtime (tensor/runtime.h) and a small
// communicator interface (communicator.h): Gloo on the stream (the sim device in CI; CUDA tensors
// staged through pinned host memory) and NCCL (CUDA) run under the same ordering code.
//
// [Sync Streams] For each collective (or coalesced group): record `ready` on the caller's current
// stream; the communication stream waits on it (so the collective reads what the compute stream
// wrote, e.g. a bucket DDP filled), records a timed `start` event, the communicator puts the
// collective on the stream, and the group records the timed `end` event. Work::wait() makes the
// caller's current stream wait on `end` (no host block: later kernels, e.g. DDP's copy back to
// .grad, run after the collective); StreamWork::synchronize() blocks the host.
//
// Lifetimes: the caching allocator gets record_stream(comm) for every tensor, so memory the caller
// frees at once is not handed to another stream before the collective has passed; the Gloo
// communicator's stream task also holds the tensors (it reads them on another thread). NCCL needs
// only the first, as PyTorch's ProcessGroupNCCL.
//
// [Watchdog] One thread per group polls the works in flight: a work whose end event has passed is
// finished (with the error the communicator noted while running it, if any); a work past the
// group's timeout, or a communicator reporting an asynchronous error, aborts the communicator and
// fails the work. A failure is raised on the caller's thread at its next call into the group,
// naming the collective, its sequence number, the device, the ranks and the timeout.
//
// CPU tensors go to the CPU group (Gloo) unchanged.
#pragma once

#include <optional>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "distributed/communicator.h"
#include "distributed/process_group.h"
#include "tensor/runtime.h"

namespace chorus::distributed {

// A Work whose completion is an event on a communication stream.
class StreamWork : public Work {
 public:
  StreamWork(std::string description, Device device, TensorList outputs);
  // Orders the caller's current stream after the collective; raises its error if it has failed.
  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt) override;
  // Blocks the host until the collective has finished (and rethrows its error).
  void synchronize();
  const TensorList& result() const override { return outputs_; }
  Device device() const { return device_; }
  Event& start_event() { return start_; }
  Event& end_event() { return end_; }
  // Time on the communication stream from start to end, in ms (the collective's span, measured by
  // the device's events); only once the work has completed.
  double elapsed_ms() const;

  // Communicator side: the collective failed while it ran (the first error is kept; the watchdog
  // finishes the work with it once the end event has passed).
  void note_error(std::exception_ptr error);
  std::exception_ptr noted_error() const;
  // The noted error's message (read when it was noted), if an error was noted.
  std::optional<std::string> noted_message() const;
  // The group, before launch: outputs of further ops of a coalesced group.
  void add_outputs(const TensorList& outputs);

 private:
  Device device_;
  TensorList outputs_;
  Event start_{/*enable_timing=*/true};
  Event end_{/*enable_timing=*/true};
  mutable std::mutex note_mutex_;
  std::exception_ptr noted_;
  std::string noted_message_;
};

class ProcessGroupGloo;

class StreamOrderedGroup final : public ProcessGroup {
 public:
  using DeviceCommunicators = std::vector<std::pair<DeviceType, std::shared_ptr<Communicator>>>;
  // `cpu` takes CPU tensors; `devices` names the communicator for each device type (a device type
  // without one is a clear error at the first collective on it). `name` is the backend spec
  // ("gloo", "nccl", "cpu:gloo,cuda:nccl"); `timeout` bounds each collective (the watchdog).
  StreamOrderedGroup(std::shared_ptr<ProcessGroup> cpu, DeviceCommunicators devices, std::chrono::milliseconds timeout,
                     std::string name);
  // Gloo for everything: CPU tensors to `host`, sim and CUDA tensors through a Gloo communicator
  // over it (timeout: the Gloo group's).
  explicit StreamOrderedGroup(std::shared_ptr<ProcessGroupGloo> host);
  ~StreamOrderedGroup() override;

  std::string backend_name() const override { return name_; }
  std::shared_ptr<Work> allreduce(const TensorList& tensors, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const TensorList& tensors, int root) override;
  std::shared_ptr<Work> allgather(const TensorList& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const TensorList& inputs,
                                       ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_to_all(const TensorList& outputs, const TensorList& inputs) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) override;
  // Device ops of a coalesced group launch together at end_coalescing(), on the collective lane,
  // after one ready event (so every input the caller wrote before end_coalescing() is read).
  void start_coalescing() override;
  std::shared_ptr<Work> end_coalescing() override;

  const std::shared_ptr<ProcessGroup>& cpu_group() const { return cpu_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The communication streams of `device` for this group (high priority, made for it): one for
  // collectives, and one each for sends and receives, so that a send waiting for its peer's
  // receive (a ring: isend then irecv) never holds up this rank's receive.
  enum class Lane { Collective, Send, Recv };
  Stream comm_stream(Device device, Lane lane = Lane::Collective);

  // (A test removes the ordering points of [Sync Streams] through tensor/test_faults.h.)

 private:
  using Call = std::function<void(Communicator&, const Stream&, const std::shared_ptr<StreamWork>&)>;
  struct PendingOp {
    std::string name;
    TensorList tensors;
    TensorList written;  // those of `tensors` it writes (for the stream-order sanitizer)
    Call call;
  };
  // Runs one op on device tensors (or queues it while coalescing). `outputs` become the work's
  // result; the op writes them unless `reads_only` (a send keeps its tensor as its result, unwritten).
  std::shared_ptr<Work> device_op(const std::string& name, const TensorList& tensors, const TensorList& outputs,
                                  Lane lane, Call call, bool reads_only = false);
  std::shared_ptr<StreamWork> launch(const std::string& name, Device device, Lane lane, std::vector<PendingOp> ops,
                                     std::shared_ptr<StreamWork> work);
  Communicator& communicator(Device device, const std::string& op);
  // Before a CPU collective: raise a pending failure; let earlier device collectives reach their
  // communicators first (see Communicator::wait_until_issued).
  void before_cpu_op();
  void raise_async_error();
  void watch();

  std::shared_ptr<ProcessGroup> cpu_;
  DeviceCommunicators devices_;
  std::chrono::milliseconds timeout_;
  std::string name_;

  std::mutex mutex_;
  std::condition_variable cv_;
  struct InFlight {
    std::shared_ptr<StreamWork> work;
    Communicator* communicator;
    std::chrono::steady_clock::time_point issued;
  };
  std::vector<InFlight> in_flight_;
  std::string failure_;  // the first failure the watchdog found; raised at every later call
  bool stop_ = false;
  std::vector<std::pair<std::pair<Device, Lane>, Stream>> comm_streams_;
  uint64_t sequence_ = 0;

  // Coalescing: the device ops and the Work they share, launched at end_coalescing().
  std::vector<PendingOp> pending_;
  std::shared_ptr<StreamWork> pending_work_;
  bool cpu_in_group_ = false;

  std::thread watchdog_;  // last: started once everything above exists
};

}  // namespace chorus::distributed
