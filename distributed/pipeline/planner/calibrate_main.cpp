// `calibrate`: measures this cluster's links through the ProcessGroup the pipeline runtime uses and
// writes the cluster JSON (cluster.h) for the `plan` tool. Run under chorusrun, one process per
// device, as the training job would be:
//
//   chorusrun --nproc-per-node 2 bazel-bin/distributed/pipeline/planner/calibrate --out cluster.json
//
// Point to point between rank 0 and rank 1 (intra-node) and between rank 0 and the first rank of
// node 1 (inter-node, with --nnodes > 1), and the allreduce over all ranks; each fitted to the cost
// model's latency + bytes / bandwidth form (calibration.h). Prints every measured size beside the fit.
// The allreduce's own figures, as a DDP bucket costs a training step (the Reducer's copies included;
// the process group's bare allreduce is printed beside them), go into the cluster's *_allreduce_* keys (a backend's allreduce need
// not run at its point-to-point bandwidth: Gloo's reduces on the CPU as it goes), and
// "communication_overlaps_compute" is false when these processes' compute threads fill this
// machine's cores (then Gloo's threads take their cycles from the computation; --overlap overrides).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "distributed/init.h"
#include "distributed/pipeline/planner/calibration.h"
#include "distributed/pipeline/planner/cluster.h"
#include "distributed/pipeline/json_fields.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "utils/cli.h"

using namespace chorus;
using namespace chorus::distributed::pipeline;
using namespace chorus::distributed::pipeline::planner;

namespace {

int64_t physical_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    meminfo.ignore(1 << 10, '\n');
  }
  fail("calibrate: /proc/meminfo has no MemTotal; pass --memory-bytes-per-device");
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < 1) fail("calibrate: got {}={}, expected a positive integer", name, v);
  return static_cast<int>(x);
}

void print_fit(const char* what, const LinkFit& fit, bool ring, int ranks) {
  std::printf("%s: latency %.1f us, bandwidth %.3g bytes/s\n| bytes | measured ms | fitted ms |\n|---|---|---|\n", what,
              fit.latency_us, fit.bytes_per_s);
  for (const LinkSample& s : fit.samples) {
    const double b = static_cast<double>(s.bytes);
    const double model = ring ? 2.0 * (ranks - 1) * fit.latency_us / 1e3 +
                                    2.0 * (ranks - 1) / ranks * b / fit.bytes_per_s * 1e3
                              : fit.point_to_point_ms(b);
    std::printf("| %lld | %.3f | %.3f |\n", static_cast<long long>(s.bytes), s.ms, model);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measure the cluster's links through the process group and write the planner's cluster JSON"};
  CalibrationOptions options;
  int64_t memory = 0;
  std::string out_path;
  int threads = 0;
  std::string overlap = "auto";
  app.add_option("--sizes", options.sizes_bytes, "point-to-point message sizes in bytes (multiples of 4)")->delimiter(',');
  app.add_option("--allreduce-sizes", options.allreduce_sizes_bytes, "allreduce sizes in bytes (default: DDP's bucket sizes)")
      ->delimiter(',');
  app.add_option("--repeats", options.repeats, "timed runs per size")->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed runs per size")->check(CLI::NonNegativeNumber);
  app.add_option("--compute-between-ms", options.compute_between_ms,
                 "time messages exchanged between computations of this length (default: 1 when communication "
                 "does not overlap computation, else 0: an idle ping-pong)");
  app.add_option("--memory-bytes-per-device", memory, "device memory (default: this machine's RAM / processes on it)");
  app.add_option("--threads", threads, "CPU threads per process (0: the default)")->check(CLI::NonNegativeNumber);
  app.add_option("--out", out_path, "write the cluster JSON here (rank 0)");
  app.add_option("--overlap", overlap, "does communication run beside computation: auto (no when the processes' "
                                       "threads fill the cores), yes or no")
      ->check(CLI::IsMember({"auto", "yes", "no"}));
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) set_num_threads(threads);
    auto group = distributed::init_process_group();
    const int world = group->size();
    const int per_node = env_int("LOCAL_WORLD_SIZE", world);
    if (world % per_node != 0)
      fail("calibrate: WORLD_SIZE {} is not a multiple of LOCAL_WORLD_SIZE {}", world, per_node);
    if (world < 2) fail("calibrate: run it with at least 2 processes (chorusrun --nproc-per-node 2), got {}", world);
    Cluster cluster;
    cluster.nodes = world / per_node;
    cluster.devices_per_node = per_node;
    cluster.memory_bytes_per_device = memory > 0 ? memory : physical_memory_bytes() / per_node;
    const bool root = group->rank() == 0;
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    const int busy = get_num_threads() * per_node;
    cluster.communication_overlaps_compute = overlap == "yes" || (overlap == "auto" && busy < cores);
    // Without overlap a message competes with the computation for the cores: time it so.
    if (!cluster.communication_overlaps_compute && options.compute_between_ms <= 0) options.compute_between_ms = 1.0;
    if (root)
      std::printf("communication_overlaps_compute: %s (%d processes x %d threads on %d cores%s)%s\n\n",
                  cluster.communication_overlaps_compute ? "true" : "false", per_node, get_num_threads(), cores,
                  overlap == "auto" ? "" : ", set by --overlap",
                  options.compute_between_ms > 0
                      ? fmt::format("; point to point timed between {} ms computations", options.compute_between_ms).c_str()
                      : "");
    if (per_node > 1) {
      const LinkFit intra = measure_point_to_point(*group, 0, 1, options);
      cluster.intra_node_latency_us = intra.latency_us;
      cluster.intra_node_bytes_per_s = intra.bytes_per_s;
      if (root) print_fit("point to point, rank 0 -> rank 1 (one node)", intra, false, 2);
    }
    if (cluster.nodes > 1) {
      const LinkFit inter = measure_point_to_point(*group, 0, per_node, options);
      cluster.inter_node_latency_us = inter.latency_us;
      cluster.inter_node_bytes_per_s = inter.bytes_per_s;
      if (root) print_fit(fmt::format("point to point, rank 0 -> rank {} (another node)", per_node).c_str(), inter, false, 2);
    } else {
      // One node: the inter-node figures are never used; the intra-node ones stand in.
      cluster.inter_node_latency_us = cluster.intra_node_latency_us;
      cluster.inter_node_bytes_per_s = cluster.intra_node_bytes_per_s;
    }
    if (per_node == 1) {
      cluster.intra_node_latency_us = cluster.inter_node_latency_us;
      cluster.intra_node_bytes_per_s = cluster.inter_node_bytes_per_s;
    }
    const LinkFit bare = measure_allreduce(*group, options);
    if (root) print_fit(fmt::format("allreduce over {} ranks (ring form), the process group alone", world).c_str(), bare, true, world);
    const LinkFit ring = measure_ddp_allreduce(group, options);
    if (root)
      print_fit(fmt::format("allreduce over {} ranks (ring form), a DDP bucket as a step pays it: written to the cluster",
                            world).c_str(), ring, true, world);
    if (cluster.nodes == 1) {
      cluster.intra_node_allreduce_bytes_per_s = ring.bytes_per_s;
      cluster.intra_node_allreduce_latency_us = ring.latency_us;
    } else {
      cluster.inter_node_allreduce_bytes_per_s = ring.bytes_per_s;
      cluster.inter_node_allreduce_latency_us = ring.latency_us;
    }

    if (root) {
      std::printf("%s", cluster_to_json(cluster).c_str());
      if (!out_path.empty()) {
        json_fields::write_file(out_path, cluster_to_json(cluster), "cluster");
        std::printf("wrote %s\n", out_path.c_str());
      }
    }
    distributed::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "calibrate: %s\n", e.what());
    return 1;
  }
  return 0;
}
