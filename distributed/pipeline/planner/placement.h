// Where a stage's replicas go, as DAPPLE's placement policies (Fan et al., PPoPP 2021, section 4):
// given how many devices of each node earlier stages took, a policy says how many devices of each
// node the next stage takes.
//   fresh-first:   devices of untouched machines first, then of partly used ones;
//   append-first:  devices of partly used machines first (the fullest first), then fresh ones;
//   scatter-first: spread the stage over all machines with free devices, one device per machine
//                  in turn.
// Only which nodes a stage touches matters to the cost model (intra- or inter-node links), so a
// placement is a per-node count; ranks_for turns a sequence of them into concrete global ranks.
#pragma once

#include <string>
#include <vector>

#include "distributed/pipeline/planner/cluster.h"

namespace chorus::distributed::pipeline::planner {

enum class PlacementPolicy { kFreshFirst, kAppendFirst, kScatterFirst };
inline constexpr PlacementPolicy kAllPolicies[] = {PlacementPolicy::kFreshFirst, PlacementPolicy::kAppendFirst,
                                                   PlacementPolicy::kScatterFirst};
const char* policy_name(PlacementPolicy policy);

// Per-node device counts for a stage of `replicas` devices when `used[n]` devices of node n are
// taken; empty when fewer than `replicas` are free.
std::vector<int> place(PlacementPolicy policy, const std::vector<int>& used, int devices_per_node, int replicas);
// Every per-node split of `replicas` over the free devices (what an exhaustive placement tries).
std::vector<std::vector<int>> all_placements(const std::vector<int>& used, int devices_per_node, int replicas);

// Global ranks of stages placed in `order` (order[k] is the stage given the k-th per-node counts
// counts[k]): on each node, stages take the lowest free local devices in that order. The planner
// places stages last to first and mirrors the numbering (node n -> nodes-1-n, device l ->
// devices_per_node-1-l) when `mirror`, so stage 0 gets the low ranks; mirroring maps nodes to nodes,
// so it changes no cost. Returns the ranks of each stage (indexed by stage), sorted.
std::vector<std::vector<int>> ranks_for(const Cluster& cluster, const std::vector<int>& order,
                                        const std::vector<std::vector<int>>& counts, bool mirror);

}  // namespace chorus::distributed::pipeline::planner
