// Hierarchical allreduce, as real clusters run it (docs/distributed.md): with L processes per
// node, a reduce-scatter inside each node (over its fast links), an allreduce of each 1/L chunk
// across the nodes among the processes of the same local rank (each over its own NIC), then an
// all-gather inside the node. Per process, the slow inter-node links carry 2(M-1)/M of N/L
// elements for M nodes, instead of a flat ring's 2(ML-1)/(ML) of N at the slowest link.
//
//   auto h = distributed::HierarchicalGroups::make(/*local_size=*/8);   // every rank, same order
//   h->allreduce(t);                                                    // in place, a sum
//   ddp->register_comm_hook(distributed::hierarchical_allreduce_hook(h));
//
// The subgroups are made with new_group over the default group (one per node, one per local
// rank), so every rank must make them together. Ranks r and r' are on one node when
// r / local_size == r' / local_size (chorusrun's numbering: nodes hold consecutive ranks).
//
// Overlap: a sum is three collectives in a row, each waiting for the last. For CPU tensors they
// run on this object's worker thread, one sum at a time in the order they were asked for (so every
// rank issues the subgroups' collectives in the same order), and allreduce_async returns at once:
// DDP's hook lets backward go on while a bucket is summed, as its plain allreduce does. Device
// tensors are chained on the process groups' streams by the caller's thread (wait() there orders a
// stream and does not block the host).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "distributed/reducer.h"

namespace chorus::distributed {

class HierarchicalGroups {
 public:
  // local_size must divide the default group's size; a chorus::Error otherwise.
  static std::shared_ptr<HierarchicalGroups> make(int local_size);
  HierarchicalGroups() = default;
  HierarchicalGroups(const HierarchicalGroups&) = delete;
  HierarchicalGroups& operator=(const HierarchicalGroups&) = delete;
  ~HierarchicalGroups();  // finishes the sums already asked for, then stops the worker

  int local_size() const { return local_size_; }
  int nodes() const { return nodes_; }
  const std::shared_ptr<ProcessGroup>& intra() const { return intra_; }  // this node's processes
  const std::shared_ptr<ProcessGroup>& inter() const { return inter_; }  // this local rank on every node

  // Sums `t` over every rank, in place (any shape, contiguous; padded internally to a multiple of
  // local_size). Blocks until done.
  void allreduce(Tensor& t);
  // Starts the same sum and returns its Work (done when `t` holds the sum; a failed collective is
  // its exception). `t` must stay untouched until then.
  std::shared_ptr<Work> allreduce_async(Tensor t);

 private:
  void sum_now(Tensor& t);  // the three collectives, on the calling thread
  void serve();             // the worker: sums from queue_ in order

  int local_size_ = 1, nodes_ = 1;
  std::shared_ptr<ProcessGroup> intra_, inter_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<Tensor, std::shared_ptr<Work>>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // started by the first CPU sum
};

// DDP communication hook: each bucket (pre-divided by the world size) summed hierarchically.
CommHook hierarchical_allreduce_hook(std::shared_ptr<HierarchicalGroups> groups);

}  // namespace chorus::distributed
