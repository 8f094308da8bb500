// Link calibration: the line fit recovers latency and bandwidth and survives noise, and the
// `calibrate` tool, run with 2 processes under chorusrun, writes a cluster file the planner reads
// with positive figures from real messages.
#include <catch2/catch.hpp>
#include <cstdio>

#include "distributed/pipeline/planner/calibration.h"
#include "distributed/pipeline/planner/cluster.h"
#include "tensor/error.h"
#include "tests/distributed/worker_launcher.h"

using namespace chorus;
using namespace chorus::distributed::pipeline::planner;

TEST_CASE("the link fit recovers latency and bandwidth from exact samples", "[planner][calibration]") {
  // 50 us + bytes / 2e9 B/s.
  std::vector<LinkSample> samples;
  for (int64_t b : {4096, 65536, 1 << 20, 8 << 20}) samples.push_back({b, 0.05 + static_cast<double>(b) / 2e9 * 1e3});
  const auto [intercept_ms, ms_per_byte] = fit_line(samples);
  REQUIRE(intercept_ms == Approx(0.05));
  REQUIRE(1e3 / ms_per_byte == Approx(2e9));
  // A fit through negative latency is pinned at 0 (through the origin).
  const auto [zero, slope] = fit_line({{1000, 0.0005}, {2000, 0.0015}});
  REQUIRE(zero == 0.0);
  REQUIRE(slope > 0);
  // Times that fall with size (noise above the size's effect): all latency, a tiny slope, no error.
  const auto [latency, tiny] = fit_line({{1000, 2.0}, {2000, 1.0}});
  REQUIRE(latency == Approx(1.5));
  REQUIRE(tiny > 0);
  REQUIRE(tiny * 2000 < latency / 100);
  REQUIRE_THROWS_WITH(fit_line({{1000, 1.0}, {1000, 2.0}}), Catch::Contains("got 1 distinct message sizes"));
}

TEST_CASE("calibrate measures two processes' links and writes a cluster the planner reads", "[planner][calibration]") {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string out = dir + "/calibrated_cluster.json";
  std::remove(out.c_str());
  const auto r = chorus::testing::run_command(
      chorus::testing::runfile("distributed/launcher/chorusrun") + " --nproc-per-node 2 --master-port " +
      std::to_string(chorus::testing::free_port()) + " " +
      chorus::testing::runfile("distributed/pipeline/planner/calibrate") +
      " --sizes 4096,262144 --repeats 3 --warmup 1 --memory-bytes-per-device 1000000000 --out " + out);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const Cluster c = load_cluster(out);
  REQUIRE(c.nodes == 1);
  REQUIRE(c.devices_per_node == 2);
  REQUIRE(c.memory_bytes_per_device == 1000000000);
  REQUIRE(c.intra_node_bytes_per_s > 0);
  REQUIRE(c.intra_node_allreduce_bytes_per_s > 0);
  REQUIRE(c.intra_node_latency_us >= 0);
  // Both allreduce fits are printed; the DDP bucket's is the one written.
  REQUIRE(r.output.find("the process group alone") != std::string::npos);
  REQUIRE(r.output.find("a DDP bucket as a step pays it: written to the cluster") != std::string::npos);
  // 2 processes x OMP_NUM_THREADS=1 (chorusrun's default here) against this machine's cores.
  REQUIRE(r.output.find("communication_overlaps_compute") != std::string::npos);
}
