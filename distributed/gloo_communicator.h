// Gloo on the stream: a Communicator (communicator.h) whose collectives are ordered on the
// communication stream, so the stream — and every event recorded after it — passes only once the
// collective is done. This is what CI runs under the stream-ordered group on sim (and what CUDA
// tensors use where NCCL is not linked): real processes, real sockets, the real ordering code.
//
// Gloo reads host memory, so device tensors are staged through page-locked host copies, all on the
// stream: it copies out the tensors the collectives read, writes a flag word (a stream memory
// operation), waits for a second one, and copies the results back. A thread of the stream's own (its
// lane worker) polls the first word (a group that reads nothing, a receive or a broadcast away from
// its root, has none and is posted at once), runs the collectives on the host copies and stores the second. The host side
// makes no CUDA call and the stream waits in no host function: the two designs before this one
// deadlocked on a GPU (group_end says how). The sim device implements the flag words as CUDA does
// (stream tasks), so CI runs exactly this path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace chorus::distributed {

class GlooStreamCommunicator final : public Communicator {
 public:
  // `host`: the Gloo group the collectives run on (shared with the CPU collectives of the same
  // stream-ordered group, which is why wait_until_issued() exists).
  explicit GlooStreamCommunicator(std::shared_ptr<ProcessGroup> host);
  ~GlooStreamCommunicator() override;
  std::string name() const override { return "gloo"; }

  void allreduce(const TensorList& tensors, ReduceOp op, const Stream& stream,
                 const std::shared_ptr<StreamWork>& work) override;
  void broadcast(const TensorList& tensors, int root, const Stream& stream,
                 const std::shared_ptr<StreamWork>& work) override;
  void allgather(const TensorList& outputs, const Tensor& input, const Stream& stream,
                 const std::shared_ptr<StreamWork>& work) override;
  void reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op, const Stream& stream,
                      const std::shared_ptr<StreamWork>& work) override;
  void all_to_all(const TensorList& outputs, const TensorList& inputs, const Stream& stream,
                  const std::shared_ptr<StreamWork>& work) override;
  void send(const Tensor& tensor, int dst, int tag, const Stream& stream,
            const std::shared_ptr<StreamWork>& work) override;
  void recv(const Tensor& tensor, int src, int tag, const Stream& stream,
            const std::shared_ptr<StreamWork>& work) override;
  void group_start() override;
  void group_end() override;
  void abort(const std::string& why) override;
  void wait_until_issued() override;

  // For tests: the groups whose collectives were posted to Gloo (or failed at it) so far, and the
  // lane workers waiting for an earlier group to be posted first (gloo_communicator.cpp,
  // [Collectives reach Gloo in the order they were issued]).
  uint64_t groups_posted() const;
  int lanes_waiting_turn() const;

 private:
  // Issues one collective over host tensors (aliases or staged copies of the device tensors).
  using Issue = std::function<std::shared_ptr<Work>(ProcessGroup&, const TensorList&)>;
  // One operand of a collective, in the order `issue` takes them, and its role there: read (copied
  // to the host before the collective), written (copied back after it), or both. By role, not by
  // identity: an in-place reduce_scatter's output that is also one of its inputs is two operands,
  // the input only read and the output only written, so its result is what is copied back.
  struct Operand {
    Tensor tensor;
    bool read, written;
  };
  // Adds one collective to the open group (all of it, or nothing when an operand is refused).
  // `ordered`: Gloo matches it by the order it is posted (every collective; not a send or receive,
  // which their tags match).
  void add(const char* op, const std::vector<Operand>& operands, const Stream& stream,
           const std::shared_ptr<StreamWork>& work, Issue issue, bool ordered = true);
  void release_staging(bool all);
  // A group's place in the orders its lane worker waits for (gloo_communicator.cpp): among the
  // communicator's ordered groups (0: not ordered), and among its device's groups under sim's model
  // of NCCL (0: not modelled).
  struct Turn {
    uint64_t order = 0;
    int device = 0;
    uint64_t device_order = 0;
  };
  // A block of page-locked host memory from a PinnedPool.
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
  };
  // Page-locked memory for one device type's staging, allocated rarely and reused.
  class PinnedPool;
  PinnedPool& pool_for(Device device);
  // The thread that runs the staged collectives of one stream, in its order (made at first use,
  // its flag words taken from `pool`).
  class LaneWorker;
  LaneWorker& worker_for(const Stream& stream, PinnedPool& pool);

  std::shared_ptr<ProcessGroup> host_;
  struct State;  // shared with the stream tasks, which may outlive the communicator
  std::shared_ptr<State> state_;

  // The group being built (one stream task at group_end()).
  struct Job {
    Issue issue;
    size_t first, count;  // its tensors in `aliases`
    std::shared_ptr<StreamWork> work;
    bool ordered;
  };
  int depth_ = 0;
  uint64_t ordered_issued_ = 0;  // the last ordered group pushed to a lane worker
  std::map<int, uint64_t> device_issued_;  // the last group pushed, per sim device (sim's model of NCCL)
  bool discard_ = false;  // an op of the open group was refused: group_end submits none of it
  std::optional<Stream> stream_;
  std::vector<Job> jobs_;
  struct StagedTensor {
    Tensor device, host;  // the device tensor and its host copy (Gloo's operand)
    bool read;            // whether the collective reads it (then it is copied to the host first)
    bool written;         // whether the collective writes it (then it is copied back)
  };
  std::vector<StagedTensor> staged_;

  std::mutex staging_mutex_;
  struct Staging {
    Event done;                                      // recorded after the group's task
    std::vector<std::shared_ptr<StreamWork>> works;  // the group's works, alive until `done`
    PinnedPool* pool;                                // where `blocks` return
    std::vector<Block> blocks;                       // the host copies' memory
  };
  std::vector<Staging> staging_;

  std::mutex workers_mutex_;
  // Before the workers, whose flag words they hold: destroyed after them.
  std::vector<std::pair<DeviceType, std::unique_ptr<PinnedPool>>> pools_;
  // Last: the workers outlive the destructor's body, which waits for what they still have to run.
  std::vector<std::pair<Stream, std::unique_ptr<LaneWorker>>> workers_;
};

}  // namespace chorus::distributed
