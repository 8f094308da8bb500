// DAPPLE's placement policies (see placement.h).
#include "distributed/pipeline/planner/placement.h"

#include <algorithm>
#include <numeric>

namespace chorus::distributed::pipeline::planner {

const char* policy_name(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kFreshFirst: return "fresh-first";
    case PlacementPolicy::kAppendFirst: return "append-first";
    case PlacementPolicy::kScatterFirst: return "scatter-first";
  }
  return "?";
}

std::vector<int> place(PlacementPolicy policy, const std::vector<int>& used, int devices_per_node, int replicas) {
  const int nodes = static_cast<int>(used.size());
  int free_total = 0;
  for (int u : used) free_total += devices_per_node - u;
  if (replicas < 1 || replicas > free_total) return {};
  std::vector<int> take(nodes, 0);
  if (policy == PlacementPolicy::kScatterFirst) {
    // One device per machine with free devices, in node order, round after round.
    for (int left = replicas; left > 0;)
      for (int n = 0; n < nodes && left > 0; ++n)
        if (used[n] + take[n] < devices_per_node) ++take[n], --left;
    return take;
  }
  // Fresh and partly used nodes, each fullest first (ties: lower node first); the policy says
  // which group is drained first.
  std::vector<int> fresh, partial;
  for (int n = 0; n < nodes; ++n) {
    if (used[n] == 0) fresh.push_back(n);
    else if (used[n] < devices_per_node) partial.push_back(n);
  }
  std::stable_sort(partial.begin(), partial.end(), [&](int a, int b) { return used[a] > used[b]; });
  std::vector<int> order = policy == PlacementPolicy::kFreshFirst ? fresh : partial;
  const std::vector<int>& then = policy == PlacementPolicy::kFreshFirst ? partial : fresh;
  order.insert(order.end(), then.begin(), then.end());
  int left = replicas;
  for (int n : order) {
    take[n] = std::min(left, devices_per_node - used[n]);
    left -= take[n];
    if (left == 0) break;
  }
  return take;
}

std::vector<std::vector<int>> all_placements(const std::vector<int>& used, int devices_per_node, int replicas) {
  std::vector<std::vector<int>> out;
  std::vector<int> take(used.size(), 0);
  // Depth-first over nodes: node n takes 0..free of what is left.
  auto rec = [&](auto&& self, size_t n, int left) -> void {
    if (n == used.size()) {
      if (left == 0) out.push_back(take);
      return;
    }
    for (int t = 0; t <= std::min(left, devices_per_node - used[n]); ++t) {
      take[n] = t;
      self(self, n + 1, left - t);
    }
    take[n] = 0;
  };
  if (replicas >= 1) rec(rec, 0, replicas);
  return out;
}

std::vector<std::vector<int>> ranks_for(const Cluster& cluster, const std::vector<int>& order,
                                        const std::vector<std::vector<int>>& counts, bool mirror) {
  std::vector<std::vector<int>> ranks(order.size());
  std::vector<int> next_local(cluster.nodes, 0);
  for (size_t k = 0; k < order.size(); ++k) {
    for (int n = 0; n < cluster.nodes; ++n)
      for (int t = 0; t < counts[k][n]; ++t) {
        const int local = next_local[n]++;
        const int node = mirror ? cluster.nodes - 1 - n : n;
        const int device = mirror ? cluster.devices_per_node - 1 - local : local;
        ranks[order[k]].push_back(node * cluster.devices_per_node + device);
      }
    std::sort(ranks[order[k]].begin(), ranks[order[k]].end());
  }
  return ranks;
}

}  // namespace chorus::distributed::pipeline::planner
