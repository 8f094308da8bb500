// Starts real worker processes for multi-process tests, as chorusrun would: each gets RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free loopback port), its output
// goes to a log under TEST_TMPDIR, and a job that outlives its limit is killed (a hang is a
// failure). Used by tests/distributed/multiprocess_test and tests/pipeline/pipeline_test.
#pragma once

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace chorus::testing {

// A free port below the kernel's ephemeral range (32768-60999): ports from bind(0) are ephemeral
// ones, which the many client connections of concurrently running tests can take between our probe
// and rank 0's bind. Seeded from std::random_device, not the pid: Bazel's sandbox gives each test
// its own pid namespace, so two tests started in the same second had the same pid and time, picked
// the same port, and one job's workers joined the other's store.
inline int free_port() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()) ^
                          static_cast<unsigned>(time(nullptr)));
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

// A binary of the workspace by its path in it ("tests/distributed/dist_worker"), from the test's
// runfiles (or bazel-bin when run by hand).
// In a GPU bundle (tools/gpu_bundle.sh) the helper binaries sit in libexec/ beside the tests' bin/.
inline std::string runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir == nullptr) {
    char self[4096] = {};
    if (::readlink("/proc/self/exe", self, sizeof(self) - 1) > 0) {
      const std::filesystem::path bundled = std::filesystem::path(self).parent_path().parent_path() / "libexec" /
                                            std::filesystem::path(path).filename();
      if (std::filesystem::exists(bundled)) return bundled.string();
    }
  }
  std::string base = srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/");
  return base + path;
}

inline std::string slurp(const std::string& path) {
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
inline Result run_workers_once(const std::string& exe, int world, const std::vector<std::string>& args,
                               const std::vector<std::string>& extra_env, double limit_s) {
  const int port = free_port();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const char* tmp = std::getenv("TEST_TMPDIR");
  for (int rank = 0; rank < world; ++rank) {
    logs.push_back(std::string(tmp ? tmp : "/tmp") + "/worker_" + std::to_string(port) + "_" + std::to_string(rank) + ".log");
    pid_t pid = ::fork();
    if (pid == 0) {
      // "CHORUS_TEST_LAUNCHER=openmpi|slurm" in extra_env: the variables mpirun or srun would set
      // instead of chorusrun's (init_process_group's launch_env reads them).
      std::string launcher = "chorusrun";
      for (const std::string& kv : extra_env)
        if (kv.rfind("CHORUS_TEST_LAUNCHER=", 0) == 0) launcher = kv.substr(21);
      const std::string r = std::to_string(rank), w = std::to_string(world);
      if (launcher == "openmpi") {
        ::setenv("OMPI_COMM_WORLD_RANK", r.c_str(), 1);
        ::setenv("OMPI_COMM_WORLD_SIZE", w.c_str(), 1);
        ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", r.c_str(), 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      } else if (launcher == "slurm") {
        ::setenv("SLURM_PROCID", r.c_str(), 1);
        ::setenv("SLURM_NTASKS", w.c_str(), 1);
        ::setenv("SLURM_LOCALID", r.c_str(), 1);
        ::setenv("SLURM_JOB_NODELIST", "localhost,otherhost[1-3]", 1);  // the master: its first host
      } else {
        ::setenv("RANK", r.c_str(), 1);
        ::setenv("WORLD_SIZE", w.c_str(), 1);
        ::setenv("LOCAL_RANK", r.c_str(), 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      }
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
inline Result run_workers(const std::string& exe, int world, const std::vector<std::string>& args,
                          const std::vector<std::string>& extra_env = {}, double limit_s = 120) {
  Result r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = run_workers_once(exe, world, args, extra_env, limit_s);
    if (r.output.find("cannot bind port") == std::string::npos) break;
  }
  return r;
}

// Runs a shell command, returning its exit code and its stdout and stderr together.
struct CommandResult {
  int code;
  std::string output;
};
inline CommandResult run_command(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `world` processes of tests/distributed/dist_worker (what multiprocess_test and its GPU twin start).
inline Result run_dist_workers(int world, const std::vector<std::string>& args,
                               const std::vector<std::string>& extra_env = {}, double limit_s = 120) {
  return run_workers(runfile("tests/distributed/dist_worker"), world, args, extra_env, limit_s);
}

// The part of r.output that is rank `rank`'s own log.
inline std::string rank_log(const Result& r, int rank) {
  const std::string mark = "---- rank " + std::to_string(rank) + "\n";
  const size_t begin = r.output.find(mark);
  if (begin == std::string::npos) return "";
  const size_t end = r.output.find("---- rank " + std::to_string(rank + 1) + "\n", begin);
  return r.output.substr(begin + mark.size(), end == std::string::npos ? std::string::npos : end - begin - mark.size());
}

// A job a negative control expects the stream-order sanitizer to stop: some rank's log has its
// report, every rank exited non-zero, none had to be killed for hanging.
inline void require_sanitizer_report(const Result& r, const std::string& what) {
  INFO(what << "\n" << r.output);
  int reported = 0;
  for (size_t rank = 0; rank < r.codes.size(); ++rank) {
    INFO("rank " << rank << " exit code " << r.codes[rank]);
    CHECK(r.codes[rank] != 0);
    CHECK(r.codes[rank] != 999);
    if (rank_log(r, static_cast<int>(rank)).find("stream-order sanitizer:") != std::string::npos) ++reported;
  }
  CHECK(reported >= 1);
}

inline void require_all_ok(const Result& r) {
  INFO(r.output);
  for (size_t i = 0; i < r.codes.size(); ++i) {
    INFO("rank " << i << " exit code " << r.codes[i]);
    CHECK(r.codes[i] == 0);
  }
}

// The addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on `port`.
inline std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> out;
  char port_hex[8];
  std::snprintf(port_hex, sizeof(port_hex), "%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == port_hex)
        out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

}  // namespace chorus::testing
