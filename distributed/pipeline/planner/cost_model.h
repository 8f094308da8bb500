// DAPPLE's latency and memory model of one training iteration of a pipeline plan, from a layer
// profile and a cluster. The planner's dynamic programming (planner.h) uses the same primitives,
// so a plan's predicted cost is the cost the planner optimized; `predict` is also what compares a
// given plan (a hand-written one, pure data parallelism) with a measurement.
//
// [Latency model]
// A plan with S stages is a chain of units: stage 0, transfer 0->1, stage 1, ..., stage S-1.
// Each unit u has a per-micro-batch forward time f_u and backward time b_u:
//   stage s with layers [i, j) and r replicas, micro-batch of m = global_batch / micro_batches
//   samples split evenly over the replicas (r divides m):
//     f_s = sum_{l in [i,j)} forward_ms_l * (m / r) / profile_batch   (linear in samples)
//     b_s = the same with backward_ms
//   transfer s->s+1 (activations forward, their gradients backward, same size, one direction at a
//   time): f = b = latency + m * activation_bytes_{j-1} / profile_batch / bandwidth, at the
//   intra-node bandwidth when both stages' devices are all on one node, else inter-node.
// Under 1F1B (and GPipe) the slowest unit Q (the pivot: largest f_u + b_u) sets the steady phase:
//   pipeline = warm-up + steady + ending = sum_u (f_u + b_u) + (M - 1) * (f_Q + b_Q)
// (warm-up: the first micro-batch's forward reaching Q; ending: the last micro-batch's forward after
// Q, all backwards back to stage 0; their sum is one micro-batch's full round trip.)
// [Allreduce overlap] A stage's gradients are final after its last backward, which ends
//   E_s = pipeline - sum_{units u before stage s} b_u
// (the last micro-batch's backward still has to pass the earlier units). The stage's replicas then
// allreduce its gradients (ring: AR_s = 2 (r-1)/r * param_bytes / bandwidth + 2 (r-1) * latency,
// inter-node bandwidth when the replicas span nodes). Two kinds of overlap:
// - with the stage's own last backward (CostOptions::allreduce_overlaps_last_backward, on by
//   default: the runtime reduces through DDP's Reducer during the last micro-batch's backward,
//   bucket by bucket): gradients are taken to become ready evenly over that backward b_s, so at
//   best the allreduce ends b_s after it started: exposed AR'_s = max(0, AR_s - b_s). Off:
//   AR'_s = AR_s (the allreduce starts after the last backward);
// - with the earlier stages' backward, which the schedule allows (no dependency). So
//   iteration = max(pipeline, max_s (E_s + AR'_s))
// Stage 0's allreduce is never hidden by other stages; a later stage's is hidden up to the
// backward time left before it. Pure data parallelism is S = 1: iteration = M (f + b) + AR'.
//
// [Memory model] Per device of stage s: parameters, gradients and `optimizer_state_copies` more
// copies of the parameters (Adam keeps 2: the two moments), plus the saved activations of the
// micro-batches in flight — S - s under 1F1B (stage 0 has started S micro-batches before its first
// backward), M under GPipe — each sum_{l in [i,j)} saved_bytes_l * (m / r) / profile_batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/pipeline/planner/cluster.h"
#include "distributed/pipeline/planner/plan.h"
#include "distributed/pipeline/planner/profile.h"

namespace chorus::distributed::pipeline::planner {

struct CostOptions {
  int optimizer_state_copies = 2;  // per parameter, beside the parameter and its gradient (Adam: 2)
  bool allreduce_overlaps_last_backward = true;  // see [Allreduce overlap]
};

struct StagePrediction {
  double forward_ms = 0;   // per micro-batch, on one replica
  double backward_ms = 0;
  double send_ms = 0;      // transfer to the next stage, each direction (0 for the last stage)
  bool send_inter_node = false;
  double allreduce_ms = 0;          // AR_s
  double allreduce_exposed_ms = 0;  // AR'_s: what is left after the stage's own last backward
  bool replicas_inter_node = false;
  double last_backward_end_ms = 0;  // E_s
  int64_t peak_memory_bytes = 0;    // per device
};

struct Prediction {
  double iteration_ms = 0;
  double pipeline_ms = 0;     // warm-up + steady + ending, without allreduce
  double steady_ms = 0;       // (M - 1) * (f_Q + b_Q)
  double bottleneck_ms = 0;   // f_Q + b_Q
  bool bottleneck_is_transfer = false;  // the pivot unit is a transfer, not a stage
  int pivot_stage = 0;        // the stage with the largest f + b
  std::vector<StagePrediction> stages;
  int64_t max_memory_bytes = 0;
  bool fits_memory = true;

  std::vector<int64_t> peak_memory_bytes() const;
  PlanPrediction as_plan_prediction() const;
};

// The model's primitives, with prefix sums over the profile so each is O(1).
class CostModel {
 public:
  // chorus::Error when the profile is empty, the cluster invalid, micro_batches < 1 or global_batch
  // not a positive multiple of micro_batches.
  CostModel(ModelProfile profile, Cluster cluster, int64_t global_batch, int micro_batches, CostOptions options = {});

  const ModelProfile& profile() const { return profile_; }
  const Cluster& cluster() const { return cluster_; }
  int num_layers() const { return profile_.num_layers(); }
  int64_t global_batch() const { return global_batch_; }
  int micro_batches() const { return micro_batches_; }
  int64_t micro_batch_size() const { return global_batch_ / micro_batches_; }

  // Layers [first, end) on `replicas` devices, per micro-batch.
  double forward_ms(int first, int end, int replicas) const;
  double backward_ms(int first, int end, int replicas) const;
  // The activation of layer `last` (the sender's last layer) for one micro-batch, one direction.
  double transfer_ms(int last, bool inter_node) const;
  double allreduce_ms(int first, int end, int replicas, bool inter_node) const;
  // AR'_s: the part of allreduce_ms not hidden by the stage's own last backward (see [Allreduce overlap]).
  double exposed_allreduce_ms(int first, int end, int replicas, bool inter_node) const;
  int64_t param_bytes(int first, int end) const;
  // Per device; in_flight micro-batches of saved activations.
  int64_t memory_bytes(int first, int end, int replicas, int in_flight) const;

  // The whole model on `plan` (validated against this cluster: all devices used). A plan whose
  // num_layers, global_batch or micro_batches differ from this model's is a chorus::Error.
  Prediction predict(const Plan& plan) const;

 private:
  double samples_per_replica(int replicas) const;
  ModelProfile profile_;
  Cluster cluster_;
  int64_t global_batch_;
  int micro_batches_;
  CostOptions options_;
  std::vector<double> forward_prefix_, backward_prefix_;
  std::vector<int64_t> param_prefix_, saved_prefix_;
};

// Convenience: CostModel(profile, cluster, plan.global_batch, plan.micro_batches).predict(plan).
Prediction predict(const Plan& plan, const ModelProfile& profile, const Cluster& cluster, CostOptions options = {});

}  // namespace chorus::distributed::pipeline::planner
