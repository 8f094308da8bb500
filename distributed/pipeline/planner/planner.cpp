// The DAPPLE planner's dynamic programme (see [Planner DP] in planner.h).
#include "distributed/pipeline/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include "distributed/pipeline/planner/placement.h"
#include "tensor/error.h"

namespace chorus::distributed::pipeline::planner {

namespace {

constexpr int kNoStage = -2;   // no stage after this one (the suffix is empty)
constexpr int kSpansNodes = -1;

// One partial plan (a suffix of stages) at a state; `from_*` name the state and entry it extends.
struct Entry {
  double fb, fh, t;  // F+B, F+H, T (planner.h)
  // Without overlap ([Transfers without overlap]): the first stage's steady unit so far (f + b + a
  // + 2c to the next stage); the transfer into it, known once the stage before is placed, adds 2c
  // to it. 0 with overlap.
  double head;
  int k;             // stages so far
  int from_j;        // the suffix it extends starts at layer from_j (-1: the empty suffix)
  uint64_t from_key;
  int from_index;
  int policy;  // index into kAllPolicies, or -1 for an exhaustive split
};

bool dominates(const Entry& a, const Entry& b) {
  return a.fb <= b.fb && a.fh <= b.fh && a.t <= b.t && a.head <= b.head && a.k <= b.k;
}

// Keeps `front` the set of entries no other entry dominates.
void insert(std::vector<Entry>& front, const Entry& e) {
  for (const Entry& x : front)
    if (dominates(x, e)) return;
  front.erase(std::remove_if(front.begin(), front.end(), [&](const Entry& x) { return dominates(e, x); }),
              front.end());
  front.push_back(e);
}

// A state: per-node used counts (base devices_per_node + 1) and the next stage's node (+2).
struct KeyCodec {
  int nodes, per_node;
  uint64_t encode(const std::vector<int>& used, int next_node) const {
    uint64_t code = 0;
    for (int n = nodes - 1; n >= 0; --n) code = code * (per_node + 1) + used[n];
    return code * (nodes + 2) + (next_node + 2);
  }
  std::vector<int> used(uint64_t key) const {
    uint64_t code = key / (nodes + 2);
    std::vector<int> out(nodes);
    for (int n = 0; n < nodes; ++n) out[n] = static_cast<int>(code % (per_node + 1)), code /= (per_node + 1);
    return out;
  }
  int next_node(uint64_t key) const { return static_cast<int>(key % (nodes + 2)) - 2; }
};

int footprint(const std::vector<int>& take) {
  int node = kSpansNodes;
  for (size_t n = 0; n < take.size(); ++n)
    if (take[n] > 0) {
      if (node != kSpansNodes) return kSpansNodes;
      node = static_cast<int>(n);
    }
  return node;
}

}  // namespace

PipelinePlan data_parallel_plan(int num_layers, const Cluster& cluster, int64_t global_batch, int micro_batches) {
  PipelinePlan plan;
  plan.num_layers = num_layers;
  plan.global_batch = global_batch;
  plan.micro_batches = micro_batches;
  StagePlan stage;
  stage.end_layer = num_layers;
  for (int r = 0; r < cluster.num_devices(); ++r) stage.ranks.push_back(r);
  plan.stages.push_back(std::move(stage));
  plan.validate(cluster.num_devices());
  return plan;
}

int data_parallel_micro_batches(int64_t global_batch, int micro_batches, int devices) {
  for (int mb = micro_batches; mb >= 1; --mb)
    if (global_batch % mb == 0 && (global_batch / mb) % devices == 0) return mb;
  return 0;
}

PlanResult plan_dapple(const ModelProfile& profile, const Cluster& cluster, const PlannerOptions& options) {
  const CostModel model(profile, cluster, options.global_batch, options.micro_batches, options.cost);
  const int L = model.num_layers(), N = cluster.nodes, D = cluster.num_devices(), M = options.micro_batches;
  const int64_t m = model.micro_batch_size();
  const bool overlap = model.communication_overlaps_compute();
  if (options.max_stages < 0 || options.max_replicas < 0)
    fail("planner: got max_stages = {}, max_replicas = {}, expected >= 0 (0: no limit)", options.max_stages,
         options.max_replicas);
  // The state key must fit 64 bits: (devices_per_node + 1)^nodes * (nodes + 2).
  if (std::log2(cluster.devices_per_node + 1.0) * N + std::log2(N + 2.0) > 62)
    fail("planner: a cluster of {} nodes x {} devices is too large for the exact search (at most ~2^62 device "
         "occupancies); expected fewer nodes",
         N, cluster.devices_per_node);
  const KeyCodec codec{N, cluster.devices_per_node};
  std::vector<int> replica_counts;  // those dividing the micro-batch
  for (int r = 1; r <= D; ++r)
    if (m % r == 0 && (options.max_replicas == 0 || r <= options.max_replicas)) replica_counts.push_back(r);

  // states[j]: key -> Pareto front of partial plans covering layers [j, L).
  std::vector<std::unordered_map<uint64_t, std::vector<Entry>>> states;
  PlanResult result;
  const Entry* best = nullptr;
  uint64_t best_key = 0;
  double best_ms = std::numeric_limits<double>::infinity();
  // One pass of the DP. greedy: keep one partial plan per state (the cheapest suffix), a quick
  // search whose result is a real plan of the same space, so its cost bounds the optimum. Exact
  // (greedy false): full Pareto fronts, dropping a partial plan whose lower bound exceeds `bound`:
  // the layers [0, i) still to place need at least P = their forward + backward per sample x m /
  // (free devices) in F+B (and Pf, forward only, in F+H), and some stage's f + b is at least P
  // (sum_s W_s / r_s >= W / free and max_s W_s / r_s >= W / sum_s r_s), so
  //   cost >= max(F+H + Pf, F+B + P) + (M - 1) max(T, P).
  auto run = [&](bool greedy, double bound) {
    states.assign(L + 1, {});
    states[L][codec.encode(std::vector<int>(N, 0), kNoStage)].push_back({0.0, 0.0, 0.0, 0.0, 0, -1, 0, -1, -1});
    for (int j = L; j >= 1; --j) {
      for (const auto& [key, front] : states[j]) {
        if (!greedy) {
          ++result.states;
          result.partial_plans += static_cast<int64_t>(front.size());
        }
        const std::vector<int> used = codec.used(key);
        const int next_node = codec.next_node(key);
        int free = D;
        for (int u : used) free -= u;
        for (int i = j - 1; i >= 0; --i) {
          for (int r : replica_counts) {
            // Layers [0, i) still need a stage of at least one device; the first stage takes the rest.
            if (i > 0 ? free - r < 1 : free != r) continue;
            std::vector<std::pair<std::vector<int>, int>> placements;  // (per-node take, policy)
            if (options.placement == PlacementSearch::kExhaustive) {
              for (auto& take : all_placements(used, cluster.devices_per_node, r)) placements.push_back({take, -1});
            } else {
              std::set<std::vector<int>> seen;
              for (int p = 0; p < 3; ++p) {
                std::vector<int> take = place(kAllPolicies[p], used, cluster.devices_per_node, r);
                if (!take.empty() && seen.insert(take).second) placements.push_back({take, p});
              }
            }
            const double f = model.forward_ms(i, j, r), b = model.backward_ms(i, j, r);
            const double a = M > 1 ? model.accumulate_ms(i, j) : 0.0, o = model.optimizer_ms(i, j);
            const double rest_samples = i > 0 ? static_cast<double>(m) / (free - r) : 0.0;
            const double rest_f = model.forward_lower_bound_ms(0, i, rest_samples);
            const double rest_fb = model.compute_lower_bound_ms(0, i, rest_samples);
            for (const auto& [take, policy] : placements) {
              const int node = footprint(take);
              const double c =
                  next_node == kNoStage ? 0.0 : model.transfer_ms(j - 1, !(node >= 0 && node == next_node));
              const double ar = model.exposed_allreduce_ms(i, j, r, node == kSpansNodes);
              std::vector<int> used_after = used;
              for (int n = 0; n < N; ++n) used_after[n] += take[n];
              const uint64_t to_key = codec.encode(used_after, node);
              for (int idx = 0; idx < static_cast<int>(front.size()); ++idx) {
                const Entry& e = front[idx];
                if (options.max_stages > 0 && e.k >= options.max_stages) continue;
                // 1F1B: this stage will have k + 1 stages from it to the end, so k + 1 micro-batches in flight.
                if (options.respect_memory && model.memory_bytes(i, j, r, e.k + 1) > cluster.memory_bytes_per_device)
                  continue;
                Entry n{};
                n.fb = e.fb + f + b + 2 * c;
                n.fh = std::max(e.fh + f + c, n.fb + ar + o);
                if (overlap) {
                  n.t = std::max({e.t, f + b + a, 2 * c});
                  n.head = 0.0;
                } else {
                  // The old first stage's unit gains the transfer into it; this stage's starts.
                  n.head = f + b + a + 2 * c;
                  n.t = std::max({e.t, e.k > 0 ? e.head + 2 * c : 0.0, n.head});
                }
                n.k = e.k + 1;
                n.from_j = j;
                n.from_key = key;
                n.from_index = idx;
                n.policy = policy;
                const double lower = std::max(n.fh + rest_f, n.fb + rest_fb) + (M - 1) * std::max(n.t, rest_fb);
                if (lower > bound * (1 + 1e-9)) continue;
                std::vector<Entry>& to = states[i][to_key];
                if (!greedy) {
                  insert(to, n);
                } else if (to.empty()) {
                  to.push_back(n);
                } else if (n.fh + (M - 1) * n.t < to[0].fh + (M - 1) * to[0].t) {
                  to[0] = n;
                }
              }
            }
          }
        }
      }
    }
    // The best complete plan: all devices used.
    best = nullptr;
    best_ms = std::numeric_limits<double>::infinity();
    for (const auto& [key, front] : states[0]) {
      if (!greedy) {
        ++result.states;
        result.partial_plans += static_cast<int64_t>(front.size());
      }
      for (const Entry& e : front) {
        const double ms = e.fh + (M - 1) * e.t;
        if (ms < best_ms) best_ms = ms, best = &e, best_key = key;
      }
    }
  };
  run(/*greedy=*/true, std::numeric_limits<double>::infinity());
  run(/*greedy=*/false, best_ms);

  if (!best) {
    if (options.respect_memory) {
      PlannerOptions relaxed = options;
      relaxed.respect_memory = false;
      bool exists = true;
      int64_t least = 0;
      try {
        least = plan_dapple(profile, cluster, relaxed).prediction.max_memory_bytes;
      } catch (const Error&) {
        exists = false;
      }
      if (exists)
        fail("planner: no plan fits in {} bytes per device (memory_bytes_per_device); the fastest plan without the limit "
             "needs {} bytes on its fullest device; expected more device memory, more micro-batches or more devices",
             cluster.memory_bytes_per_device, least);
    }
    fail("planner: no plan uses all {} devices ({} nodes x {}) with replica counts dividing the micro-batch of {} "
         "samples (global batch {} / {} micro-batches){}{}; expected a micro-batch size that the devices can share",
         D, N, cluster.devices_per_node, m, options.global_batch, M,
         options.max_stages ? fmt::format(", at most {} stages", options.max_stages) : "",
         options.max_replicas ? fmt::format(", at most {} replicas per stage", options.max_replicas) : "");
  }

  // Walk the back-pointers: stage 0 first (it was placed last).
  PipelinePlan plan;
  plan.num_layers = L;
  plan.global_batch = options.global_batch;
  plan.micro_batches = M;
  std::vector<std::vector<int>> takes;
  int j = 0;
  uint64_t key = best_key;
  const Entry* e = best;
  while (e->from_j >= 0) {
    const std::vector<int> after = codec.used(key), before = codec.used(e->from_key);
    std::vector<int> take(N);
    for (int n = 0; n < N; ++n) take[n] = after[n] - before[n];
    takes.push_back(take);
    StagePlan stage;
    stage.first_layer = j;
    stage.end_layer = e->from_j;
    plan.stages.push_back(std::move(stage));
    result.placements.push_back(e->policy >= 0 ? policy_name(kAllPolicies[e->policy]) : "split");
    j = e->from_j;
    key = e->from_key;
    e = &states[j].at(key)[e->from_index];
  }
  const int S = plan.num_stages();
  std::vector<int> order(S);
  std::vector<std::vector<int>> order_takes(S);
  for (int k = 0; k < S; ++k) order[k] = S - 1 - k, order_takes[k] = takes[S - 1 - k];
  const std::vector<std::vector<int>> ranks = ranks_for(cluster, order, order_takes, /*mirror=*/true);
  for (int s = 0; s < S; ++s) plan.stages[s].ranks = ranks[s];
  result.prediction = model.predict(plan);
  plan.predicted = result.prediction.as_plan_prediction();
  result.plan = std::move(plan);
  result.search_iteration_ms = best_ms;
  return result;
}

}  // namespace chorus::distributed::pipeline::planner
