// examples/pipeline as a user runs it: under chorusrun on the installed MNIST, with replicas given
// on the command line and with a plan file in the planner's schema; bad flags are refused.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/distributed/worker_launcher.h"

namespace {

using chorus::testing::runfile;

struct Run {
  int code;
  std::string output;
  nlohmann::json summary;
};

Run chorusrun(int procs, const std::string& flags) {
  const std::string cmd = runfile("distributed/launcher/chorusrun") + " --nproc-per-node " + std::to_string(procs) +
                          " --master-port " + std::to_string(chorus::testing::free_port()) + " " +
                          runfile("examples/pipeline/pipeline") + " --log-every 0 " + flags;
  const chorus::testing::CommandResult c = chorus::testing::run_command(cmd);
  const std::string& out = c.output;
  Run r{c.code, out, nullptr};
  const size_t at = out.rfind("{\"summary\":");
  if (at != std::string::npos) r.summary = nlohmann::json::parse(out.substr(at, out.find('\n', at) - at))["summary"];
  return r;
}

}  // namespace

TEST_CASE("pipeline example: 2+1 replicas under chorusrun learns MNIST", "[pipeline][examples]") {
  Run r = chorusrun(3, "--replicas 2,1 --micro-batches 4 --schedule gpipe --batch-size 64 --max-steps 40 "
                       "--test-limit 1000");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.summary["world_size"] == 3);
  CHECK(r.summary["stages"] == 2);
  CHECK(r.summary["steps"] == 40);
  CHECK(r.summary["rank0_max_in_flight"] == 4);  // GPipe: every micro-batch
  CHECK(r.summary["first_step_loss"].get<double>() > 2.0);  // ~ln 10 at the start
  CHECK(r.summary["last_step_loss"].get<double>() < 1.0);
  CHECK(r.summary["test_accuracy"].get<double>() > 0.7);
  CHECK(r.output.find("stage 1: recvA0 F0") != std::string::npos);  // the printed schedule
}

TEST_CASE("pipeline example: a plan file in the planner's schema", "[pipeline][examples]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/pipeline_example_plan.json";
  std::ofstream(path) << R"({"version":1,"num_layers":8,"global_batch":64,"micro_batches":2,"schedule":"1f1b",)"
                         R"("stages":[{"layers":[0,5],"ranks":[0]},{"layers":[5,8],"ranks":[1]}],"predicted":{"iteration_ms":9.5,"peak_memory_bytes":[1000,800],"pivot_stage":0}})";
  Run r = chorusrun(2, "--plan " + path + " --max-steps 20 --test-limit 500");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.summary["schedule"] == "1f1b");
  CHECK(r.summary["micro_batches"] == 2);
  CHECK(r.summary["batch_size"] == 64);
  CHECK(r.summary["rank0_max_in_flight"] == 2);
  CHECK(r.summary["last_step_loss"].get<double>() < r.summary["first_step_loss"].get<double>());
}

TEST_CASE("pipeline example: replicas that do not match the processes are refused", "[pipeline][examples]") {
  Run r = chorusrun(3, "--replicas 2,2 --max-steps 1");
  CHECK(r.code != 0);
  CHECK(r.output.find("--replicas 2,2 adds up to 4 processes, but 3 were started") != std::string::npos);
}
