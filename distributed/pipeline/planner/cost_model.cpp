// DAPPLE's latency and memory model (see cost_model.h for the formulas).
#include "distributed/pipeline/planner/cost_model.h"

#include <algorithm>
#include <cmath>

#include "tensor/error.h"

namespace chorus::distributed::pipeline::planner {

std::vector<int64_t> Prediction::peak_memory_bytes() const {
  std::vector<int64_t> out;
  for (const StagePrediction& s : stages) out.push_back(s.peak_memory_bytes);
  return out;
}

PlanPrediction Prediction::as_plan_prediction() const {
  return {.iteration_ms = iteration_ms, .peak_memory_bytes = peak_memory_bytes(), .pivot_stage = pivot_stage};
}

CostModel::CostModel(ModelProfile profile, Cluster cluster, int64_t global_batch, int micro_batches,
                     CostOptions options)
    : profile_(std::move(profile)),
      cluster_(cluster),
      global_batch_(global_batch),
      micro_batches_(micro_batches),
      options_(options) {
  cluster_.validate();
  if (profile_.layers.empty()) fail("cost model: got a profile with no layers, expected at least one");
  if (profile_.batch < 1) fail("cost model: got a profile batch of {}, expected at least 1", profile_.batch);
  if (micro_batches_ < 1) fail("cost model: got micro_batches = {}, expected at least 1", micro_batches_);
  if (global_batch_ < 1 || global_batch_ % micro_batches_ != 0)
    fail("cost model: global batch {} is not divisible by micro_batches {} (expected a positive multiple of it)",
         global_batch_, micro_batches_);
  if (options_.optimizer_state_copies < 0)
    fail("cost model: got optimizer_state_copies = {}, expected >= 0", options_.optimizer_state_copies);
  forward_prefix_ = backward_prefix_ = {0.0};
  param_prefix_ = saved_prefix_ = {0};
  for (const LayerProfile& l : profile_.layers) {
    forward_prefix_.push_back(forward_prefix_.back() + l.forward_ms);
    backward_prefix_.push_back(backward_prefix_.back() + l.backward_ms);
    param_prefix_.push_back(param_prefix_.back() + l.param_bytes);
    saved_prefix_.push_back(saved_prefix_.back() + l.saved_or_activation_bytes());
  }
}

double CostModel::samples_per_replica(int replicas) const {
  return static_cast<double>(micro_batch_size() / replicas) / static_cast<double>(profile_.batch);
}

double CostModel::forward_ms(int first, int end, int replicas) const {
  return (forward_prefix_[end] - forward_prefix_[first]) * samples_per_replica(replicas);
}

double CostModel::backward_ms(int first, int end, int replicas) const {
  return (backward_prefix_[end] - backward_prefix_[first]) * samples_per_replica(replicas);
}

double CostModel::transfer_ms(int last, bool inter_node) const {
  const double bytes = static_cast<double>(profile_.layers[last].activation_bytes) *
                       static_cast<double>(micro_batch_size()) / static_cast<double>(profile_.batch);
  const double bandwidth = inter_node ? cluster_.inter_node_bytes_per_s : cluster_.intra_node_bytes_per_s;
  const double latency_ms = (inter_node ? cluster_.inter_node_latency_us : cluster_.intra_node_latency_us) / 1e3;
  return latency_ms + bytes / bandwidth * 1e3;
}

double CostModel::allreduce_ms(int first, int end, int replicas, bool inter_node) const {
  if (replicas <= 1) return 0.0;
  const double bytes = static_cast<double>(param_bytes(first, end));
  const double bandwidth = inter_node ? cluster_.inter_node_bytes_per_s : cluster_.intra_node_bytes_per_s;
  const double latency_ms = (inter_node ? cluster_.inter_node_latency_us : cluster_.intra_node_latency_us) / 1e3;
  const double steps = 2.0 * (replicas - 1);
  return steps / replicas * bytes / bandwidth * 1e3 + steps * latency_ms;
}

double CostModel::exposed_allreduce_ms(int first, int end, int replicas, bool inter_node) const {
  const double ar = allreduce_ms(first, end, replicas, inter_node);
  if (!options_.allreduce_overlaps_last_backward) return ar;
  return std::max(0.0, ar - backward_ms(first, end, replicas));
}

int64_t CostModel::param_bytes(int first, int end) const { return param_prefix_[end] - param_prefix_[first]; }

int64_t CostModel::memory_bytes(int first, int end, int replicas, int in_flight) const {
  const double activations = static_cast<double>(saved_prefix_[end] - saved_prefix_[first]) *
                             samples_per_replica(replicas) * in_flight;
  return param_bytes(first, end) * (2 + options_.optimizer_state_copies) + std::llround(activations);
}

Prediction CostModel::predict(const Plan& plan) const {
  plan.validate(cluster_.num_devices());
  if (plan.num_layers != num_layers())
    fail("cost model: the plan has {} layers, expected the profile's {}", plan.num_layers, num_layers());
  if (plan.global_batch != global_batch_ || plan.micro_batches != micro_batches_)
    fail("cost model: the plan has global batch {} in {} micro-batches, expected this model's {} in {}",
         plan.global_batch, plan.micro_batches, global_batch_, micro_batches_);
  const int S = plan.num_stages();
  // The one node a stage's devices are all on, or -1 when they span nodes.
  auto single_node = [&](const StagePlan& st) {
    const int node = cluster_.node_of(st.ranks.front());
    for (int r : st.ranks)
      if (cluster_.node_of(r) != node) return -1;
    return node;
  };
  Prediction p;
  p.stages.resize(S);
  double sum_units = 0, bottleneck = -1;
  for (int s = 0; s < S; ++s) {
    const StagePlan& st = plan.stages[s];
    StagePrediction& sp = p.stages[s];
    const int node = single_node(st);
    sp.forward_ms = forward_ms(st.first_layer, st.end_layer, st.replicas());
    sp.backward_ms = backward_ms(st.first_layer, st.end_layer, st.replicas());
    sp.replicas_inter_node = node < 0;
    sp.allreduce_ms = allreduce_ms(st.first_layer, st.end_layer, st.replicas(), sp.replicas_inter_node);
    sp.allreduce_exposed_ms = exposed_allreduce_ms(st.first_layer, st.end_layer, st.replicas(), sp.replicas_inter_node);
    const int in_flight = plan.schedule == "gpipe" ? micro_batches_ : S - s;
    sp.peak_memory_bytes = memory_bytes(st.first_layer, st.end_layer, st.replicas(), in_flight);
    sum_units += sp.forward_ms + sp.backward_ms;
    if (sp.forward_ms + sp.backward_ms > bottleneck) {
      bottleneck = sp.forward_ms + sp.backward_ms;
      p.pivot_stage = s;
    }
    if (s + 1 < S) {
      const int next = single_node(plan.stages[s + 1]);
      sp.send_inter_node = !(node >= 0 && node == next);
      sp.send_ms = transfer_ms(st.end_layer - 1, sp.send_inter_node);
      sum_units += 2 * sp.send_ms;
    }
  }
  p.bottleneck_ms = bottleneck;
  for (const StagePrediction& sp : p.stages)
    if (2 * sp.send_ms > p.bottleneck_ms) {
      p.bottleneck_ms = 2 * sp.send_ms;
      p.bottleneck_is_transfer = true;
    }
  p.steady_ms = (micro_batches_ - 1) * p.bottleneck_ms;
  p.pipeline_ms = sum_units + p.steady_ms;
  p.iteration_ms = p.pipeline_ms;
  double backward_before = 0;  // sum of b_u over the units before stage s
  for (int s = 0; s < S; ++s) {
    StagePrediction& sp = p.stages[s];
    sp.last_backward_end_ms = p.pipeline_ms - backward_before;
    p.iteration_ms = std::max(p.iteration_ms, sp.last_backward_end_ms + sp.allreduce_exposed_ms);
    backward_before += sp.backward_ms + sp.send_ms;
    p.max_memory_bytes = std::max(p.max_memory_bytes, sp.peak_memory_bytes);
  }
  p.fits_memory = p.max_memory_bytes <= cluster_.memory_bytes_per_device;
  return p;
}

Prediction predict(const Plan& plan, const ModelProfile& profile, const Cluster& cluster, CostOptions options) {
  return CostModel(profile, cluster, plan.global_batch, plan.micro_batches, options).predict(plan);
}

}  // namespace chorus::distributed::pipeline::planner
