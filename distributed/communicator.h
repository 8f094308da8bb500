// Communicator: what a device backend provides under the stream-ordered process group
// (stream_group.h). The group owns everything that is the same for every backend — the ready and
// end events, the communication streams, sequence numbers, Work objects, keeping tensors alive,
// coalescing and the watchdog — and asks a communicator only to put one collective on a stream.
//
//   GlooStreamCommunicator (gloo_communicator.h): a task on the stream runs the Gloo collective on
//     the device buffer (sim devices; CUDA tensors staged through pinned host memory). What CI runs.
//   NcclCommunicator (nccl.cpp): NCCL calls enqueued on the stream (CUDA).
//
// A call returns once the collective is on the stream (NCCL: enqueued; Gloo: a task queued); it has
// finished when the stream passes the point after it, where the group records the end event. A
// failure found while the collective runs is noted on its Work (note_error) or, for errors the
// backend reports per communicator (NCCL's asynchronous errors), returned by async_error(); the
// group's watchdog turns either into the Work's error and raises it on the caller's thread.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "distributed/process_group.h"
#include "tensor/runtime.h"

namespace chorus::distributed {

class StreamWork;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;

  // Every tensor is contiguous and on stream.device() (the group checks). `work` is the Work the
  // call belongs to (a coalesced group shares one).
  virtual void allreduce(const TensorList& tensors, ReduceOp op, const Stream& stream,
                         const std::shared_ptr<StreamWork>& work) = 0;
  virtual void broadcast(const TensorList& tensors, int root, const Stream& stream,
                         const std::shared_ptr<StreamWork>& work) = 0;
  virtual void allgather(const TensorList& outputs, const Tensor& input, const Stream& stream,
                         const std::shared_ptr<StreamWork>& work) = 0;
  virtual void reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op, const Stream& stream,
                              const std::shared_ptr<StreamWork>& work) = 0;
  virtual void all_to_all(const TensorList& outputs, const TensorList& inputs, const Stream& stream,
                          const std::shared_ptr<StreamWork>& work) = 0;
  virtual void send(const Tensor& tensor, int dst, int tag, const Stream& stream,
                    const std::shared_ptr<StreamWork>& work) = 0;
  virtual void recv(const Tensor& tensor, int src, int tag, const Stream& stream,
                    const std::shared_ptr<StreamWork>& work) = 0;

  // The calls between group_start() and group_end() are one launch (NCCL: ncclGroupStart/End; Gloo:
  // one stream task that issues them all before waiting for any). All calls of a group use one
  // stream.
  virtual void group_start() = 0;
  virtual void group_end() = 0;

  // The watchdog found a collective past its timeout (or an asynchronous error): stop everything
  // in flight as far as the backend can (NCCL: ncclCommAbort) and fail what comes later at once.
  virtual void abort(const std::string& why) = 0;
  // An error the backend reports for the communicator as a whole, if any (polled by the watchdog).
  virtual std::optional<std::string> async_error() { return std::nullopt; }

  // Blocks until every collective handed to this communicator has reached the backend (Gloo on the
  // stream shares its Gloo group with the CPU collectives, which must reach Gloo in issue order
  // too). Backends with a separate CPU group need nothing here.
  virtual void wait_until_issued() {}
};

}  // namespace chorus::distributed
