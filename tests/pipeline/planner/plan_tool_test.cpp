// The `plan` tool as a user runs it: from profile and cluster files it writes a plan in the
// runtime's schema whose prediction is the cost model's; --evaluate predicts a given plan; bad
// input exits non-zero with the library's message.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "distributed/pipeline/planner/planner.h"
#include "tensor/error.h"

using namespace chorus::distributed::pipeline;
using namespace chorus::distributed::pipeline::planner;

namespace {

std::string tool() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return (srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/")) + "distributed/pipeline/planner/plan";
}

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// Runs `args` through the tool; returns its exit status and stdout + stderr.
std::pair<int, std::string> run(const std::string& args) {
  FILE* p = ::popen((tool() + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST_CASE("the plan tool writes the cost model's plan and evaluates given plans", "[planner][tool]") {
  ModelProfile profile;
  profile.batch = 4;
  for (int l = 0; l < 4; ++l) profile.layers.push_back({"l" + std::to_string(l), 5.0, 10.0, 1 << 20, 1000000000, -1});
  save_profile(profile, tmp("profile.json"));
  Cluster cluster;
  cluster.nodes = 2;
  cluster.devices_per_node = 2;
  cluster.intra_node_bytes_per_s = 1e11;
  cluster.inter_node_bytes_per_s = 1e9;
  cluster.memory_bytes_per_device = int64_t{1} << 40;
  {
    FILE* f = std::fopen(tmp("cluster.json").c_str(), "w");
    REQUIRE(f);
    std::fputs(cluster_to_json(cluster).c_str(), f);
    std::fclose(f);
  }
  const auto [rc, out] = run("--profile " + tmp("profile.json") + " --cluster " + tmp("cluster.json") +
                             " --global-batch 32 --micro-batches 8 --out " + tmp("plan.json"));
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(out.find("pure data parallelism (8 micro-batches)") != std::string::npos);
  const PipelinePlan plan = load_plan(tmp("plan.json"));
  const PlanResult expected = plan_dapple(profile, cluster, {.global_batch = 32, .micro_batches = 8});
  REQUIRE(plan.str() == expected.plan.str());
  REQUIRE(plan.predicted->iteration_ms == Approx(predict(plan, profile, cluster).iteration_ms).epsilon(1e-9));
  REQUIRE(plan.predicted->peak_memory_bytes == expected.prediction.peak_memory_bytes());

  // --evaluate on pure DP prints its (much larger) prediction.
  save_plan(data_parallel_plan(4, cluster, 32, 8), tmp("dp.json"));
  const auto [rc2, out2] = run("--profile " + tmp("profile.json") + " --cluster " + tmp("cluster.json") +
                               " --evaluate " + tmp("dp.json"));
  INFO(out2);
  REQUIRE(rc2 == 0);
  const double dp_ms = predict(data_parallel_plan(4, cluster, 32, 8), profile, cluster).iteration_ms;
  REQUIRE(out2.find(fmt::format("iteration {:.2f} ms", dp_ms)) != std::string::npos);

  const auto [rc3, out3] = run("--profile " + tmp("profile.json") + " --cluster " + tmp("cluster.json") +
                               " --global-batch 30 --micro-batches 8");
  REQUIRE(rc3 == 1);
  REQUIRE(out3.find("global batch 30 is not divisible by micro_batches 8") != std::string::npos);
  const auto [rc4, out4] = run("--profile " + tmp("missing.json") + " --cluster " + tmp("cluster.json") +
                               " --global-batch 32");
  REQUIRE(rc4 == 1);
  REQUIRE(out4.find("cannot open \"" + tmp("missing.json") + "\"") != std::string::npos);
}
