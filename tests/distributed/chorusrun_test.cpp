// chorusrun as a user runs it: workers get torchrun's environment, every output line carries its
// rank, a failing worker stops the others and its exit code becomes chorusrun's, signals reach the
// workers, and bad usage is refused.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

std::string launcher() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return (srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/")) + "distributed/launcher/chorusrun";
}

struct Run {
  int code;
  std::string output;  // stdout and stderr together
  double seconds;
};

Run run(const std::string& args) {
  const auto start = std::chrono::steady_clock::now();
  const std::string cmd = launcher() + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

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
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
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

TEST_CASE("chorusrun refuses bad usage", "[distributed][chorusrun]") {
  Run none = run("--nproc-per-node 2");
  CHECK(none.code == 2);
  CHECK_THAT(none.output, Catch::Contains("no program given"));
  Run rank = run("--nnodes 2 --node-rank 2 true");
  CHECK(rank.code == 2);
  CHECK_THAT(rank.output, Catch::Contains("--node-rank 2 must be less than --nnodes 2"));
  Run missing = run("--nproc-per-node 1 /nonexistent/program");
  CHECK(missing.code == 127);
  CHECK_THAT(missing.output, Catch::Contains("cannot run /nonexistent/program"));
}
