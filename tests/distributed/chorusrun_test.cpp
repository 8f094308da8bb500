// chorusrun as a user runs it: workers get torchrun's environment, every output line carries its
// rank, a failing worker stops the others and its exit code becomes chorusrun's, signals reach the
// workers, the launchers of several nodes restart together, only the job's processes get into its
// store (the job token), and bad usage is refused.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/store.h"
#include "tests/distributed/worker_launcher.h"

namespace {

std::string launcher() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return (srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/")) + "distributed/launcher/chorusrun";
}

// Waits until the file at `path` contains every one of `needles` (the workers said they are
// ready), polling; false after `limit_s` (a bound only a hang can reach). What the tests wait for
// is the event itself, never a fixed sleep that a loaded machine can outlast.
bool wait_for_text(const std::string& path, const std::vector<std::string>& needles, double limit_s = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  for (;;) {
    const std::string text = chorus::testing::slurp(path);
    bool all = true;
    for (const std::string& n : needles) all = all && text.find(n) != std::string::npos;
    if (all) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct Run {
  int code;
  std::string output;  // stdout and stderr together
  double seconds;
};

// `env` ("NAME=VALUE ..."): chorusrun's own environment. A single-node job without --master-port gets
// a free one: chorusrun's default, 29500, is every such job's, so two of them at once (this test run
// beside itself: --runs_per_test, tools/flake_check.sh) met at one store, one failing "cannot bind
// port 29500" and the other's workers refused by a store of another job's token.
Run run_env(const std::string& env, const std::string& args) {
  const auto start = std::chrono::steady_clock::now();
  const bool own_port = args.find("--master-port") == std::string::npos && args.find("--nnodes") == std::string::npos &&
                        args.find("--standalone") == std::string::npos;
  const std::string port = own_port ? "--master-port " + std::to_string(chorus::testing::free_port()) + " " : "";
  const std::string cmd =
      (env.empty() ? std::string() : "env " + env + " ") + launcher() + " " + port + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed: " + cmd, 0.0};  // (no Catch2 macro: two_at_once calls it from a thread)
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

Run run(const std::string& args) { return run_env("", args); }

}  // namespace

TEST_CASE("chorusrun gives each worker torchrun's environment and prefixes its lines", "[distributed][chorusrun]") {
  Run r = run("--nproc-per-node 3 --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 31234 "
              "bash -c 'echo \"env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT\"; "
              "echo \"err $RANK\" >&2'");
  INFO(r.output);
  CHECK(r.code == 0);
  for (int local = 0; local < 3; ++local) {
    const int rank = 3 + local;
    CHECK_THAT(r.output, Catch::Contains("[" + std::to_string(rank) + "]: env " + std::to_string(rank) + " " +
                                         std::to_string(local) + " 6 3 1 10.1.2.3 31234"));
    CHECK_THAT(r.output, Catch::Contains("[" + std::to_string(rank) + "]: err " + std::to_string(rank)));
  }
}

TEST_CASE("a failing worker stops the others and its exit code is chorusrun's", "[distributed][chorusrun]") {
  Run r = run("--nproc-per-node 3 --grace-period 5 bash -c "
              "'if [ $RANK = 1 ]; then sleep 0.7; exit 7; fi; trap \"echo stopped $RANK; exit 0\" TERM; sleep 60 & wait'");
  INFO(r.output);
  CHECK(r.code == 7);
  CHECK(r.seconds < 20);
  CHECK_THAT(r.output, Catch::Contains("worker rank 1") && Catch::Contains("exited with code 7"));
  CHECK_THAT(r.output, Catch::Contains("[0]: stopped 0") && Catch::Contains("[2]: stopped 2"));
  // A worker that ignores SIGTERM is killed after the grace period.
  Run k = run("--nproc-per-node 2 --grace-period 1 bash -c "
              "'if [ $RANK = 0 ]; then sleep 0.7; exit 3; fi; trap \"\" TERM; while :; do sleep 0.2; done'");
  INFO(k.output);
  CHECK(k.code == 3);
  CHECK(k.seconds < 15);
  CHECK_THAT(k.output, Catch::Contains("SIGKILL"));
}

TEST_CASE("--max-restarts starts every worker again with CHORUS_RESTART_COUNT, then gives up", "[distributed][chorusrun]") {
  // Rank 1 fails in every round; the others are stopped and all start again, twice.
  Run r = run("--nproc-per-node 2 --max-restarts 2 --grace-period 2 bash -c "
              "'echo \"start $RANK $CHORUS_RESTART_COUNT\"; if [ $RANK = 1 ]; then sleep 0.3; exit 5; fi; "
              "trap \"exit 0\" TERM; sleep 30 & wait'");
  INFO(r.output);
  CHECK(r.code == 5);
  CHECK(r.seconds < 20);
  for (int round = 0; round <= 2; ++round)
    for (int rank = 0; rank < 2; ++rank)
      CHECK_THAT(r.output, Catch::Contains("[" + std::to_string(rank) + "]: start " + std::to_string(rank) + " " +
                                           std::to_string(round)));
  CHECK_THAT(r.output, Catch::Contains("restarting the workers (1 of 2") && Catch::Contains("(2 of 2") &&
                           Catch::Contains("giving up after 2 restart(s)"));
  CHECK(r.output.find("start 0 3") == std::string::npos);
  // A job that succeeds after a failure ends with 0: rank 0 fails only in round 0.
  Run ok = run("--nproc-per-node 2 --max-restarts 3 bash -c "
               "'if [ $RANK = 0 ] && [ $CHORUS_RESTART_COUNT = 0 ]; then exit 9; fi; sleep 0.2; echo done $RANK'");
  INFO(ok.output);
  CHECK(ok.code == 0);
  CHECK_THAT(ok.output, Catch::Contains("[0]: done 0") && Catch::Contains("restarting the workers (1 of 3"));
  CHECK(ok.output.find("(2 of 3") == std::string::npos);
  // Without the flag, no restart (torchrun's default).
  Run once = run("--nproc-per-node 1 bash -c 'echo round $CHORUS_RESTART_COUNT; exit 4'");
  CHECK(once.code == 4);
  CHECK(once.output.find("restarting") == std::string::npos);
}

TEST_CASE("SIGTERM to chorusrun reaches every worker", "[distributed][chorusrun]") {
  const std::string out = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/chorusrun_sig.log";
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen(out.c_str(), "w");
    ::dup2(fileno(f), STDOUT_FILENO);
    ::dup2(fileno(f), STDERR_FILENO);
    const std::string exe = launcher();
    ::execl(exe.c_str(), exe.c_str(), "--nproc-per-node", "2", "bash", "-c",
            "trap 'echo got TERM $RANK; exit 0' TERM; echo ready $RANK; sleep 60 & wait", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Both workers have set their trap once they print "ready".
  CHECK(wait_for_text(out, {"[0]: ready 0", "[1]: ready 1"}));
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  FILE* f = std::fopen(out.c_str(), "r");
  std::string log;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), f)) log.append(buf.data(), n);
  std::fclose(f);
  INFO(log);
  CHECK_THAT(log, Catch::Contains("[0]: got TERM 0") && Catch::Contains("[1]: got TERM 1"));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
}

namespace {

std::string tmpdir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

// Alive and not a zombie (an orphan's zombie may linger where nothing reaps it).
bool alive(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char state = '?';
  const int got = std::fscanf(f, "%*d %*s %c", &state);
  std::fclose(f);
  return got == 1 && state != 'Z' && state != 'X';
}

// Polls until none of `pids` is alive; false if one still is after `limit_s` (only a worker that
// outlives its launcher stays that long: they die by the kernel's parent-death signal).
bool all_gone(const std::vector<pid_t>& pids, double limit_s = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  for (;;) {
    bool any = false;
    for (pid_t w : pids) any = any || alive(w);
    if (!any) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<pid_t> read_pids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    FILE* f = std::fopen((dir + "/pid" + std::to_string(i)).c_str(), "r");
    if (!f) continue;
    int pid = 0;
    if (std::fscanf(f, "%d", &pid) == 1) pids.push_back(pid);
    std::fclose(f);
  }
  return pids;
}

}  // namespace

TEST_CASE("workers die with chorusrun even when it is killed with SIGKILL", "[distributed][chorusrun]") {
  const std::string dir = tmpdir() + "/chorusrun_kill9";
  REQUIRE(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) == 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    const std::string exe = launcher(), script = "echo $$ > " + dir + "/pid$LOCAL_RANK; exec sleep 60";
    ::execl(exe.c_str(), exe.c_str(), "--nproc-per-node", "3", "bash", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::vector<pid_t> workers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (workers.size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    workers = read_pids(dir, 3);
  }
  REQUIRE(workers.size() == 3);
  for (pid_t w : workers) CHECK(alive(w));
  ::kill(pid, SIGKILL);  // no chance to forward anything
  ::waitpid(pid, nullptr, 0);
  CHECK(all_gone(workers));
  for (pid_t w : workers) ::kill(w, SIGKILL);  // (nothing left to kill when the check passed)
}

TEST_CASE("a worker that cannot be started stops the ones already running", "[distributed][chorusrun]") {
  // With 24 file descriptors, the pipes for the 12 workers run out part-way through the start.
  const std::string dir = tmpdir() + "/chorusrun_nofile";
  REQUIRE(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) == 0);
  const std::string cmd = "bash -c 'ulimit -n 24; exec " + launcher() +
                          " --nproc-per-node 12 bash -c \"echo \\$\\$ > " + dir + "/pid\\$LOCAL_RANK; exec sleep 60\"' 2>&1";
  const auto start = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(out);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) != 0);
  CHECK_THAT(out, Catch::Contains("cannot start worker"));
  CHECK(seconds < 20);
  const std::vector<pid_t> started = read_pids(dir, 12);
  CHECK(all_gone(started));
  for (pid_t w : started) ::kill(w, SIGKILL);
}

namespace {

// Runs one chorusrun per node (`nodes` of them, on this machine) at once, each with `flags` plus its
// --node-rank, and returns each node's exit code and output; `during` runs while they do, with the
// launchers' pids.
struct NodeRun {
  std::vector<int> codes;
  std::vector<std::string> outputs;
  double seconds;
};
NodeRun run_nodes(int nodes, const std::string& flags, const std::string& script,
                  const std::function<void(const std::vector<pid_t>&)>& during = {},
                  const std::function<std::string(int node)>& env_of = {}) {
  const std::string dir = tmpdir();
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int node = 0; node < nodes; ++node) {
    const std::string log = dir + "/node" + std::to_string(node) + ".log";
    pid_t pid = ::fork();
    if (pid == 0) {
      FILE* f = std::fopen(log.c_str(), "w");
      ::dup2(fileno(f), STDOUT_FILENO);
      ::dup2(fileno(f), STDERR_FILENO);
      const std::string cmd = "exec " + (env_of ? "env " + env_of(node) + " " : std::string()) + launcher() + " --nnodes " + std::to_string(nodes) + " --node-rank " +
                              std::to_string(node) + " " + flags + " bash -c '" + script + "'";
      ::execl("/bin/bash", "bash", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  if (during) during(pids);
  NodeRun r;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    r.codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int node = 0; node < nodes; ++node) r.outputs.push_back(chorus::testing::slurp(dir + "/node" + std::to_string(node) + ".log"));
  return r;
}

std::string node_flags(int extra_restarts) {
  return "--nproc-per-node 2 --grace-period 2 --rdzv-timeout 20 --rdzv-port " +
         std::to_string(chorus::testing::free_port()) + " --max-restarts " + std::to_string(extra_restarts);
}

}  // namespace

TEST_CASE("the launchers of several nodes restart together through their rendezvous", "[distributed][chorusrun]") {
  // Node 1's first worker fails in round 0 only; node 0's workers would sleep for a minute: they
  // are stopped within the poll interval and every worker of both nodes starts round 1.
  const std::string script =
      "echo start $RANK $CHORUS_RESTART_COUNT; if [ $RANK = 2 ] && [ $CHORUS_RESTART_COUNT = 0 ]; then sleep 1; exit 5; fi; "
      "if [ $CHORUS_RESTART_COUNT = 0 ]; then trap \"echo stopped $RANK; exit 0\" TERM; sleep 60 & wait; fi; echo done $RANK";
  NodeRun r = run_nodes(2, node_flags(2), script);
  INFO("node 0:\n" << r.outputs[0] << "\nnode 1:\n" << r.outputs[1]);
  CHECK(r.codes == std::vector<int>{0, 0});
  CHECK(r.seconds < 20);
  CHECK_THAT(r.outputs[0], Catch::Contains("[0]: stopped 0") && Catch::Contains("[1]: stopped 1") &&
                               Catch::Contains("worker rank 2 on node 1 exited with code 5"));
  for (int node = 0; node < 2; ++node) {
    CHECK_THAT(r.outputs[node], Catch::Contains("restarting the workers of all 2 nodes (1 of 2"));
    for (int local = 0; local < 2; ++local) {
      const std::string rank = std::to_string(2 * node + local);
      CHECK_THAT(r.outputs[node], Catch::Contains("[" + rank + "]: start " + rank + " 1") &&
                                      Catch::Contains("[" + rank + "]: done " + rank));
    }
    CHECK(r.outputs[node].find("(2 of 2") == std::string::npos);
  }

  // A worker that fails in every round: both nodes give up after the last restart, non-zero.
  NodeRun g = run_nodes(2, node_flags(1),
                        "echo start $RANK $CHORUS_RESTART_COUNT; if [ $RANK = 3 ]; then sleep 0.5; exit 6; fi; "
                        "trap \"exit 0\" TERM; sleep 60 & wait");
  INFO("node 0:\n" << g.outputs[0] << "\nnode 1:\n" << g.outputs[1]);
  CHECK(g.codes[0] != 0);
  CHECK(g.codes[1] == 6);
  CHECK(g.seconds < 20);
  for (int node = 0; node < 2; ++node) {
    CHECK_THAT(g.outputs[node], Catch::Contains("giving up after 1 restart(s)"));
    CHECK(g.outputs[node].find(" start " + std::to_string(2 * node) + " 2") == std::string::npos);
  }
}

TEST_CASE("a signal to one node's launcher ends the job on every node, without a restart", "[distributed][chorusrun]") {
  NodeRun r = run_nodes(2, node_flags(3), "echo ready $RANK $CHORUS_RESTART_COUNT; trap \"echo got TERM $RANK; exit 0\" TERM; sleep 60 & wait",
                        [](const std::vector<pid_t>& pids) {
                          // Every worker of both nodes has set its trap once it prints "ready".
                          const std::string dir = tmpdir();
                          CHECK(wait_for_text(dir + "/node0.log", {"ready 0 0", "ready 1 0"}));
                          CHECK(wait_for_text(dir + "/node1.log", {"ready 2 0", "ready 3 0"}));
                          ::kill(pids[1], SIGTERM);
                        });
  INFO("node 0:\n" << r.outputs[0] << "\nnode 1:\n" << r.outputs[1]);
  CHECK(r.codes[1] == 128 + SIGTERM);
  CHECK(r.codes[0] != 0);
  CHECK(r.seconds < 20);
  CHECK_THAT(r.outputs[0], Catch::Contains("got signal 15") && Catch::Contains("[0]: got TERM 0"));
  CHECK(r.outputs[0].find("restarting") == std::string::npos);
  CHECK(r.outputs[1].find("restarting") == std::string::npos);
}

TEST_CASE("a node whose peers never come says so after --rdzv-timeout", "[distributed][chorusrun]") {
  const auto start = std::chrono::steady_clock::now();
  Run r = run("--nnodes 2 --node-rank 0 --max-restarts 1 --rdzv-timeout 1 --rdzv-port " +
              std::to_string(chorus::testing::free_port()) + " true");
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("only 1 of 2 nodes joined within 1 s"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

// Heartbeats (distributed/heartbeat.h) end a job whose rank stopped (SIGSTOP) in seconds, naming
// it, where the collective's timeout would take 300 s; chorusrun's SIGTERM reaches the stopped rank
// (SIGCONT follows it), and --max-restarts starts the job again.
std::string dist_worker() { return chorus::testing::runfile("tests/distributed/dist_worker"); }

TEST_CASE("a stopped rank is named by the heartbeats and the job ends within 30 s (default settings)",
          "[distributed][chorusrun][heartbeat]") {
  Run r = run("--nproc-per-node 3 " + dist_worker() + " heartbeat_stop 2");
  INFO(r.output);
  CHECK(r.code == 75);  // kHeartbeatExitCode, from the first rank that reported
  CHECK_THAT(r.output, Catch::Contains("rank 2 stops itself") &&
                           Catch::Contains("heartbeat: rank 2 has sent no heartbeat for") &&
                           Catch::Contains("(3 intervals of 5.0 s)"));
  CHECK(r.output.find("rank 0 finished") == std::string::npos);
  // 3 intervals of 5 s, up to one more before the watcher looks, and the stopped rank's SIGTERM:
  // 20.5 s measured by hand in -c opt (docs/reliability.md); the bound leaves room for sanitizer
  // builds of 3 workers on a loaded 2-core machine, and is far below the collective's 300 s.
  CHECK(r.seconds <= 45.0);
  CHECK(r.seconds >= 15.0);  // not before the 3 missed intervals
}

TEST_CASE("a stopped store host (rank 0) is named, and --max-restarts runs the job again",
          "[distributed][chorusrun][heartbeat]") {
  Run r = run("--nproc-per-node 3 --max-restarts 1 env CHORUS_HEARTBEAT_S=0.5 " + dist_worker() + " heartbeat_stop 0");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("rank 0 stops itself") &&
                           Catch::Contains("heartbeat: the job's store (hosted by rank 0) has not answered for") &&
                           Catch::Contains("restarting the workers (1 of 1"));
  for (int rank = 0; rank < 3; ++rank) CHECK_THAT(r.output, Catch::Contains("rank " + std::to_string(rank) + " finished"));
  CHECK(r.seconds < 30.0);
  // Off: the same stop is left to the collective's timeout (here 4 s), which names the collective.
  Run off = run("--nproc-per-node 2 env CHORUS_HEARTBEAT_S=0 CHORUS_TIMEOUT_S=4 " + dist_worker() + " heartbeat_stop 1");
  INFO(off.output);
  CHECK(off.code != 0);
  CHECK(off.output.find("heartbeat:") == std::string::npos);
  CHECK_THAT(off.output, Catch::Contains("allreduce"));
  // A malformed setting stops the job before it starts, naming the variable.
  Run bad = run("--nproc-per-node 2 env CHORUS_HEARTBEAT_S=soon " + dist_worker() + " heartbeat_stop 1");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("CHORUS_HEARTBEAT_S='soon': expected the heartbeat interval in seconds"));
}

// The flight recorder (distributed/flight_recorder.h): a timed-out collective's error says which
// ranks never entered it or entered another one, from every rank's records; chorus_flight prints
// the dumps as a table; SIGUSR1 to chorusrun makes every worker write its dump and go on.
std::string tmp_prefix(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

Run flight_table(const std::string& files) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string exe = (srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/")) +
                          "distributed/launcher/chorus_flight";
  FILE* p = ::popen((exe + " " + files + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, 0};
}

// 3 ranks of dist_worker `scenario`, their dumps under `prefix`. The timeout (6 s) is also the
// rendezvous': room for sanitizer builds of 3 workers starting on 2 cores. The exchange waits up to
// 60 s (it ends as soon as every record is in): a late heartbeat on a loaded machine must not turn
// "never entered" into "sent no record".
Run flight_job(const std::string& scenario, const std::string& prefix) {
  return run("--nproc-per-node 3 env CHORUS_TIMEOUT_S=6 CHORUS_HEARTBEAT_S=1 CHORUS_FLIGHT_RECORDER_WAIT_S=60 "
             "CHORUS_FLIGHT_RECORDER_FILE=" + prefix + " " + dist_worker() + " " + scenario);
}

TEST_CASE("a rank that skipped a collective is named in the timeout's desync report", "[distributed][chorusrun][flight]") {
  const std::string prefix = tmp_prefix("skip_rank_");
  Run r = flight_job("flight_skip", prefix);
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("rank 1 waits outside any collective"));
  for (int rank : {0, 2}) {
    const std::string p = "[" + std::to_string(rank) + "]: ";
    CHECK_THAT(r.output, Catch::Contains(p + "rank " + std::to_string(rank) + ": collective failed: ProcessGroupGloo "
                                             "allreduce(sum) (sequence number 2, rank " + std::to_string(rank) + " of 3, timeout 6000 ms)"));
    CHECK_THAT(r.output, Catch::Contains("desync report (flight recorder) for collective #2 of group default_pg, "
                                         "allreduce(sum) float32[4] on this rank (rank " + std::to_string(rank) +
                                         "): rank(s) 1 never entered it"));
    CHECK_THAT(r.output, Catch::Contains(p + "  rank 1 never entered collective #2: its last is #1 allreduce(sum) "
                                             "float32[4] (finished)"));
    CHECK_THAT(r.output, Catch::Contains(p + "flight recorder dump: " + prefix + std::to_string(rank) + ".json"));
  }
  CHECK_THAT(r.output, Catch::Contains("[0]:   rank 2 entered #2 too") && Catch::Contains("[2]:   rank 0 entered #2 too"));
  // Rank 1's heartbeat wrote its dump when asked; the table shows where the ranks part.
  Run table = flight_table(prefix + "0.json " + prefix + "1.json " + prefix + "2.json");
  INFO(table.output);
  CHECK(table.code == 0);
  CHECK_THAT(table.output, Catch::Contains("rank 1: pid") && Catch::Contains("dumped because: asked by rank"));
  CHECK_THAT(table.output, Catch::Contains("-- not entered") && Catch::Contains("<-- not every rank entered"));
  CHECK(table.output.find("<-- ranks differ") == std::string::npos);
}

TEST_CASE("a rank that issued a different collective is named on every rank", "[distributed][chorusrun][flight]") {
  const std::string prefix = tmp_prefix("mismatch_rank_");
  Run r = flight_job("flight_mismatch", prefix);
  INFO(r.output);
  CHECK(r.code == 1);
  // Every rank timed out, and each report names the other side's collective.
  for (int rank : {0, 2}) {
    const std::string p = "[" + std::to_string(rank) + "]: ";
    CHECK_THAT(r.output, Catch::Contains(p + "desync report (flight recorder) for collective #1 of group default_pg, "
                                             "allreduce(sum) float32[4] on this rank (rank " + std::to_string(rank) +
                                             "): rank(s) 1 entered a different one"));
    CHECK_THAT(r.output, Catch::Contains(p + "  rank 1 entered a different collective as #1: broadcast(root=0) "
                                             "float32[4]"));
  }
  CHECK_THAT(r.output, Catch::Contains("[1]: desync report (flight recorder) for collective #1 of group default_pg, "
                                       "broadcast(root=0) float32[4] on this rank (rank 1): rank(s) 0, 2 entered a "
                                       "different one"));
  CHECK_THAT(r.output, Catch::Contains("[1]:   rank 0 entered a different collective as #1: allreduce(sum) float32[4]"));
  Run table = flight_table(prefix + "0.json " + prefix + "1.json " + prefix + "2.json");
  INFO(table.output);
  CHECK(table.code == 0);
  CHECK_THAT(table.output, Catch::Contains("broadcast(root=0) float32[4]") && Catch::Contains("<-- ranks differ"));
}

TEST_CASE("SIGUSR1 to chorusrun makes every worker write its flight-recorder dump", "[distributed][chorusrun][flight]") {
  const std::string prefix = tmp_prefix("signal_rank_");
  const std::string out = tmp_prefix("chorusrun_usr1.log");
  const std::string worker = dist_worker();
  const std::string variable = "CHORUS_FLIGHT_RECORDER_FILE=" + prefix;
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen(out.c_str(), "w");
    ::dup2(fileno(f), STDOUT_FILENO);
    ::dup2(fileno(f), STDERR_FILENO);
    const std::string exe = launcher();
    ::execl(exe.c_str(), exe.c_str(), "--nproc-per-node", "2", "env", variable.c_str(), worker.c_str(), "flight_signal",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  CHECK(wait_for_text(out, {"[0]: rank 0 ready for SIGUSR1", "[1]: rank 1 ready for SIGUSR1"}));
  ::kill(pid, SIGUSR1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string log = chorus::testing::slurp(out);
  INFO(log);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_THAT(log, Catch::Contains("[0]: chorus: flight recorder dump written to " + prefix + "0.json") &&
                      Catch::Contains("[1]: rank 1 found its dump"));
  Run table = flight_table(prefix + "0.json " + prefix + "1.json");
  INFO(table.output);
  CHECK(table.code == 0);
  CHECK_THAT(table.output, Catch::Contains("dumped because: SIGUSR1"));
  for (int seq = 0; seq < 3; ++seq) {
    CHECK_THAT(table.output, Catch::Contains("default_pg  " + std::to_string(seq) +
                                             "  allreduce(sum) float32[4] [finished]  allreduce(sum) float32[4] [finished]"));
  }
  const size_t barrier = table.output.find("default_pg  3  barrier [finished]");
  CHECK(barrier != std::string::npos);
  CHECK(table.output.find("  barrier [finished]\n", barrier) != std::string::npos);  // rank 1's column
  CHECK(table.output.find("<--") == std::string::npos);
  // Not a dump: refused naming the file and what was expected.
  Run bad = flight_table(out);
  CHECK(bad.code == 2);
  CHECK_THAT(bad.output, Catch::Contains("flight recorder dump " + out + ": not JSON") &&
                             Catch::Contains("expected a chorus flight-recorder dump"));
}

// [Job token] (chorusrun.cpp, distributed/store_auth.h): a job whose store lets in only its own
// processes. `flags` are chorusrun's; while its 2 workers wait (dist_worker store_guard), `visit`
// runs with the store's port and the log, then the workers are told to finish.
struct GuardedJob {
  int code;
  std::string output, token_file;
};
GuardedJob guarded_job(const std::string& flags, const std::function<void(int port, const std::string& log)>& visit) {
  const std::string dir = tmpdir() + "/guarded";
  REQUIRE(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) == 0);
  const std::string log = dir + "/job.log", go = dir + "/go";
  const int port = chorus::testing::free_port();
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    ::dup2(fileno(f), STDOUT_FILENO);
    ::dup2(fileno(f), STDERR_FILENO);
    const std::string cmd = "exec " + launcher() + " --nproc-per-node 2 --master-port " + std::to_string(port) + " " +
                            flags + " " + dist_worker() + " store_guard " + go;
    ::execl("/bin/bash", "bash", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const bool up = wait_for_text(log, {"store_guard: store up on port"});
  GuardedJob job;
  const std::string said = chorus::testing::slurp(log);
  const size_t at = said.find("token file ");
  if (at != std::string::npos) job.token_file = said.substr(at + 11, said.find('\n', at) - at - 11);
  if (up) visit(port, log);
  std::ofstream(go) << "go\n";
  int status = 0;
  ::waitpid(pid, &status, 0);
  job.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  job.output = chorus::testing::slurp(log);
  INFO(job.output);
  REQUIRE(up);
  return job;
}

// A process that is not the job's knocking at its store: chorus::Error, whose text is returned
// ("" if it got in).
std::string knock(int port, const std::string& token) {
  try {
    chorus::distributed::TCPStore visitor("127.0.0.1", port, {.timeout = std::chrono::milliseconds(10000), .job_token = token});
    visitor.set("visitor_was_here", "yes");
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
}

TEST_CASE("a one-node job gets a token of its own: its store, on loopback only, refuses other processes while the "
          "job finishes",
          "[distributed][chorusrun][job_token]") {
  std::string no_token, wrong_token;
  std::vector<std::string> listening;
  unsigned file_mode = 0, dir_mode = 0;
  std::string token_file;
  GuardedJob job = guarded_job("", [&](int port, const std::string& log) {
    no_token = knock(port, "");
    wrong_token = knock(port, "a guess");
    listening = chorus::testing::listening_addresses(port);
    const std::string said = chorus::testing::slurp(log);
    const size_t at = said.find("token file ");
    token_file = said.substr(at + 11, said.find('\n', at) - at - 11);
    file_mode = mode_of(token_file);
    dir_mode = mode_of(std::filesystem::path(token_file).parent_path().string());
  });
  INFO(job.output);
  CHECK(job.code == 0);
  CHECK_THAT(no_token, Catch::Contains("refused this process: wrong or missing job token"));
  CHECK_THAT(wrong_token, Catch::Contains("refused this process: wrong or missing job token"));
  CHECK(listening == std::vector<std::string>{"0100007F"});  // 127.0.0.1 only
  // The workers got a path, to a file only this user can read, gone when chorusrun is.
  CHECK(file_mode == 0600);
  CHECK(dir_mode == 0700);
  CHECK_FALSE(std::filesystem::exists(token_file));
  CHECK_THAT(job.output, Catch::Contains("[0]: store: refused a client from 127.0.0.1:") &&
                             Catch::Contains("it has no job token") && Catch::Contains("wrong job token"));
  CHECK_THAT(job.output, Catch::Contains("[0]: rank 0 finished") && Catch::Contains("[1]: rank 1 finished"));
}

TEST_CASE("--job-token-file: the job's store lets in the file's holders only; a bad file stops chorusrun before "
          "any worker, saying what it found",
          "[distributed][chorusrun][job_token]") {
  const std::string token = tmpdir() + "/job_token_good";
  std::filesystem::remove(token);
  std::ofstream(token) << "the token of this job\n";
  REQUIRE(::chmod(token.c_str(), 0600) == 0);
  std::string holder = "not run", stranger;
  GuardedJob job = guarded_job("--job-token-file " + token, [&](int port, const std::string&) {
    holder = knock(port, "the token of this job");
    stranger = knock(port, "the token of another job");
  });
  INFO(job.output);
  CHECK(job.code == 0);
  CHECK(holder.empty());
  CHECK_THAT(stranger, Catch::Contains("refused this process"));
  CHECK(job.token_file == std::filesystem::absolute(token).string());
  CHECK_THAT(job.output, Catch::Contains("wrong job token") && Catch::Contains("[1]: rank 1 finished"));

  auto refused = [](const std::string& content, mode_t mode, const std::string& name) {
    const std::string path = tmpdir() + "/" + name;
    std::filesystem::remove(path);
    std::ofstream(path) << content;
    ::chmod(path.c_str(), mode);
    return path;
  };
  const std::string open_file = refused("secret\n", 0644, "job_token_0644");
  Run r = run("--nproc-per-node 1 --job-token-file " + open_file + " bash -c 'echo started'");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains(open_file) && Catch::Contains("has mode 0644") &&
                           Catch::Contains("expected mode 0600 or 0400"));
  CHECK(r.output.find("started") == std::string::npos);
  const std::string empty = refused("", 0600, "job_token_empty");
  Run e = run("--nproc-per-node 1 --job-token-file " + empty + " bash -c 'echo started'");
  CHECK(e.code == 2);
  CHECK_THAT(e.output, Catch::Contains(empty) && Catch::Contains("is empty (0 bytes)"));
  Run m = run("--nproc-per-node 1 --job-token-file " + tmpdir() + "/no_such_token bash -c 'echo started'");
  CHECK(m.code == 2);
  CHECK_THAT(m.output, Catch::Contains("no_such_token") && Catch::Contains("No such file or directory"));
  Run twice = run_env("CHORUS_JOB_TOKEN=x", "--nproc-per-node 1 --job-token-file " + token + " true");
  CHECK(twice.code == 2);
  CHECK_THAT(twice.output, Catch::Contains("the job token is given more than once"));
}

TEST_CASE("the launchers of several nodes meet only with the same token", "[distributed][chorusrun][job_token]") {
  const std::string script = "echo ran $RANK";
  NodeRun same = run_nodes(2, node_flags(1), script, {}, [](int) { return std::string("CHORUS_JOB_TOKEN=shared-secret"); });
  INFO("node 0:\n" << same.outputs[0] << "\nnode 1:\n" << same.outputs[1]);
  CHECK(same.codes == std::vector<int>{0, 0});
  CHECK(same.outputs[0].find("no job token") == std::string::npos);
  const std::string quick = "--nproc-per-node 2 --grace-period 2 --rdzv-timeout 3 --max-restarts 1 --rdzv-port " +
                            std::to_string(chorus::testing::free_port());
  NodeRun differ = run_nodes(2, quick, script, {},
                             [](int node) { return "CHORUS_JOB_TOKEN=secret-" + std::to_string(node); });
  INFO("node 0:\n" << differ.outputs[0] << "\nnode 1:\n" << differ.outputs[1]);
  CHECK(differ.codes[1] == 1);
  CHECK_THAT(differ.outputs[1], Catch::Contains("cannot reach the rendezvous") &&
                                    Catch::Contains("refused this process: wrong or missing job token"));
  CHECK_THAT(differ.outputs[0], Catch::Contains("store: refused a client from") && Catch::Contains("wrong job token"));
  CHECK(differ.codes[0] != 0);  // alone: only 1 of 2 nodes joined
  // Without a token the launchers say what that means.
  NodeRun none = run_nodes(2, node_flags(1), script);
  CHECK(none.codes == std::vector<int>{0, 0});
  CHECK_THAT(none.outputs[0], Catch::Contains("no job token") && Catch::Contains("lets in any process"));
}

// [Standalone] (chorusrun.cpp): two one-node jobs started at once, neither given a port. With
// --standalone each gets a store of its own and both pass their collectives; without it both take
// 29500 and one fails to bind it (the control: what --standalone is for).
TEST_CASE("--standalone: one-node jobs started at once each get a free port, where without it they meet at 29500",
          "[distributed][chorusrun]") {
  // Every worker of both jobs waits at a barrier of files (bounded: 60 s, in case the other job
  // never starts) before its collectives, so the two jobs' stores are up at the same time.
  const char* tmp = std::getenv("TEST_TMPDIR");
  auto two_at_once = [&](const std::string& flags, const std::string& name) {
    const std::string dir = std::string(tmp ? tmp : "/tmp") + "/standalone_" + name + "_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    auto job = [&](const std::string& id) {
      return run_env("", flags + "--nproc-per-node 2 bash -c 'echo \"port $MASTER_PORT addr $MASTER_ADDR\"; touch " + dir +
                             "/" + id + "$RANK; for i in $(seq 6000); do [ $(ls " + dir +
                             " | wc -l) -ge 4 ] && break; sleep 0.01; done; exec " + dist_worker() + " collectives'");
    };
    std::array<Run, 2> runs;
    std::thread other([&] { runs[1] = job("b"); });
    runs[0] = job("a");
    other.join();
    std::filesystem::remove_all(dir);
    return runs;
  };
  const std::array<Run, 2> alone = two_at_once("--standalone ", "alone");
  std::array<std::string, 2> ports;
  for (int j = 0; j < 2; ++j) {
    INFO(alone[j].output);
    CHECK(alone[j].code == 0);
    const size_t at = alone[j].output.find("the job's store is 127.0.0.1:");
    REQUIRE(at != std::string::npos);
    ports[j] = alone[j].output.substr(at + 29, alone[j].output.find('\n', at) - at - 29);
    for (int rank = 0; rank < 2; ++rank) {
      CHECK_THAT(alone[j].output, Catch::Contains("[" + std::to_string(rank) + "]: port " + ports[j] + " addr 127.0.0.1"));
    }
  }
  CHECK(ports[0] != ports[1]);
  // The control, what --standalone is for: two jobs on chorusrun's default port meet there, and
  // one of them fails (its rank 0 cannot bind the port, or its ranks reach the other job's store,
  // which refuses their token).
  const std::array<Run, 2> shared = two_at_once("--master-port 29500 ", "shared");
  INFO(shared[0].output << "\n----\n" << shared[1].output);
  CHECK((shared[0].code != 0 || shared[1].code != 0));
  CHECK_THAT(shared[0].output + shared[1].output,
             Catch::Contains("(is another job using MASTER_PORT=29500?)") || Catch::Contains("refused this process"));
}

TEST_CASE("chorusrun refuses bad usage", "[distributed][chorusrun]") {
  {
    const Run neg = run("--grace-period -1 true");
    CHECK(neg.code != 0);
    CHECK_THAT(neg.output, Catch::Contains("--grace-period"));
  }
  // Each: chorusrun's exit code and what it says.
  auto refused = [](const std::string& args, int code, const std::string& says) {
    const Run r = run(args);
    INFO(args);
    CHECK(r.code == code);
    CHECK_THAT(r.output, Catch::Contains(says));
  };
  refused("--nproc-per-node 2", 2, "no program given");
  refused("--nnodes 2 --node-rank 2 true", 2, "--node-rank 2 must be less than --nnodes 2");
  refused("--standalone --nnodes 2 true", 2, "--standalone is a job on this machine alone; it cannot go with --nnodes 2");
  refused("--standalone --master-port 31000 true", 2, "leave out --master-addr and --master-port");
  refused("--nproc-per-node 1 /nonexistent/program", 127, "cannot run /nonexistent/program");
}
