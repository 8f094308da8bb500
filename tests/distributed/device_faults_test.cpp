// Device faults in multi-process jobs on sim devices (docs/reliability.md, "Device faults"): one
// rank runs out of device memory mid-training, or a task on its sim stream fails (an injected
// fault, sticky as CUDA's). Every rank must end on its own (no launcher stops them here) with a
// clear error within the timeout; under chorusrun the job exits non-zero, or with --max-restarts
// runs again and finishes. What each rank does is in dist_worker.cpp (oom_rank, stream_fault).
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/distributed/worker_launcher.h"

using chorus::testing::rank_log;
using chorus::testing::Result;
using chorus::testing::run_dist_workers;

namespace {

// The collectives' timeout in these jobs: every rank must end well within it (a dead peer is seen
// when its connections close, not at the timeout).
constexpr const char* kTimeout = "CHORUS_TIMEOUT_S=20";

struct Timed {
  Result r;
  double seconds;
};

Timed run_timed(int world, const std::vector<std::string>& args, const std::vector<std::string>& env) {
  const auto start = std::chrono::steady_clock::now();
  Result r = run_dist_workers(world, args, env, 90);
  return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

// Every rank ended by itself with an error (exit 1), none was killed for hanging, no check inside
// a worker failed, and each rank's log names what it should.
void require_all_failed(const Timed& t, const std::vector<std::vector<std::string>>& per_rank) {
  INFO(t.r.output);
  for (size_t rank = 0; rank < t.r.codes.size(); ++rank) {
    INFO("rank " << rank << " exit code " << t.r.codes[rank]);
    CHECK(t.r.codes[rank] == 1);
    const std::string log = rank_log(t.r, static_cast<int>(rank));
    for (const std::string& part : per_rank[rank]) CHECK_THAT(log, Catch::Contains(part));
  }
  CHECK(t.r.output.find("CHECK FAILED") == std::string::npos);
  CHECK(t.r.output.find("TIMED OUT") == std::string::npos);
}

struct Run {
  int code;
  std::string output;
  double seconds;
};

Run chorusrun(const std::string& args) {
  const auto start = std::chrono::steady_clock::now();
  // A port of its own: the default 29500 is taken when tests run side by side.
  const std::string cmd = chorus::testing::runfile("distributed/launcher/chorusrun") + " --master-port " +
                          std::to_string(chorus::testing::free_port()) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

std::string dist_worker() { return chorus::testing::runfile("tests/distributed/dist_worker"); }

}  // namespace

TEST_CASE("one rank of a DDP job on sim runs out of device memory: every rank ends with a clear error",
          "[distributed][faults][sim][oom]") {
  // 64 MiB sim devices: the MLP's steps fit; rank 1's batch at step 3, 400x larger, does not.
  const Timed t = run_timed(3, {"oom_rank", "1", "3"}, {"CHORUS_SIM_MEMORY_MB=64", kTimeout, "CHORUS_SIM_DRIVER_LOCK=1"});
  const std::vector<std::string> peer{"ended with an error in oom_rank", "on sim:0", "failed on the communication stream"};
  require_all_failed(t, {peer,
                         {"ended with an error in oom_rank: sim:0 out of memory: tried to allocate",
                          "of 64.00 MiB total", "cached but unallocated", "--batch-size"},
                         peer});
  // A few steps, the failed rank's exit and the others noticing: far below the 20 s timeout.
  CHECK(t.seconds < 20.0);
}

TEST_CASE("an injected failure on a rank's communication stream: the watchdog reports it and aborts the communicator; every rank ends",
          "[distributed][faults][sim]") {
  const Timed t = run_timed(3, {"stream_fault", "1", "comm"}, {kTimeout, "CHORUS_SIM_DRIVER_LOCK=1"});
  const std::vector<std::string> peer{"ended with an error in stream_fault", "allreduce #2 on sim:0",
                                      "failed on the communication stream"};
  require_all_failed(
      t, {peer,
          {// said by the watchdog thread itself, before the rank's own thread called into the group again
           "[rank 1] watchdog: gloo allreduce #2 on sim:0 (rank 1 of 3, timeout 20000 ms) failed on the communication "
           "stream: the device reported an error: sim: query_event on sim:0 failed",
           "injected stream failure", "aborting the communicator",
           "the watchdog failed the collective: gloo allreduce #2 on sim:0",
           // the next call into the group raises the same failure
           "ended with an error in stream_fault: gloo allreduce #2 on sim:0 (rank 1 of 3, timeout 20000 ms) failed on "
           "the communication stream: the device reported an error"},
          peer});
  CHECK(t.seconds < 20.0);
}

TEST_CASE("an injected failure on a rank's compute stream is raised at its next call (launch or synchronization); every rank ends",
          "[distributed][faults][sim]") {
  const Timed t = run_timed(2, {"stream_fault", "1", "compute"}, {kTimeout, "CHORUS_SIM_DRIVER_LOCK=1"});
  require_all_failed(t, {{"ended with an error in stream_fault", "allreduce #2 on sim:0", "failed on the communication stream"},
                         {"the compute side's next call raised: sim: ", "injected stream failure", "sticky"}});
  // And the device stays failed: the next collective raises the device's error, either from the
  // call that puts it on the stream or as the group's failure, when the watchdog met the error first
  // (querying whichever collective was still on its list, as PyTorch's watchdog meets a sticky CUDA
  // error); the message names the injected failure either way.
  const std::string log = rank_log(t.r, 1);
  const size_t end = log.find("ended with an error in stream_fault: ");
  REQUIRE(end != std::string::npos);
  CHECK_THAT(log.substr(end, log.find('\n', end) - end), Catch::Contains("injected stream failure"));
  CHECK(t.seconds < 20.0);
}

TEST_CASE("under chorusrun a device fault ends the job non-zero; with --max-restarts the job runs again and finishes",
          "[distributed][faults][sim][chorusrun]") {
  const std::string env = std::string("env ") + kTimeout + " CHORUS_SIM_DRIVER_LOCK=1 ";
  SECTION("stream failure") {
    Run once = chorusrun("--nproc-per-node 2 " + env + dist_worker() + " stream_fault 1 comm");
    INFO(once.output);
    CHECK(once.code == 1);
    CHECK_THAT(once.output, Catch::Contains("watchdog: gloo allreduce #2 on sim:0") &&
                                Catch::Contains("injected stream failure"));
    Run again = chorusrun("--nproc-per-node 2 --max-restarts 1 " + env + dist_worker() + " stream_fault 1 comm");
    INFO(again.output);
    CHECK(again.code == 0);
    CHECK_THAT(again.output, Catch::Contains("injected stream failure") && Catch::Contains("restarting the workers (1 of 1"));
    CHECK_THAT(again.output, Catch::Contains("rank 0 finished") && Catch::Contains("rank 1 finished"));
    CHECK(again.output.find("CHECK FAILED") == std::string::npos);
  }
  SECTION("out of memory") {
    const std::string oom = env + "CHORUS_SIM_MEMORY_MB=64 " + dist_worker() + " oom_rank 1 3";
    Run once = chorusrun("--nproc-per-node 2 " + oom);
    INFO(once.output);
    CHECK(once.code == 1);
    CHECK_THAT(once.output, Catch::Contains("sim:0 out of memory: tried to allocate"));
    // The restarted round stands for the run restarted with a smaller batch (dist_worker's oom_rank
    // trains without the big one when CHORUS_RESTART_COUNT > 0).
    Run again = chorusrun("--nproc-per-node 2 --max-restarts 1 " + oom);
    INFO(again.output);
    CHECK(again.code == 0);
    CHECK_THAT(again.output, Catch::Contains("out of memory") && Catch::Contains("restarting the workers (1 of 1"));
    CHECK_THAT(again.output, Catch::Contains("rank 0 finished") && Catch::Contains("rank 1 finished"));
  }
}
