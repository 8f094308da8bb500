// DAPPLE planner projection at paper scale: BERT-large-like models of 24 and 48 encoder layers on
// 2 nodes x 8 GPUs, with NVLink inside a node and 25 or 100 Gb/s Ethernet between nodes; the plan
// the planner chooses against pure data parallelism and the best pure pipeline
// (docs/pipeline.md, "Planner").
//
// The per-layer costs are derived from FLOP counts at a stated device throughput, not measured
// (no GPU here). Per sample of T tokens, hidden H, 4H feed-forward, V vocabulary:
//   encoder layer:  forward 24 T H^2 + 4 T^2 H FLOPs (the four projections, the two feed-forward
//                   matmuls, scores and context); backward 2x forward;
//                   parameters 12 H^2 + 13 H, 4 bytes each (fp32 gradients are allreduced);
//                   output T H x 2 bytes (fp16 activations); saved for backward T H (34 + 5 a T / H)
//                   bytes with a = H / 64 heads (Korthikanti et al. 2022, 16-bit activations);
//   embeddings:     (V + 512 + 2) H + 2 H parameters; time 2% of an encoder layer's (a lookup);
//   masked-LM head: on P = 15% of the tokens: 2 P H (H + V) FLOPs forward, backward 2x;
//                   H^2 + 4H + V parameters (untied from the embeddings, as it sits on another stage).
// Device: --tflops effective (default 35 TFLOP/s, a V100-class GPU in mixed precision at ~30% of
// its 125 TFLOP/s peak), --memory-gb per device (32). Adam: 2 optimizer copies, so 16 bytes per
// parameter with the weights and gradients.
//
//   bazel run -c opt //tests/bench:planner_projection -- [--tflops 35 --seq-len 128 --memory-gb 32 --details
//       --profiles-out DIR]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "distributed/pipeline/planner/planner.h"
#include "distributed/pipeline/planner/report.h"
#include "tensor/error.h"
#include "utils/cli.h"

using namespace chorus;
using namespace chorus::distributed::pipeline;
using namespace chorus::distributed::pipeline::planner;

namespace {

ModelProfile bert_like(int layers, int64_t hidden, int64_t seq_len, double tflops) {
  const double H = static_cast<double>(hidden), T = static_cast<double>(seq_len), V = 30522, heads = H / 64;
  const double flops_to_ms = 1e3 / (tflops * 1e12);
  const double layer_fwd = (24 * T * H * H + 4 * T * T * H) * flops_to_ms;
  const auto act = static_cast<int64_t>(T * H * 2);
  ModelProfile p;
  p.batch = 1;
  p.model = fmt::format("BERT-like, {} layers, hidden {}, {} tokens, {} TFLOP/s", layers, hidden, seq_len, tflops);
  p.layers.push_back({"embeddings", 0.02 * layer_fwd, 0.04 * layer_fwd, act,
                      static_cast<int64_t>(((V + 512 + 2) * H + 2 * H) * 4), act * 2});
  for (int l = 0; l < layers; ++l)
    p.layers.push_back({"layer" + std::to_string(l), layer_fwd, 2 * layer_fwd, act,
                        static_cast<int64_t>((12 * H * H + 13 * H) * 4),
                        static_cast<int64_t>(T * H * (34 + 5 * heads * T / H))});
  const double predicted = std::round(0.15 * T);
  const double head_fwd = 2 * predicted * H * (H + V) * flops_to_ms;
  p.layers.push_back({"mlm_head", head_fwd, 2 * head_fwd, static_cast<int64_t>(predicted * V * 4),
                      static_cast<int64_t>((H * H + 4 * H + V) * 4), static_cast<int64_t>(predicted * (V + 2 * H) * 4)});
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DAPPLE planner projection: BERT-24/48 on 2 x 8 GPUs"};
  double tflops = 35, memory_gb = 32, nvlink_gbytes = 150;
  int64_t seq_len = 128;
  bool details = false;
  std::string profiles_out;
  app.add_option("--tflops", tflops, "effective device throughput, TFLOP/s");
  app.add_option("--memory-gb", memory_gb, "device memory, GB");
  app.add_option("--nvlink-gbytes", nvlink_gbytes, "intra-node bandwidth, GB/s");
  app.add_option("--seq-len", seq_len, "tokens per sample");
  app.add_flag("--details", details, "print every chosen plan's stage table");
  app.add_option("--profiles-out", profiles_out, "write bert24.json and bert48.json (the assumed profiles) to this folder");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  struct Link {
    const char* name;
    double bytes_per_s;
  };
  const Link links[] = {{"25 Gb/s", 25e9 / 8}, {"100 Gb/s", 100e9 / 8}};
  std::printf("2 nodes x 8 GPUs, NVLink %.0f GB/s (5 us) inside a node, Ethernet between nodes (10 us); %.0f GB per GPU; "
              "%.0f TFLOP/s; %lld tokens per sample; Adam (16 bytes per parameter)\n\n",
              nvlink_gbytes, memory_gb, tflops, static_cast<long long>(seq_len));
  std::printf("| model | inter-node | global batch | M | chosen plan | planned ms | pure DP ms | speedup over DP | best pure pipeline ms | search ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int layers : {24, 48}) {
    const ModelProfile profile = bert_like(layers, 1024, seq_len, tflops);
    if (!profiles_out.empty()) save_profile(profile, fmt::format("{}/bert{}.json", profiles_out, layers));
    for (const Link& link : links) {
      Cluster cluster;
      cluster.nodes = 2;
      cluster.devices_per_node = 8;
      cluster.intra_node_bytes_per_s = nvlink_gbytes * 1e9;
      cluster.inter_node_bytes_per_s = link.bytes_per_s;
      cluster.intra_node_latency_us = 5;
      cluster.inter_node_latency_us = 10;
      cluster.memory_bytes_per_device = static_cast<int64_t>(memory_gb * 1e9);
      for (int64_t batch : {64, 256, 1024}) {
        // The best number of micro-batches among a few: the planner takes M as given.
        PlanResult best;
        double best_search_ms = 0;
        bool found = false;
        for (int M : {2, 4, 8, 16, 32}) {
          if (batch % M) continue;
          try {
            const auto t0 = std::chrono::steady_clock::now();
            PlanResult r = plan_dapple(profile, cluster, {.global_batch = batch, .micro_batches = M});
            const double search_ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (!found || r.prediction.iteration_ms < best.prediction.iteration_ms) {
              best = std::move(r);
              best_search_ms = search_ms;
              found = true;
            }
          } catch (const Error&) {
          }
        }
        if (!found) {
          std::printf("| BERT-%d | %s | %lld | - | no plan fits | | | | | |\n", layers, link.name, static_cast<long long>(batch));
          continue;
        }
        // Data parallelism with as many accumulation steps as it can have (the least memory; the
        // time does not depend on it under the linear model).
        const int dp_micro = data_parallel_micro_batches(batch, static_cast<int>(batch), cluster.num_devices());
        const Prediction dp =
            predict(data_parallel_plan(profile.num_layers(), cluster, batch, dp_micro), profile, cluster);
        std::string pipe = "-";
        try {
          PlannerOptions o{.global_batch = batch, .micro_batches = best.plan.micro_batches, .max_replicas = 1};
          pipe = fmt::format("{:.1f}", plan_dapple(profile, cluster, o).prediction.iteration_ms);
        } catch (const Error&) {
          pipe = "does not fit";
        }
        std::string shape;
        for (const StagePlan& st : best.plan.stages)
          shape += fmt::format("{}{}x{}", shape.empty() ? "" : " + ", st.end_layer - st.first_layer, st.replicas());
        std::printf("| BERT-%d | %s | %lld | %d | %d stage%s: %s (layers x replicas) | %.1f | %.1f%s | %.2fx | %s | %.0f |\n", layers,
                    link.name, static_cast<long long>(batch), best.plan.micro_batches, best.plan.num_stages(),
                    best.plan.num_stages() > 1 ? "s" : "", shape.c_str(), best.prediction.iteration_ms, dp.iteration_ms,
                    dp.fits_memory ? "" : " (does not fit)", dp.iteration_ms / best.prediction.iteration_ms, pipe.c_str(),
                    best_search_ms);
        if (details)
          std::printf("\n%s\n", describe_plan(best.plan, best.prediction, profile, cluster).c_str());
      }
    }
  }
  return 0;
}
