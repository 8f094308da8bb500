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
  if (options_.first_bucket_bytes < 1 || options_.bucket_cap_bytes < 1)
    fail("cost model: got bucket sizes {} / {} bytes (first / cap), expected both >= 1", options_.first_bucket_bytes,
         options_.bucket_cap_bytes);
  if (options_.optimizer_state_copies < 0)
    fail("cost model: got optimizer_state_copies = {}, expected >= 0", options_.optimizer_state_copies);
  accumulate_prefix_ = optimizer_prefix_ = min_forward_rate_prefix_ = min_compute_rate_prefix_ = {0.0};
  param_prefix_ = saved_prefix_ = {0};
  for (const LayerProfile& l : profile_.layers) {
    accumulate_prefix_.push_back(accumulate_prefix_.back() + l.grad_accumulate_ms);
    optimizer_prefix_.push_back(optimizer_prefix_.back() + l.optimizer_ms);
    const auto [f_rate, b_rate] = l.min_ms_per_sample(profile_.batch);
    min_forward_rate_prefix_.push_back(min_forward_rate_prefix_.back() + f_rate);
    min_compute_rate_prefix_.push_back(min_compute_rate_prefix_.back() + f_rate + b_rate);
    param_prefix_.push_back(param_prefix_.back() + l.param_bytes);
    saved_prefix_.push_back(saved_prefix_.back() + l.saved_or_activation_bytes());
  }
  // Every replica count a plan can use divides the micro-batch: their times, once.
  const int64_t m = micro_batch_size();
  for (int64_t r = 1; r <= std::min<int64_t>(m, cluster_.num_devices()); ++r)
    if (m % r == 0) times_.emplace(static_cast<int>(r), make_prefix(static_cast<double>(m / r)));
}

CostModel::TimePrefix CostModel::make_prefix(double samples) const {
  TimePrefix p{{0.0}, {0.0}};
  for (const LayerProfile& l : profile_.layers) {
    const BatchTiming t = l.time_at(samples, profile_.batch);
    p.forward.push_back(p.forward.back() + t.forward_ms);
    p.backward.push_back(p.backward.back() + t.backward_ms);
  }
  return p;
}

double CostModel::samples_per_replica(int replicas) const {
  return static_cast<double>(micro_batch_size() / replicas) / static_cast<double>(profile_.batch);
}

double CostModel::stage_ms(int first, int end, int replicas, bool forward) const {
  auto it = times_.find(replicas);
  if (it == times_.end()) {
    // Not a divisor of the micro-batch (no plan has it): the rows a replica would get, rounded down.
    double ms = 0;
    for (int l = first; l < end; ++l) {
      const BatchTiming t = profile_.layers[l].time_at(static_cast<double>(micro_batch_size() / replicas), profile_.batch);
      ms += forward ? t.forward_ms : t.backward_ms;
    }
    return ms;
  }
  const std::vector<double>& prefix = forward ? it->second.forward : it->second.backward;
  return prefix[end] - prefix[first];
}

double CostModel::forward_ms(int first, int end, int replicas) const { return stage_ms(first, end, replicas, true); }

double CostModel::backward_ms(int first, int end, int replicas) const { return stage_ms(first, end, replicas, false); }

double CostModel::accumulate_ms(int first, int end) const { return accumulate_prefix_[end] - accumulate_prefix_[first]; }

double CostModel::optimizer_ms(int first, int end) const { return optimizer_prefix_[end] - optimizer_prefix_[first]; }

double CostModel::forward_lower_bound_ms(int first, int end, double samples) const {
  return (min_forward_rate_prefix_[end] - min_forward_rate_prefix_[first]) * samples;
}

double CostModel::compute_lower_bound_ms(int first, int end, double samples) const {
  return (min_compute_rate_prefix_[end] - min_compute_rate_prefix_[first]) * samples;
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
  const double bandwidth = cluster_.allreduce_bytes_per_s(inter_node);
  const double latency_ms = cluster_.allreduce_latency_us(inter_node) / 1e3;
  const double steps = 2.0 * (replicas - 1);
  const int64_t rest = std::max<int64_t>(0, param_bytes(first, end) - options_.first_bucket_bytes);
  const double buckets = 1.0 + static_cast<double>((rest + options_.bucket_cap_bytes - 1) / options_.bucket_cap_bytes);
  return steps / replicas * bytes / bandwidth * 1e3 + buckets * steps * latency_ms;
}

double CostModel::exposed_allreduce_ms(int first, int end, int replicas, bool inter_node) const {
  const double ar = allreduce_ms(first, end, replicas, inter_node);
  if (!options_.allreduce_overlaps_last_backward || !communication_overlaps_compute()) return ar;
  return std::max(0.0, ar - backward_ms(first, end, replicas));
}

int64_t CostModel::param_bytes(int first, int end) const { return param_prefix_[end] - param_prefix_[first]; }

int64_t CostModel::memory_bytes(int first, int end, int replicas, int in_flight) const {
  const double activations = static_cast<double>(saved_prefix_[end] - saved_prefix_[first]) *
                             samples_per_replica(replicas) * in_flight;
  return param_bytes(first, end) * (2 + options_.optimizer_state_copies) + std::llround(activations);
}

Prediction CostModel::predict(const PipelinePlan& plan) const {
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
  double sum_units = 0;
  for (int s = 0; s < S; ++s) {
    const StagePlan& st = plan.stages[s];
    StagePrediction& sp = p.stages[s];
    const int node = single_node(st);
    sp.forward_ms = forward_ms(st.first_layer, st.end_layer, st.replicas());
    sp.backward_ms = backward_ms(st.first_layer, st.end_layer, st.replicas());
    sp.accumulate_ms = micro_batches_ > 1 ? accumulate_ms(st.first_layer, st.end_layer) : 0.0;
    sp.optimizer_ms = optimizer_ms(st.first_layer, st.end_layer);
    sp.replicas_inter_node = node < 0;
    sp.allreduce_ms = allreduce_ms(st.first_layer, st.end_layer, st.replicas(), sp.replicas_inter_node);
    sp.allreduce_exposed_ms = exposed_allreduce_ms(st.first_layer, st.end_layer, st.replicas(), sp.replicas_inter_node);
    const int in_flight = plan.schedule == "gpipe" ? micro_batches_ : S - s;
    sp.peak_memory_bytes = memory_bytes(st.first_layer, st.end_layer, st.replicas(), in_flight);
    sum_units += sp.forward_ms + sp.backward_ms;
    if (s + 1 < S) {
      const int next = single_node(plan.stages[s + 1]);
      sp.send_inter_node = !(node >= 0 && node == next);
      sp.send_ms = transfer_ms(st.end_layer - 1, sp.send_inter_node);
      sum_units += 2 * sp.send_ms;
    }
  }
  // The steady phase's unit ([Latency model]): with overlap, a stage's f + b + a or a transfer's
  // 2c, whichever is largest; without ([Transfers without overlap]), each stage's f + b + a plus
  // both directions of the transfers on either side of it.
  p.bottleneck_ms = -1;
  for (int s = 0; s < S; ++s) {
    const StagePrediction& sp = p.stages[s];
    double unit = sp.forward_ms + sp.backward_ms + sp.accumulate_ms;
    if (!communication_overlaps_compute()) unit += 2 * sp.send_ms + (s > 0 ? 2 * p.stages[s - 1].send_ms : 0.0);
    if (unit > p.bottleneck_ms) p.bottleneck_ms = unit, p.pivot_stage = s;
  }
  if (communication_overlaps_compute())
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
    p.iteration_ms =
        std::max(p.iteration_ms, sp.last_backward_end_ms + sp.allreduce_exposed_ms + sp.optimizer_ms);
    backward_before += sp.backward_ms + sp.send_ms;
    p.max_memory_bytes = std::max(p.max_memory_bytes, sp.peak_memory_bytes);
  }
  p.fits_memory = p.max_memory_bytes <= cluster_.memory_bytes_per_device;
  return p;
}

Prediction predict(const PipelinePlan& plan, const ModelProfile& profile, const Cluster& cluster, CostOptions options) {
  return CostModel(profile, cluster, plan.global_batch, plan.micro_batches, options).predict(plan);
}

}  // namespace chorus::distributed::pipeline::planner
