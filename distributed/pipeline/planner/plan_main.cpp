// `plan`: the DAPPLE planner on the command line. Reads a layer profile (the `profile` tool's JSON)
// and a cluster (JSON or flags), prints the chosen plan beside pure data parallelism and the best
// pure pipeline, and writes the plan JSON the pipeline runtime reads. With --evaluate it predicts a
// given plan instead (to compare with a measured iteration).
//
//   plan --profile profile.json --cluster cluster.json --global-batch 64 --micro-batches 8 --out plan.json
//   plan --profile profile.json --nodes 2 --devices-per-node 8 --intra-node-bytes-per-s 150e9
//        --inter-node-bytes-per-s 3.125e9 --memory-bytes-per-device 32e9 --global-batch 64 --micro-batches 8
//   plan --profile profile.json --cluster cluster.json --evaluate plan.json
#include <CLI/CLI.hpp>
#include <cstdio>

#include "distributed/pipeline/planner/planner.h"
#include "distributed/pipeline/planner/report.h"
#include "tensor/error.h"
#include "utils/cli.h"

using namespace chorus;
using namespace chorus::distributed::pipeline;
using namespace chorus::distributed::pipeline::planner;

int main(int argc, char** argv) {
  CLI::App app{"DAPPLE planner: stage partition, replication and placement for hybrid data + pipeline parallelism"};
  std::string profile_path, cluster_path, out_path, evaluate_path, placement = "policies";
  Cluster flags;
  int64_t global_batch = 0;
  int micro_batches = 1;
  PlannerOptions options;
  bool ignore_memory = false;
  double memory_bytes = 0;
  app.add_option("--profile", profile_path, "layer profile JSON (from the profile tool)")->required();
  auto* cluster_opt = app.add_option("--cluster", cluster_path, "cluster JSON (or the flags below)");
  std::vector<CLI::Option*> cluster_flags = {
      app.add_option("--nodes", flags.nodes, "machines"),
      app.add_option("--devices-per-node", flags.devices_per_node, "devices per machine"),
      app.add_option("--intra-node-bytes-per-s", flags.intra_node_bytes_per_s, "bandwidth inside a machine"),
      app.add_option("--inter-node-bytes-per-s", flags.inter_node_bytes_per_s, "bandwidth between machines"),
      app.add_option("--memory-bytes-per-device", memory_bytes, "device memory (e.g. 32e9)"),
  };
  app.add_option("--intra-node-latency-us", flags.intra_node_latency_us, "per message inside a machine");
  app.add_option("--inter-node-latency-us", flags.inter_node_latency_us, "per message between machines");
  for (CLI::Option* o : cluster_flags) cluster_opt->excludes(o);
  app.add_option("--global-batch", global_batch, "samples per iteration (required unless --evaluate)");
  app.add_option("--micro-batches", micro_batches, "micro-batches per iteration");
  app.add_option("--optimizer-states", options.cost.optimizer_state_copies,
                 "optimizer copies of each parameter (Adam 2, SGD with momentum 1)");
  app.add_option("--placement", placement, "policies (fresh/append/scatter-first) or exhaustive")
      ->check(CLI::IsMember({"policies", "exhaustive"}));
  app.add_option("--max-stages", options.max_stages, "0: no limit");
  app.add_option("--max-replicas", options.max_replicas, "0: no limit");
  app.add_flag("--ignore-memory", ignore_memory, "plan as if memory were unlimited");
  app.add_option("--out", out_path, "write the plan JSON here");
  app.add_option("--evaluate", evaluate_path, "predict this plan JSON instead of planning");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  try {
    const ModelProfile profile = load_profile(profile_path);
    Cluster cluster = flags;
    cluster.memory_bytes_per_device = static_cast<int64_t>(memory_bytes);
    if (!cluster_path.empty()) {
      cluster = load_cluster(cluster_path);
    } else {
      for (CLI::Option* o : cluster_flags)
        if (o->count() == 0) fail("got neither --cluster nor {}, expected a cluster JSON or all of the cluster flags", o->get_name());
      cluster.validate();
    }
    std::printf("profile %s: %d layers at batch %lld%s%s; cluster %d x %d devices, %.3g / %.3g GB/s intra / inter node, %s each\n",
                profile_path.c_str(), profile.num_layers(), static_cast<long long>(profile.batch),
                profile.model.empty() ? "" : ", ", profile.model.c_str(), cluster.nodes, cluster.devices_per_node,
                cluster.intra_node_bytes_per_s / 1e9, cluster.inter_node_bytes_per_s / 1e9,
                format_bytes(static_cast<double>(cluster.memory_bytes_per_device)).c_str());

    if (!evaluate_path.empty()) {
      const PipelinePlan given = load_plan(evaluate_path);
      const Prediction p = predict(given, profile, cluster, options.cost);
      std::printf("\nplan %s: %s\n%s", evaluate_path.c_str(), given.str().c_str(),
                  describe_plan(given, p, profile, cluster).c_str());
      return 0;
    }
    if (global_batch < 1) fail("got --global-batch {}, expected a positive number of samples", global_batch);
    options.global_batch = global_batch;
    options.micro_batches = micro_batches;
    options.placement = placement == "exhaustive" ? PlacementSearch::kExhaustive : PlacementSearch::kPolicies;
    options.respect_memory = !ignore_memory;
    const PlanResult best = plan_dapple(profile, cluster, options);
    std::printf("\nchosen plan (%lld DP states, %lld partial plans): %s\nplacement per stage:", static_cast<long long>(best.states),
                static_cast<long long>(best.partial_plans), best.plan.str().c_str());
    for (const std::string& p : best.placements) std::printf(" %s", p.c_str());
    std::printf("\n%s", describe_plan(best.plan, best.prediction, profile, cluster).c_str());

    const int dp_micro = data_parallel_micro_batches(global_batch, micro_batches, cluster.num_devices());
    if (dp_micro == 0) {
      std::printf("\npure data parallelism: impossible (global batch %lld cannot be shared by %d devices)\n",
                  static_cast<long long>(global_batch), cluster.num_devices());
    } else {
      const PipelinePlan dp = data_parallel_plan(profile.num_layers(), cluster, global_batch, dp_micro);
      const Prediction p = predict(dp, profile, cluster, options.cost);
      std::printf("\npure data parallelism (%d micro-batches): %.2f ms%s; chosen plan is %.2fx faster\n", dp_micro,
                  p.iteration_ms, p.fits_memory ? "" : " (does not fit in memory)",
                  p.iteration_ms / best.prediction.iteration_ms);
    }
    PlannerOptions pipeline_only = options;
    pipeline_only.max_replicas = 1;
    try {
      const PlanResult pipe = plan_dapple(profile, cluster, pipeline_only);
      std::printf("best pure pipeline: %.2f ms (%s)\n", pipe.prediction.iteration_ms, pipe.plan.str().c_str());
    } catch (const Error& e) {
      std::printf("best pure pipeline: none (%s)\n", e.what());
    }
    if (!out_path.empty()) {
      save_plan(best.plan, out_path);
      std::printf("wrote %s\n", out_path.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
