// Multi-process tests: each case starts world_size real processes of dist_worker (the environment
// chorusrun gives: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free loopback port), which talk
// through a TCPStore and Gloo over loopback, and requires every one of them to exit 0. What each
// scenario checks is in dist_worker.cpp.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <random>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// A free port below the kernel's ephemeral range (32768-60999): ports from bind(0) are ephemeral
// ones, which the many client connections of concurrently running tests can take between our probe
// and rank 0's bind.
int free_port() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(time(nullptr)));
  for (;;) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (ok) return port;
  }
}

std::string worker_path() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::string base = srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/");
  return base + "tests/distributed/dist_worker";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  std::vector<int> codes;
  std::string output;
};

// Runs `world` workers of a scenario; kills them all after `limit_s` seconds (a hang is a failure).
Result run_workers_once(int world, const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
                        double limit_s) {
  const int port = free_port();
  const std::string exe = worker_path();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const char* tmp = std::getenv("TEST_TMPDIR");
  for (int rank = 0; rank < world; ++rank) {
    logs.push_back(std::string(tmp ? tmp : "/tmp") + "/worker_" + std::to_string(port) + "_" + std::to_string(rank) + ".log");
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      for (const std::string& kv : extra_env) ::putenv(const_cast<char*>(kv.c_str()));
      FILE* f = std::fopen(logs.back().c_str(), "w");
      ::dup2(fileno(f), STDOUT_FILENO);
      ::dup2(fileno(f), STDERR_FILENO);
      std::vector<char*> argv{const_cast<char*>(exe.c_str())};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      std::perror("execv");
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  Result r;
  r.codes.assign(world, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  int left = world;
  while (left > 0) {
    for (int i = 0; i < world; ++i) {
      if (r.codes[i] != -1) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        r.codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int i = 0; i < world; ++i)
        if (r.codes[i] == -1) ::kill(pids[i], SIGKILL);
      r.output += "TIMED OUT: workers killed after " + std::to_string(limit_s) + " s\n";
      for (int i = 0; i < world; ++i) {
        if (r.codes[i] == -1) {
          ::waitpid(pids[i], nullptr, 0);
          r.codes[i] = 999;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int i = 0; i < world; ++i) r.output += "---- rank " + std::to_string(i) + "\n" + slurp(logs[i]);
  return r;
}

// A port can still be taken between the probe and rank 0's bind; then the job is run again on
// another port (at most 3 tries), as a user would rerun it.
Result run_workers(int world, const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {},
                   double limit_s = 120) {
  Result r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = run_workers_once(world, args, extra_env, limit_s);
    if (r.output.find("cannot bind port") == std::string::npos) break;
  }
  return r;
}

void require_all_ok(const Result& r) {
  INFO(r.output);
  for (size_t i = 0; i < r.codes.size(); ++i) {
    INFO("rank " << i << " exit code " << r.codes[i]);
    CHECK(r.codes[i] == 0);
  }
}

}  // namespace

TEST_CASE("every collective and dtype gives the expected values at world sizes 1 to 4", "[distributed][collectives]") {
  for (int world = 1; world <= 4; ++world) {
    INFO("world size " << world);
    require_all_ok(run_workers(world, {"collectives"}));
  }
}

TEST_CASE("DDP equals single-process training on the whole batch (MLP, CNN, transformer; ws 1-4)", "[distributed][ddp]") {
  for (int world = 1; world <= 4; ++world) {
    for (const char* kind : {"mlp", "cnn", "transformer"}) {
      INFO("world size " << world << " model " << kind);
      require_all_ok(run_workers(world, {"ddp", kind, "float64", "25", "0"}));
    }
  }
  // float32; a tiny bucket cap (a bucket per parameter or two); gradient_as_bucket_view.
  for (const char* kind : {"mlp", "cnn", "transformer"}) {
    INFO("model " << kind);
    require_all_ok(run_workers(2, {"ddp", kind, "float32", "25", "0"}));
    require_all_ok(run_workers(3, {"ddp", kind, "float64", "0.0005", "0"}));
    require_all_ok(run_workers(2, {"ddp", kind, "float64", "0.0005", "1"}));
    require_all_ok(run_workers(2, {"ddp", kind, "float32", "25", "1"}));
  }
}

// The stream-ordered group on sim devices: each rank's replica lives on sim:0 (its own process's
// simulated device), buckets are reduced by Gloo on the communication stream's thread, ordered by
// events; random delays before every stream task. Equal to single-process CPU training.
TEST_CASE("DDP on sim devices equals single-process training, with no host block in backward", "[distributed][ddp][sim]") {
  const std::vector<std::string> delays{"CHORUS_SIM_DELAY_US=200"};
  for (const std::string kind : {"mlp", "cnn", "transformer"}) {
    INFO(kind);
    require_all_ok(run_workers(2, {"ddp", kind, "float64", "25", "0", "sim:0"}, delays));
  }
  require_all_ok(run_workers(3, {"ddp", "mlp", "float64", "0.0005", "0", "sim:0"}, delays));
  require_all_ok(run_workers(2, {"ddp", "cnn", "float64", "0.0005", "1", "sim:1"}, delays));
  require_all_ok(run_workers(2, {"ddp", "mlp", "float32", "25", "0", "sim:0"}, delays));
  require_all_ok(run_workers(2, {"no_sync", "sim:0"}, delays));
  require_all_ok(run_workers(3, {"find_unused", "sim:0"}, delays));
  require_all_ok(run_workers(3, {"join", "sim:0"}, delays));
  require_all_ok(run_workers(2, {"syncbn", "sim:0"}, delays));
  // The path CUDA tensors take through Gloo: staged through pinned host memory on the
  // communication stream (forced here for sim tensors).
  require_all_ok(run_workers(3, {"collectives", "sim:0", "staged"}, delays));
  require_all_ok(run_workers(2, {"ddp", "cnn", "float64", "0.0005", "0", "sim:0", "staged"}, delays));
  for (int world = 1; world <= 3; ++world) {
    INFO("every collective and dtype on sim:0, world size " << world);
    require_all_ok(run_workers(world, {"collectives", "sim:0"}, delays));
  }
  require_all_ok(run_workers(3, {"no_sync", "sim:0", "fp16_hook"}, delays));
  require_all_ok(run_workers(2, {"no_sync", "sim:0", "bf16_hook"}, delays));
  require_all_ok(run_workers(3, {"find_unused", "sim:0", "static_graph"}, delays));
}

TEST_CASE("without the communication stream's event waits DDP on sim goes wrong", "[distributed][ddp][sim]") {
  // The same job with the waits of [Sync Streams] switched off (test-only) must not match: this is
  // what shows the ordering test above can fail.
  require_all_ok(run_workers(2, {"ddp", "mlp", "float64", "0.0005", "0", "sim:0", "unordered"}));
}

TEST_CASE("a stuck peer's collective on a communication stream raises on the next call, not a hang", "[distributed][faults][sim]") {
  require_all_ok(run_workers(2, {"stream_timeout"}, {}, 60));
  // A rank that dies mid-run: both others raise (op, sequence number, device) and exit.
  require_all_ok(run_workers(3, {"killed_rank", "sim:0"}, {}, 60));
}

TEST_CASE("no_sync accumulates locally and the next synced backward reduces the sum", "[distributed][ddp]") {
  require_all_ok(run_workers(2, {"no_sync"}));
  require_all_ok(run_workers(3, {"no_sync"}));
}

TEST_CASE("find_unused_parameters handles a branch used on some ranks only", "[distributed][ddp]") {
  require_all_ok(run_workers(2, {"find_unused"}));
  require_all_ok(run_workers(3, {"find_unused"}));
}

TEST_CASE("DDP errors: unused parameters without the flag, and models that differ across ranks", "[distributed][errors]") {
  require_all_ok(run_workers(2, {"prior_iteration"}));
  require_all_ok(run_workers(2, {"model_mismatch"}));
}

TEST_CASE("a killed rank and a stuck rank make the others fail within the timeout, not hang", "[distributed][faults]") {
  require_all_ok(run_workers(2, {"killed_rank"}, {}, 60));
  require_all_ok(run_workers(2, {"timeout"}, {}, 60));
}

TEST_CASE("debug mode catches ranks calling mismatched collectives", "[distributed][debug]") {
  require_all_ok(run_workers(2, {"debug_mismatch"}, {"CHORUS_DISTRIBUTED_DEBUG=DETAIL"}, 60));
}

TEST_CASE("new_group makes subgroups with their own rank numbering", "[distributed][groups]") {
  require_all_ok(run_workers(4, {"new_group"}));
}

TEST_CASE("join lets ranks with fewer batches finish while the others train on", "[distributed][ddp][join]") {
  require_all_ok(run_workers(2, {"join"}));
  require_all_ok(run_workers(3, {"join"}));
}

TEST_CASE("SyncBatchNorm under DDP equals BatchNorm on the whole batch", "[distributed][syncbn]") {
  for (int world = 1; world <= 3; ++world) {
    INFO("world size " << world);
    require_all_ok(run_workers(world, {"syncbn"}));
  }
}
