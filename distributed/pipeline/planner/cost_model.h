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
//     f_s = sum_{l in [i,j)} forward time of layer l at m / r samples (profile.h's time_at: the
//           profiled sizes interpolated; linear in samples when only one size was profiled)
//     b_s = the same with the backward time
//     a_s = sum of the layers' grad_accumulate_ms: every micro-batch's backward after the first
//           adds its parameter gradients into the accumulated ones
//     o_s = sum of the layers' optimizer_ms: the optimizer step after the stage's allreduce
//   transfer s->s+1 (activations forward, their gradients backward, same size, one direction at a
//   time): f = b = latency + m * activation_bytes_{j-1} / profile_batch / bandwidth, at the
//   intra-node bandwidth when both stages' devices are all on one node, else inter-node.
// Under 1F1B (and GPipe) the slowest unit Q (the pivot: largest f_u + b_u + a_u; a = 0 for
// transfers) sets the steady phase:
//   pipeline = warm-up + steady + ending = sum_u (f_u + b_u) + (M - 1) * (f_Q + b_Q + a_Q)
// (warm-up: the first micro-batch's forward reaching Q; ending: the last micro-batch's forward after
// Q, all backwards back to stage 0; their sum is one micro-batch's full round trip.)
// [Transfers without overlap] On a cluster whose communication does not run beside computation
// (Cluster::communication_overlaps_compute false: CPU processes filling a machine's cores, where
// the backend's threads and every hand-off between them wait for a core the computation holds), a
// stage passes its messages itself, so the steady unit of stage s is
//   f_s + b_s + a_s + 2 c_{s-1->s} + 2 c_{s->s+1}          (no separate transfer units)
// (each transfer both ways per micro-batch: activation one way, its gradient back). Measured on a
// 2-core machine, this is what makes many small micro-batches slow there (docs/pipeline.md).
// [Allreduce overlap] A stage's gradients are final after its last backward, which ends
//   E_s = pipeline - sum_{units u before stage s} b_u
// (the last micro-batch's backward still has to pass the earlier units). The stage's replicas then
// allreduce its gradients in DDP's buckets (ring: AR_s = 2 (r-1)/r * param_bytes / bandwidth +
// buckets * 2 (r-1) * latency, with the cluster's allreduce figures, inter-node when the replicas
// span nodes; buckets = 1 for the first bucket's bytes + one per bucket_cap_bytes of the rest) and
// step its optimizer (o_s). Two kinds of overlap:
// - with the stage's own last backward (CostOptions::allreduce_overlaps_last_backward, on by
//   default: the runtime reduces through DDP's Reducer during the last micro-batch's backward,
//   bucket by bucket): gradients are taken to become ready evenly over that backward b_s, so at
//   best the allreduce ends b_s after it started: exposed AR'_s = max(0, AR_s - b_s). Off, or on a
//   cluster whose communication does not run beside computation
//   (Cluster::communication_overlaps_compute): AR'_s = AR_s (the allreduce starts after the last
//   backward);
// - with the earlier stages' backward, which the schedule allows (no dependency). So
//   iteration = max_s (E_s + AR'_s + o_s)      (>= pipeline: E_0 = pipeline)
// Stage 0's allreduce is never hidden by other stages; a later stage's is hidden up to the
// backward time left before it. Pure data parallelism is S = 1: iteration = M (f + b) + AR'.
//
// [Memory model] Per device of stage s: parameters, gradients and `optimizer_state_copies` more
// copies of the parameters (Adam keeps 2: the two moments), plus the saved activations of the
// micro-batches in flight — S - s under 1F1B (stage 0 has started S micro-batches before its first
// backward), M under GPipe — each sum_{l in [i,j)} saved_bytes_l * (m / r) / profile_batch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "distributed/pipeline/planner/cluster.h"
#include "distributed/pipeline/plan.h"
#include "distributed/pipeline/planner/profile.h"

namespace chorus::distributed::pipeline::planner {

struct CostOptions {
  int optimizer_state_copies = 2;  // per parameter, beside the parameter and its gradient (Adam: 2)
  bool allreduce_overlaps_last_backward = true;  // see [Allreduce overlap]
  // DDP's buckets (DDPOptions' defaults): a stage's gradients are allreduced in a first bucket of
  // first_bucket_bytes and then buckets of up to bucket_cap_bytes, each paying the latency term.
  int64_t first_bucket_bytes = int64_t{1} << 20;
  int64_t bucket_cap_bytes = int64_t{25} << 20;
};

struct StagePrediction {
  double forward_ms = 0;   // per micro-batch, on one replica
  double backward_ms = 0;
  double accumulate_ms = 0;  // a_s: per micro-batch after the first
  double optimizer_ms = 0;   // o_s: once per iteration
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
  double steady_ms = 0;       // (M - 1) * (f_Q + b_Q + a_Q)
  double bottleneck_ms = 0;   // f_Q + b_Q + a_Q
  bool bottleneck_is_transfer = false;  // the pivot unit is a transfer, not a stage
  int pivot_stage = 0;        // the stage with the largest f + b + a
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
  double accumulate_ms(int first, int end) const;  // a: per micro-batch after the first
  double optimizer_ms(int first, int end) const;   // o: once per iteration
  // Lower bounds of forward_ms / forward + backward for `samples` samples per device: the least
  // time per sample of each layer (profile.h) times the samples. For the planner's pruning.
  double forward_lower_bound_ms(int first, int end, double samples) const;
  double compute_lower_bound_ms(int first, int end, double samples) const;
  // The activation of layer `last` (the sender's last layer) for one micro-batch, one direction.
  double transfer_ms(int last, bool inter_node) const;
  double allreduce_ms(int first, int end, int replicas, bool inter_node) const;
  // AR'_s: the part of allreduce_ms not hidden by the stage's own last backward (see [Allreduce overlap]).
  double exposed_allreduce_ms(int first, int end, int replicas, bool inter_node) const;
  int64_t param_bytes(int first, int end) const;
  // Per device; in_flight micro-batches of saved activations.
  int64_t memory_bytes(int first, int end, int replicas, int in_flight) const;

  // Cluster::communication_overlaps_compute ([Transfers without overlap], [Allreduce overlap]).
  bool communication_overlaps_compute() const { return cluster_.communication_overlaps_compute; }

  // The whole model on `plan` (validated against this cluster: all devices used). A plan whose
  // num_layers, global_batch or micro_batches differ from this model's is a chorus::Error.
  Prediction predict(const PipelinePlan& plan) const;

 private:
  // Prefix sums of forward and backward times at one number of samples per device.
  struct TimePrefix {
    std::vector<double> forward, backward;
  };
  TimePrefix make_prefix(double samples) const;
  // Forward (backward: false) time of layers [first, end) at `replicas`.
  double stage_ms(int first, int end, int replicas, bool forward) const;
  double samples_per_replica(int replicas) const;
  ModelProfile profile_;
  Cluster cluster_;
  int64_t global_batch_;
  int micro_batches_;
  CostOptions options_;
  std::map<int, TimePrefix> times_;  // by replica count, for those dividing the micro-batch
  std::vector<double> accumulate_prefix_, optimizer_prefix_, min_forward_rate_prefix_, min_compute_rate_prefix_;
  std::vector<int64_t> param_prefix_, saved_prefix_;
};

// Convenience: CostModel(profile, cluster, plan.global_batch, plan.micro_batches).predict(plan).
Prediction predict(const PipelinePlan& plan, const ModelProfile& profile, const Cluster& cluster, CostOptions options = {});

}  // namespace chorus::distributed::pipeline::planner
