// Text for plans and predictions (see report.h).
#include "distributed/pipeline/planner/report.h"

#include <fmt/format.h>

#include <set>

#include "tensor/error.h"

namespace chorus::distributed::pipeline::planner {

std::string format_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return fmt::format("{:.2f} KiB", bytes / 1024.0);
  return fmt::format("{:.0f} B", bytes);
}

std::string describe_plan(const PipelinePlan& plan, const Prediction& p, const ModelProfile& profile, const Cluster& cluster) {
  std::string out = fmt::format(
      "{} stage{}, global batch {} in {} micro-batches of {}, schedule {}\n"
      "| stage | layers | replicas | ranks | nodes | fwd ms | bwd ms | accumulate ms | send ms | allreduce ms | "
      "optimizer ms | peak memory |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      plan.num_stages(), plan.num_stages() > 1 ? "s" : "", plan.global_batch, plan.micro_batches,
      plan.micro_batch_size(), plan.schedule);
  for (int s = 0; s < plan.num_stages(); ++s) {
    const StagePlan& st = plan.stages[s];
    const StagePrediction& sp = p.stages[s];
    std::set<int> nodes;
    for (int r : st.ranks) nodes.insert(cluster.node_of(r));
    const std::string names = st.end_layer - st.first_layer == 1
                                  ? profile.layers[st.first_layer].name
                                  : profile.layers[st.first_layer].name + ".." + profile.layers[st.end_layer - 1].name;
    std::string ranks = fmt::format("{}", fmt::join(st.ranks, ","));
    if (st.replicas() > 2 && st.ranks.back() - st.ranks.front() + 1 == st.replicas())
      ranks = fmt::format("{}-{}", st.ranks.front(), st.ranks.back());
    out += fmt::format("| {}{} | [{},{}) {} | {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {} | {} | {:.2f} | {} |\n", s,
                       s == p.pivot_stage ? "*" : "", st.first_layer, st.end_layer, names, st.replicas(), ranks,
                       fmt::join(nodes, ","), sp.forward_ms, sp.backward_ms, sp.accumulate_ms,
                       s + 1 < plan.num_stages() ? fmt::format("{:.2f} ({})", sp.send_ms, sp.send_inter_node ? "inter" : "intra")
                                                 : std::string("-"),
                       st.replicas() > 1 ? fmt::format("{:.2f} ({})", sp.allreduce_ms, sp.replicas_inter_node ? "inter" : "intra")
                                         : std::string("-"),
                       sp.optimizer_ms, format_bytes(static_cast<double>(sp.peak_memory_bytes)));
  }
  out += fmt::format(
      "iteration {:.2f} ms = pipeline {:.2f} ms (of which steady (M-1) x {:.2f} = {:.2f} ms, pivot: {}) + "
      "allreduce and optimizer step not hidden {:.2f} ms; peak memory {} of {} per device{}\n",
      p.iteration_ms, p.pipeline_ms, p.bottleneck_ms, p.steady_ms,
      p.bottleneck_is_transfer ? "a transfer"
                               : fmt::format("stage {}{}", p.pivot_stage,
                                             cluster.communication_overlaps_compute ? "" : " with its transfers"),
      p.iteration_ms - p.pipeline_ms,
      format_bytes(static_cast<double>(p.max_memory_bytes)),
      format_bytes(static_cast<double>(cluster.memory_bytes_per_device)), p.fits_memory ? "" : " (DOES NOT FIT)");
  return out;
}

}  // namespace chorus::distributed::pipeline::planner
