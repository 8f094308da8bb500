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
#pragma once

#include <memory>

#include "distributed/reducer.h"

namespace chorus::distributed {

class HierarchicalGroups {
 public:
  // local_size must divide the default group's size; a chorus::Error otherwise.
  static std::shared_ptr<HierarchicalGroups> make(int local_size);

  int local_size() const { return local_size_; }
  int nodes() const { return nodes_; }
  const std::shared_ptr<ProcessGroup>& intra() const { return intra_; }  // this node's processes
  const std::shared_ptr<ProcessGroup>& inter() const { return inter_; }  // this local rank on every node

  // Sums `t` over every rank, in place (any shape, contiguous; padded internally to a multiple of
  // local_size). Blocks until done.
  void allreduce(Tensor& t);

 private:
  int local_size_ = 1, nodes_ = 1;
  std::shared_ptr<ProcessGroup> intra_, inter_;
};

// DDP communication hook: each bucket (pre-divided by the world size) summed hierarchically.
CommHook hierarchical_allreduce_hook(std::shared_ptr<HierarchicalGroups> groups);

}  // namespace chorus::distributed
