// The DAPPLE planner: its DP against exhaustive enumeration under the same cost model (random
// profiles and clusters, fixed seed), the cost formula on a hand-computed plan, and the decisions it
// should make: a pipeline when data parallelism does not fit in memory, data parallelism when
// communication is cheap and layers are balanced, a pipeline when the allreduce is expensive.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "distributed/pipeline/planner/placement.h"
#include "distributed/pipeline/planner/planner.h"
#include "tensor/error.h"

using namespace chorus;
using namespace chorus::distributed::pipeline;
using namespace chorus::distributed::pipeline::planner;

namespace {

ModelProfile random_profile(std::mt19937& rng, int layers, bool huge_params) {
  std::uniform_real_distribution<double> ms(0.1, 5.0), ratio(1.0, 3.0), log_bytes(3.0, 7.0);
  ModelProfile p;
  p.batch = 4;
  for (int l = 0; l < layers; ++l) {
    LayerProfile lp;
    lp.name = "layer" + std::to_string(l);
    lp.forward_ms = ms(rng);
    lp.backward_ms = lp.forward_ms * ratio(rng);
    lp.activation_bytes = static_cast<int64_t>(std::pow(10.0, log_bytes(rng)));
    lp.param_bytes = static_cast<int64_t>(std::pow(10.0, log_bytes(rng) + (huge_params ? 2.0 : 0.0)));
    if (l % 2 == 0) lp.saved_bytes = lp.activation_bytes * 3;  // half the layers measured, half not
    // Some layers timed at more batch sizes (small batches less efficient per sample), and the
    // per-micro-batch gradient accumulation and optimizer step.
    if (l % 3 != 1) {
      for (int64_t b : {1, 2, 8}) {
        const double per_sample = (b < 4 ? 1.5 : 0.8) * std::uniform_real_distribution<double>(0.8, 1.2)(rng);
        lp.timings.push_back({b, lp.forward_ms * b / 4 * per_sample, lp.backward_ms * b / 4 * per_sample});
      }
    }
    lp.grad_accumulate_ms = std::uniform_real_distribution<double>(0.0, 0.5)(rng);
    lp.optimizer_ms = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    p.layers.push_back(lp);
  }
  return p;
}

Cluster make_cluster(int nodes, int per_node, double intra, double inter, int64_t memory, double latency_us = 0) {
  Cluster c;
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.intra_node_bytes_per_s = intra;
  c.inter_node_bytes_per_s = inter;
  c.memory_bytes_per_device = memory;
  c.intra_node_latency_us = latency_us;
  c.inter_node_latency_us = 2 * latency_us;
  return c;
}

// All compositions of `layers` into stages: callback gets the end layer of each stage.
void for_each_partition(int layers, int max_stages, const std::function<void(const std::vector<int>&)>& fn) {
  std::vector<int> ends;
  std::function<void(int)> rec = [&](int start) {
    if (start == layers) return fn(ends);
    if (static_cast<int>(ends.size()) == max_stages) return;
    for (int e = start + 1; e <= layers; ++e) {
      ends.push_back(e);
      rec(e);
      ends.pop_back();
    }
  };
  rec(0);
}

PipelinePlan make_plan(const std::vector<int>& ends, const std::vector<std::vector<int>>& ranks, int64_t batch, int micro) {
  PipelinePlan plan;
  plan.num_layers = ends.back();
  plan.global_batch = batch;
  plan.micro_batches = micro;
  for (size_t s = 0; s < ends.size(); ++s) {
    StagePlan st;
    st.first_layer = s ? ends[s - 1] : 0;
    st.end_layer = ends[s];
    st.ranks = ranks[s];
    plan.stages.push_back(st);
  }
  return plan;
}

// Best iteration time over every partition and every assignment of the devices to its stages
// (each device labelled with a stage; every stage non-empty, its size dividing the micro-batch).
double brute_force_all_placements(const CostModel& model, bool respect_memory) {
  const int D = model.cluster().num_devices();
  double best = std::numeric_limits<double>::infinity();
  for_each_partition(model.num_layers(), D, [&](const std::vector<int>& ends) {
    const int S = static_cast<int>(ends.size());
    std::vector<int> label(D, 0);
    std::function<void(int)> rec = [&](int d) {
      if (d < D) {
        for (int s = 0; s < S; ++s) label[d] = s, rec(d + 1);
        return;
      }
      std::vector<std::vector<int>> ranks(S);
      for (int r = 0; r < D; ++r) ranks[label[r]].push_back(r);
      for (const auto& g : ranks)
        if (g.empty() || model.micro_batch_size() % static_cast<int64_t>(g.size()) != 0) return;
      const Prediction p = model.predict(make_plan(ends, ranks, model.global_batch(), model.micro_batches()));
      if (!respect_memory || p.fits_memory) best = std::min(best, p.iteration_ms);
    };
    rec(0);
  });
  return best;
}

// Best over every partition, replica counts and, stage by stage, each placement policy, placing the
// stages last to first as the planner does.
double brute_force_policies(const CostModel& model, bool respect_memory) {
  const Cluster& c = model.cluster();
  const int D = c.num_devices();
  double best = std::numeric_limits<double>::infinity();
  for_each_partition(model.num_layers(), D, [&](const std::vector<int>& ends) {
    const int S = static_cast<int>(ends.size());
    std::vector<int> reps(S), policy(S);
    std::function<void(int, int)> rec = [&](int s, int left) {
      if (s == S) {
        if (left != 0) return;
        std::function<void(int)> pol = [&](int q) {
          if (q < S) {
            for (int p = 0; p < 3; ++p) policy[q] = p, pol(q + 1);
            return;
          }
          std::vector<int> used(c.nodes, 0), order;
          std::vector<std::vector<int>> takes;
          for (int st = S - 1; st >= 0; --st) {
            std::vector<int> take = place(kAllPolicies[policy[st]], used, c.devices_per_node, reps[st]);
            REQUIRE(!take.empty());
            for (int n = 0; n < c.nodes; ++n) used[n] += take[n];
            order.push_back(st);
            takes.push_back(take);
          }
          const auto ranks = ranks_for(c, order, takes, true);
          const Prediction p = model.predict(make_plan(ends, ranks, model.global_batch(), model.micro_batches()));
          if (!respect_memory || p.fits_memory) best = std::min(best, p.iteration_ms);
        };
        pol(0);
        return;
      }
      for (int r = 1; r <= left; ++r)
        if (model.micro_batch_size() % r == 0) reps[s] = r, rec(s + 1, left - r);
    };
    rec(0, D);
  });
  return best;
}

}  // namespace

TEST_CASE("the planner's DP finds the exhaustive optimum on small random cases", "[planner]") {
  std::mt19937 rng(20211);
  struct Shape {
    int nodes, per_node;
  };
  const Shape shapes[] = {{1, 1}, {1, 2}, {2, 1}, {1, 3}, {1, 4}, {2, 2}, {4, 1}, {2, 2}};
  const double bandwidths[] = {1e8, 1e9, 1e10, 1e11};
  int cases = 0, memory_bound = 0, infeasible = 0, pipelines = 0, replicated = 0, no_overlap_pipelines = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const Shape shape = shapes[trial % 8];
    const int layers = 2 + trial % 5;
    const ModelProfile profile = random_profile(rng, layers, trial % 3 == 0);
    const double intra = bandwidths[rng() % 4], inter = intra / (1 + rng() % 20);
    const int micro = 1 + static_cast<int>(rng() % 4);
    const int64_t batch = micro * (trial % 4 == 3 ? 6 : 12);  // micro-batch 6 or 12 samples
    // Memory between "nothing fits" and "everything fits", from the unconstrained optimum's needs.
    Cluster cluster = make_cluster(shape.nodes, shape.per_node, intra, inter, int64_t{1} << 50, trial % 2 ? 5 : 0);
    // A third of the clusters run communication on the computing cores ([Transfers without
    // overlap]: the stages' units absorb their transfers), some with their own allreduce figures.
    cluster.communication_overlaps_compute = trial % 3 != 2;
    if (!cluster.communication_overlaps_compute) {
      // Messages as costly as a CPU machine's (milliseconds), so the transfers shape the answer.
      cluster.intra_node_latency_us = 2000;
      cluster.inter_node_latency_us = 3000;
    }
    if (trial % 5 == 1) cluster.intra_node_allreduce_bytes_per_s = intra / 3, cluster.intra_node_allreduce_latency_us = 50;
    const CostOptions cost{.allreduce_overlaps_last_backward = trial % 4 < 2};
    const CostModel loose(profile, cluster, batch, micro, cost);
    const double loose_best = brute_force_all_placements(loose, false);
    REQUIRE(std::isfinite(loose_best));
    const PlanResult unconstrained =
        plan_dapple(profile, cluster, {.global_batch = batch, .micro_batches = micro, .cost = cost});
    cluster.memory_bytes_per_device = static_cast<int64_t>(unconstrained.prediction.max_memory_bytes *
                                                           std::uniform_real_distribution<double>(0.3, 1.2)(rng));
    const CostModel model(profile, cluster, batch, micro, cost);
    for (PlacementSearch search : {PlacementSearch::kExhaustive, PlacementSearch::kPolicies}) {
      INFO("trial " << trial << " nodes " << shape.nodes << "x" << shape.per_node << " layers " << layers
                    << " micro-batches " << micro << " search " << (search == PlacementSearch::kExhaustive));
      const double expected = search == PlacementSearch::kExhaustive ? brute_force_all_placements(model, true)
                                                                     : brute_force_policies(model, true);
      const PlannerOptions options{.global_batch = batch, .micro_batches = micro, .cost = cost, .placement = search};
      ++cases;
      if (!std::isfinite(expected)) {
        ++infeasible;
        REQUIRE_THROWS_AS(plan_dapple(profile, cluster, options), Error);
        continue;
      }
      const PlanResult r = plan_dapple(profile, cluster, options);
      REQUIRE(r.prediction.iteration_ms == Approx(expected).epsilon(1e-9));
      REQUIRE(r.search_iteration_ms == Approx(r.prediction.iteration_ms).epsilon(1e-9));
      REQUIRE(r.prediction.fits_memory);
      REQUIRE(r.plan.predicted->iteration_ms == r.prediction.iteration_ms);
      if (expected > loose_best * (1 + 1e-9)) ++memory_bound;
      if (r.plan.num_stages() > 1) ++pipelines;
      if (r.plan.num_stages() > 1 && !cluster.communication_overlaps_compute) ++no_overlap_pipelines;
      for (const StagePlan& st : r.plan.stages) replicated += st.replicas() > 1;
    }
  }
  // The random cases exercise what they should: memory that changes the answer, no plan at all,
  // pipelines and replicated stages.
  CHECK(cases == 96);
  CHECK(memory_bound > 5);
  CHECK(infeasible > 2);
  CHECK(pipelines > 10);
  CHECK(replicated > 10);
  CHECK(no_overlap_pipelines > 3);
}

TEST_CASE("exhaustive placement is never worse than the policies", "[planner]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 10; ++trial) {
    const ModelProfile profile = random_profile(rng, 5, trial % 2 == 0);
    const Cluster cluster = make_cluster(2, 2, 1e10, 1e9, int64_t{1} << 50);
    const PlanResult policies = plan_dapple(profile, cluster, {.global_batch = 16, .micro_batches = 4});
    const PlanResult split = plan_dapple(
        profile, cluster, {.global_batch = 16, .micro_batches = 4, .placement = PlacementSearch::kExhaustive});
    REQUIRE(split.prediction.iteration_ms <= policies.prediction.iteration_ms * (1 + 1e-12));
  }
}

TEST_CASE("the cost model gives the hand-computed time and memory of a two-stage plan", "[planner][cost]") {
  // 3 layers, profiled at batch 2. Plan: [0,2) on ranks 0,1 (node 0), [2,3) on rank 2 (node 1).
  // Global batch 8 in M = 2 micro-batches of m = 4 samples.
  ModelProfile p;
  p.batch = 2;
  p.layers = {{"a", 1.0, 2.0, 1000, 4000, 3000}, {"b", 2.0, 3.0, 2000, 8000, -1}, {"c", 3.0, 5.0, 500, 100, 700}};
  const Cluster c = make_cluster(2, 2, 1e6, 1e5, 1 << 20);  // 1 MB/s inside, 0.1 MB/s between nodes
  PipelinePlan plan = make_plan({2, 3}, {{0, 1}, {2, 3}}, 8, 2);
  const Prediction pr = predict(plan, p, c);
  // Stage 0: 2 replicas x 2 samples = 1 profiled batch: f = 3, b = 5. Stage 1: 2 replicas, f = 3, b = 5.
  REQUIRE(pr.stages[0].forward_ms == Approx(3.0));
  REQUIRE(pr.stages[0].backward_ms == Approx(5.0));
  // Transfer: layer b's output for 4 samples = 4000 bytes between nodes at 1e5 B/s = 40 ms.
  REQUIRE(pr.stages[0].send_inter_node);
  REQUIRE(pr.stages[0].send_ms == Approx(40.0));
  // The transfer is the pivot unit (80 ms): pipeline = (8 + 80 + 8) + (2 - 1) * 80 = 176 ms.
  REQUIRE(pr.bottleneck_is_transfer);
  REQUIRE(pr.pipeline_ms == Approx(176.0));
  // Allreduces inside node 0 (12000 B) and node 1 (100 B) at 1e6 B/s over 2 replicas: 12 ms, 0.1 ms.
  REQUIRE(pr.stages[0].allreduce_ms == Approx(12.0));
  REQUIRE(pr.stages[1].allreduce_ms == Approx(0.1));
  // Stage 1's last backward ends at 176 - (5 + 40) = 131: its allreduce is hidden either way.
  REQUIRE(pr.stages[1].last_backward_end_ms == Approx(131.0));
  // Stage 0's last backward ends at 176 and no other stage hides its allreduce; its own last
  // backward (5 ms) hides 5 of the 12 ms by default, none without that overlap.
  REQUIRE(pr.stages[0].allreduce_exposed_ms == Approx(7.0));
  REQUIRE(pr.iteration_ms == Approx(183.0));
  REQUIRE(predict(plan, p, c, {.allreduce_overlaps_last_backward = false}).iteration_ms == Approx(188.0));
  // Memory: params x (1 + 1 + 2 Adam moments) + in-flight micro-batches (1F1B: 2 on stage 0, 1 on
  // stage 1) x saved bytes for 2 samples (layer b saved nothing measured: its output stands in).
  REQUIRE(pr.stages[0].peak_memory_bytes == 12000 * 4 + 2 * (3000 + 2000));
  REQUIRE(pr.stages[1].peak_memory_bytes == 100 * 4 + 1 * 700);
  REQUIRE(pr.pivot_stage == 0);  // of the two stages, the first has the larger f + b (tie -> first)
  // GPipe keeps all M = 2 micro-batches on every stage.
  plan.schedule = "gpipe";
  REQUIRE(predict(plan, p, c).stages[1].peak_memory_bytes == 100 * 4 + 2 * 700);
  // Same plan, both stages on one node each but the second moved next to the first: intra-node.
  const Cluster one_node = make_cluster(1, 4, 1e6, 1e5, 1 << 20);
  REQUIRE_FALSE(predict(make_plan({2, 3}, {{0, 1}, {2, 3}}, 8, 2), p, one_node).stages[0].send_inter_node);
}

TEST_CASE("the cost model's micro-batch terms and transfers without overlap, by hand", "[planner][cost]") {
  // 2 layers profiled at batch 4 and at batch 2 (less efficient per sample); a plan of 2 stages x 1
  // replica on one node, global batch 8 in M = 4 micro-batches of 2 samples.
  ModelProfile p;
  p.batch = 4;
  LayerProfile a{"a", 4.0, 8.0, 1000, 100, -1}, b{"b", 2.0, 2.0, 10, 100, -1};
  a.timings = {{2, 3.0, 5.0}};  // 2 samples: 3 + 5, not 2 + 4
  a.grad_accumulate_ms = 0.5, a.optimizer_ms = 2.0;
  b.optimizer_ms = 1.0;
  p.layers = {a, b};
  Cluster c = make_cluster(1, 2, 1e6, 1e6, 1 << 30, 1000);  // 1 ms per message + 1 MB/s
  const PipelinePlan plan = make_plan({1, 2}, {{0}, {1}}, 8, 4);
  // Stage 0: f = 3, b = 5, a = 0.5, o = 2. Stage 1: f = 1, b = 1 (linear), a = 0, o = 1.
  // Transfer: 1 ms + 500 bytes / 1e6 B/s = 1.5 ms.
  Prediction pr = predict(plan, p, c);
  REQUIRE(pr.stages[0].forward_ms == Approx(3.0));
  REQUIRE(pr.stages[0].accumulate_ms == Approx(0.5));
  REQUIRE(pr.stages[0].send_ms == Approx(1.5));
  // With overlap: units 8 + 0.5 (stage 0), 3 (transfer both ways), 2 (stage 1): pivot stage 0.
  // pipeline = (8 + 3 + 2) + 3 * 8.5 = 38.5; stage 0 ends at 38.5, + optimizer 2 = 40.5.
  REQUIRE(pr.bottleneck_ms == Approx(8.5));
  REQUIRE(pr.pipeline_ms == Approx(38.5));
  REQUIRE(pr.iteration_ms == Approx(40.5));
  // Without overlap each stage's unit takes its transfers: stage 0 8.5 + 3, stage 1 2 + 3.
  c.communication_overlaps_compute = false;
  pr = predict(plan, p, c);
  REQUIRE(pr.bottleneck_ms == Approx(11.5));
  REQUIRE(pr.pipeline_ms == Approx(13.0 + 3 * 11.5));
  REQUIRE(pr.iteration_ms == Approx(13.0 + 3 * 11.5 + 2.0));
  // DDP's buckets: 1 MiB first, then up to 25 MiB: 30 MiB of gradients are 3 buckets, each paying
  // the latency (2 replicas: 2 ring steps of 1 ms) beside 30 MiB / 1e6 B/s.
  ModelProfile big;
  big.batch = 2;
  big.layers = {{"w", 1.0, 1.0, 8, 30 << 20, -1}};
  const CostModel dp(big, c, 2, 1);
  REQUIRE(dp.allreduce_ms(0, 1, 2, false) == Approx(3 * 2 * 1.0 + (30 << 20) / 1e6 * 1e3));
  const CostModel one_bucket(big, c, 2, 1, {.first_bucket_bytes = 64 << 20});
  REQUIRE(one_bucket.allreduce_ms(0, 1, 2, false) == Approx(1 * 2 * 1.0 + (30 << 20) / 1e6 * 1e3));
  // One micro-batch: nothing accumulates.
  REQUIRE(predict(make_plan({1, 2}, {{0}, {1}}, 2, 1), p, c).stages[0].accumulate_ms == 0.0);
}

TEST_CASE("a pipeline is chosen when data parallelism does not fit in memory", "[planner][memory]") {
  // Balanced layers with large parameters on fast links: without a limit, pure DP wins.
  ModelProfile p;
  p.batch = 8;
  for (int l = 0; l < 4; ++l) p.layers.push_back({"l" + std::to_string(l), 10.0, 20.0, 1 << 16, 1LL << 30, -1});
  Cluster c = make_cluster(1, 4, 1e12, 1e12, 1LL << 40);
  const PlannerOptions options{.global_batch = 32, .micro_batches = 4};
  const PlanResult free_plan = plan_dapple(p, c, options);
  REQUIRE(free_plan.plan.num_stages() == 1);
  REQUIRE(free_plan.plan.stages[0].replicas() == 4);
  // DP needs 4 GiB of parameters x 4 = 16 GiB per device; give 10 GiB.
  REQUIRE(free_plan.prediction.max_memory_bytes > (10LL << 30));
  c.memory_bytes_per_device = 10LL << 30;
  const PlanResult fitted = plan_dapple(p, c, options);
  REQUIRE(fitted.plan.num_stages() >= 2);
  REQUIRE(fitted.prediction.fits_memory);
  for (int64_t bytes : fitted.plan.predicted->peak_memory_bytes) REQUIRE(bytes <= (10LL << 30));
  REQUIRE(fitted.prediction.iteration_ms > free_plan.prediction.iteration_ms);
  // With 3 GiB nothing fits (every layer alone needs 4 GiB); the error names both figures.
  c.memory_bytes_per_device = 3LL << 30;
  REQUIRE_THROWS_WITH(plan_dapple(p, c, options), Catch::Contains("no plan fits in 3221225472 bytes per device") &&
                                                      Catch::Contains("without the limit needs 17179934720 bytes"));
}

TEST_CASE("pure data parallelism is chosen when communication is cheap and layers balanced", "[planner]") {
  ModelProfile p;
  p.batch = 4;
  for (int l = 0; l < 6; ++l) p.layers.push_back({"l" + std::to_string(l), 2.0, 4.0, 1 << 20, 1 << 20, -1});
  const Cluster c = make_cluster(2, 4, 3e11, 1e11, 1LL << 36);
  const PlanResult r = plan_dapple(p, c, {.global_batch = 64, .micro_batches = 2});
  REQUIRE(r.plan.num_stages() == 1);
  REQUIRE(r.plan.stages[0].ranks == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  // And it beats a balanced two-stage pipeline over the same devices (which idles in warm-up and ending).
  const PipelinePlan two_stage = make_plan({3, 6}, {{0, 1, 2, 3}, {4, 5, 6, 7}}, 64, 2);
  REQUIRE(predict(two_stage, p, c).iteration_ms > 1.2 * r.prediction.iteration_ms);
}

TEST_CASE("a pipeline is chosen when the allreduce is expensive", "[planner]") {
  // 1 GB of parameters per layer, 1 GB/s between nodes: DP's inter-node allreduce dominates.
  ModelProfile p;
  p.batch = 4;
  for (int l = 0; l < 4; ++l) p.layers.push_back({"l" + std::to_string(l), 5.0, 10.0, 1 << 20, 1000000000, -1});
  const Cluster c = make_cluster(2, 2, 1e11, 1e9, 1LL << 40);
  const PlanResult r = plan_dapple(p, c, {.global_batch = 32, .micro_batches = 8});
  const Prediction dp = predict(data_parallel_plan(4, c, 32, 8), p, c);
  REQUIRE(r.plan.num_stages() >= 2);
  REQUIRE(r.prediction.iteration_ms < 0.5 * dp.iteration_ms);
  // No stage's replicas straddle the slow link.
  for (const StagePlan& st : r.plan.stages) {
    for (int rank : st.ranks) REQUIRE(c.node_of(rank) == c.node_of(st.ranks.front()));
  }
  // Stage 0 gets the low ranks.
  REQUIRE(r.plan.stages[0].ranks.front() == 0);
}

TEST_CASE("the planner refuses bad inputs with what was given and what was expected", "[planner][errors]") {
  ModelProfile p;
  p.batch = 4;
  p.layers = {{"a", 1.0, 2.0, 100, 100, -1}, {"b", 1.0, 2.0, 100, 100, -1}};
  Cluster c = make_cluster(1, 2, 1e9, 1e9, 1 << 30);
  REQUIRE_THROWS_WITH(plan_dapple(p, c, {.global_batch = 10, .micro_batches = 4}),
                      Catch::Contains("global batch 10 is not divisible by micro_batches 4"));
  REQUIRE_THROWS_WITH(plan_dapple(p, c, {.global_batch = 8, .micro_batches = 0}),
                      Catch::Contains("micro_batches = 0, expected at least 1"));
  Cluster zero = c;
  zero.devices_per_node = 0;
  REQUIRE_THROWS_WITH(plan_dapple(p, zero, {.global_batch = 8, .micro_batches = 2}),
                      Catch::Contains("devices_per_node = 0, expected at least 1"));
  zero = c;
  zero.nodes = 0;
  REQUIRE_THROWS_WITH(plan_dapple(p, zero, {.global_batch = 8, .micro_batches = 2}),
                      Catch::Contains("nodes = 0, expected at least 1"));
  // 3 devices cannot share micro-batches of 1 sample: one device per stage, but only 2 layers.
  const Cluster three = make_cluster(1, 3, 1e9, 1e9, 1 << 30);
  REQUIRE_THROWS_WITH(plan_dapple(p, three, {.global_batch = 2, .micro_batches = 2}),
                      Catch::Contains("no plan uses all 3 devices") && Catch::Contains("micro-batch of 1 samples"));
  // With micro-batches of 2 samples it works: one layer alone, the other on 2 replicas.
  REQUIRE(plan_dapple(p, three, {.global_batch = 4, .micro_batches = 2}).plan.num_stages() == 2);
  // A plan that does not match the profile.
  REQUIRE_THROWS_WITH(predict(data_parallel_plan(3, c, 8, 2), p, c), Catch::Contains("plan has 3 layers, expected the profile's 2"));
  REQUIRE_THROWS_WITH(data_parallel_plan(2, c, 6, 2), Catch::Contains("the micro-batch of 3 samples (global_batch 6 / micro_batches 2) does not split among stage 0's 2 replicas"));
}
