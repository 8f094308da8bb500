// The DAPPLE planner: chooses how to cut a profiled model into pipeline stages, how many
// data-parallel replicas each stage gets and on which devices, minimizing the iteration time of
// cost_model.h under each device's memory. Pure data parallelism (one stage on every device) and
// pure pipelines (one device per stage) are among the candidates, so the plan says when DP wins.
//
// [Planner DP] Stages are chosen last to first (a suffix dynamic programme), because a stage's
// memory depends on how many stages follow it (1F1B keeps S - s micro-batches in flight on stage s)
// and its allreduce overlap on the backward time after it. A state is
//   (j: layers [j, L) are placed, used[n]: devices taken on each node, the node the stage starting at
//    layer j sits on — or "spans nodes" — which decides whether the transfer into it is intra-node)
// and holds the Pareto front of partial plans over four numbers that determine every completion's
// cost: F+B (forward + backward of all units so far), F+H (see below), T (the largest unit
// f_u + b_u + a_u so far) and k (stages so far: fewer leaves more memory for the stages before).
// With H = max over placed stages t of (AR'_t + o_t + backward time from t to the end), AR' the
// exposed allreduce and o the optimizer step of cost_model.h, the whole plan costs
//   iteration = (F + H) + (M - 1) * T        (cost_model.h's formula, rearranged)
// and prepending a stage s (f, b, gradient accumulation a, optimizer step o, transfer c to the next
// stage, exposed allreduce AR') gives
//   F+B' = F+B + f + b + 2c,  F+H' = max(F+H + f + c, F+B' + AR' + o),  T' = max(T, f + b + a, 2c),
//   k' = k + 1.
// Both updates are monotone in every number, so a partial plan dominated in all four can be dropped
// and the search is exact: its result equals exhaustive enumeration under the same cost model
// (tests/pipeline/planner checks this). To keep it fast, a greedy pass (one partial plan per state)
// first finds a real plan of the same space; its cost bounds the optimum, and the exact pass drops
// every partial plan whose lower bound (its own cost plus the least the layers still to place can
// add, planner.cpp) exceeds it. Transitions: every first layer i < j, every replica count
// r dividing the micro-batch, and every placement the policies give (placement.h; or every
// per-node split with PlacementSearch::kExhaustive). All devices are used (the runtime runs one
// process per device).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/pipeline/planner/cluster.h"
#include "distributed/pipeline/planner/cost_model.h"
#include "distributed/pipeline/plan.h"
#include "distributed/pipeline/planner/profile.h"

namespace chorus::distributed::pipeline::planner {

enum class PlacementSearch {
  kPolicies,    // DAPPLE's fresh-first, append-first and scatter-first, chosen stage by stage
  kExhaustive,  // every split of a stage's replicas over the nodes' free devices
};

struct PlannerOptions {
  int64_t global_batch = 0;
  int micro_batches = 1;
  CostOptions cost{};
  PlacementSearch placement = PlacementSearch::kPolicies;
  int max_stages = 0;    // 0: no limit (1: data parallelism only)
  int max_replicas = 0;  // 0: no limit (1: pure pipelines only)
  bool respect_memory = true;
};

struct PlanResult {
  PipelinePlan plan;  // with plan.predicted filled in
  Prediction prediction;
  std::vector<std::string> placements;  // per stage: the policy that placed it ("split" when exhaustive)
  double search_iteration_ms = 0;       // the DP's own figure (equals prediction.iteration_ms)
  int64_t states = 0;                   // DP states the exact pass reached
  int64_t partial_plans = 0;            // Pareto entries it kept over all of them
};

// chorus::Error when the inputs are invalid (see CostModel) or no plan exists: none fits in memory
// (naming the least memory any plan needs and the device memory), or the micro-batch size cannot be
// divided among the devices (e.g. 3 devices, micro-batch of 2 samples).
PlanResult plan_dapple(const ModelProfile& profile, const Cluster& cluster, const PlannerOptions& options);

// Pure data parallelism: one stage of all layers on every device of the cluster.
PipelinePlan data_parallel_plan(int num_layers, const Cluster& cluster, int64_t global_batch, int micro_batches);
// The micro-batch count pure data parallelism should use to compare with a plan of `micro_batches`:
// `micro_batches` itself when every device gets a whole share of each micro-batch, else the largest
// count below it for which they do (gradient accumulation steps; under the linear model the time
// does not depend on it, the memory does). 0 when the global batch cannot be shared by the devices.
int data_parallel_micro_batches(int64_t global_batch, int micro_batches, int devices);

}  // namespace chorus::distributed::pipeline::planner
