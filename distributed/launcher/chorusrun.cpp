// chorusrun: starts the worker processes of a data-parallel job, with torchrun's conventions.
//
//   chorusrun --nproc-per-node 2 bazel-bin/examples/mnist/mnist --epochs 3
//   chorusrun --standalone --nproc-per-node 2 ...   # a one-node job on a free port: several at once
//   chorusrun --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --nproc-per-node 8 train ...   # on each node
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
// MASTER_PORT (and OMP_NUM_THREADS=cores/nproc when unset and nproc > 1, so workers do not
// oversubscribe the cores). Every line a worker prints is prefixed with "[rank]: ". SIGINT and
// SIGTERM are forwarded to the workers; SIGUSR1 too, without stopping them (each worker writes its
// flight-recorder dump, distributed/flight_recorder.h). When a worker fails, the others are stopped (SIGTERM, then
// SIGKILL after a grace period) and chorusrun exits with the failed worker's code (128 + signal
// when it was killed by a signal).
//
// [Standalone] MASTER_PORT is 29500 unless given (torchrun's default), so two one-node jobs started
// at once on one machine meet at one port: the second's rank 0 cannot bind it ("is another job using
// MASTER_PORT=29500?"). --standalone (torchrun's flag) puts the job's store on 127.0.0.1 at a port
// the kernel picks as free (bind to port 0), so such jobs do not meet. As torchrun's, the port is
// free when chorusrun picks it and taken by rank 0's store a moment later: a program that binds it
// in between (rank 0 binds it when the program calls init_process_group) makes rank 0 fail with the
// message above. Each restart (--max-restarts) picks a port again.
//
// With --nnodes > 1 and --max-restarts > 0 the launchers of all nodes meet in a rendezvous (a TCP
// store hosted by node 0's chorusrun at --rdzv-port): every round starts only when all nodes have
// joined it, a failed worker on any node stops the workers of every node, and all restart together
// with the same CHORUS_RESTART_COUNT.
//
// [Job token] Only the job's processes get into its stores (distributed/store_auth.h). The token
// comes from --job-token-file, CHORUS_JOB_TOKEN_FILE or CHORUS_JOB_TOKEN (one of them; every node
// of a job needs the same one); a job on one node without any gets a new random one. Workers
// get CHORUS_JOB_TOKEN_FILE (a path in their environment, not the secret): the given file, or for
// a generated token a file of this user's only (mode 0600 in a 0700 directory under TMPDIR),
// removed when chorusrun exits. A job of several nodes without a token runs as before, with a
// warning: its store lets in whoever reaches it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <filesystem>
#include <cerrno>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "distributed/job_token.h"
#include "distributed/store.h"
#include "utils/cli.h"

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }
volatile sig_atomic_t g_dump_signal = 0;  // SIGUSR1: forwarded, and the job goes on
void on_dump_signal(int) { g_dump_signal = 1; }

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_buf, err_buf;
  bool running = true;
  int exit_code = 0;
};

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

// Emits the complete lines in buf with the worker's prefix; keeps a partial last line (unless flush).
void emit_lines(std::string& buf, int fd, const std::string& prefix, bool flush) {
  size_t start = 0;
  for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1) {
    write_all(fd, prefix + buf.substr(start, nl - start + 1));
  }
  buf.erase(0, start);
  if (flush && !buf.empty()) {
    write_all(fd, prefix + buf + "\n");
    buf.clear();
  }
}

// Reads what is available on fd into buf; returns false at end of file.
bool drain(int& fd, std::string& buf) {
  char chunk[65536];
  ssize_t n = ::read(fd, chunk, sizeof(chunk));
  if (n > 0) {
    buf.append(chunk, static_cast<size_t>(n));
    return true;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  ::close(fd);
  fd = -1;
  return false;
}


// [Multi-node rendezvous] The launchers of a job with several nodes agree on every round through a
// TCP store that node 0's launcher hosts (torchrun's c10d rendezvous, reduced to what a restart
// needs). Keys, all under "round/<r>/":
//   joined  a counter; a round starts when every node has joined it
//   failed  the first failure of the round ("restart: ..." or "stop: ..."); every launcher watches it
//   exited  a counter; a launcher adds 1 once its workers of the round have all exited
//   left    a counter; a launcher adds 1 once it has read the round's outcome (node 0 waits for all
//           before it closes the store)
class Rendezvous {
 public:
  Rendezvous(const std::string& addr, int port, int node, int nnodes, std::chrono::milliseconds timeout,
             const std::string& job_token)
      : node_(node), nnodes_(nnodes), timeout_(timeout) {
    chorus::distributed::TCPStoreOptions options;
    options.is_server = node == 0;
    options.timeout = timeout;
    options.job_token = job_token;
    store_ = std::make_unique<chorus::distributed::TCPStore>(addr, port, options);
  }

  // Waits until every node has joined round r.
  void join(int r) {
    const std::string key = prefix(r) + "joined";
    store_->add(key, 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int64_t n; (n = store_->add(key, 0)) < nnodes_;) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("rendezvous for round " + std::to_string(r) + ": only " + std::to_string(n) + " of " +
                                 std::to_string(nnodes_) + " nodes joined within " +
                                 std::to_string(timeout_.count() / 1000) + " s (--rdzv-timeout)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Records the round's first failure; a later one is dropped (the first is what stopped the round).
  void report(int r, const std::string& what) {
    const std::string text = what;
    store_->compare_set(prefix(r) + "failed", {}, chorus::distributed::Bytes(text.begin(), text.end()));
  }

  // The round's failure as reported by any node, if there is one yet.
  std::optional<std::string> failure(int r) {
    const std::string key = prefix(r) + "failed";
    if (!store_->check({key})) return std::nullopt;
    return store_->get_string(key);
  }

  // After this node's workers of round r have exited: waits for every node's, then returns the
  // round's failure (none when every worker of every node succeeded).
  std::optional<std::string> finish(int r) {
    const std::string key = prefix(r) + "exited";
    store_->add(key, 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int64_t n; (n = store_->add(key, 0)) < nnodes_;) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("rendezvous for round " + std::to_string(r) + ": the workers of only " +
                                 std::to_string(n) + " of " + std::to_string(nnodes_) + " nodes exited within " +
                                 std::to_string(timeout_.count() / 1000) + " s (--rdzv-timeout)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::optional<std::string> outcome = failure(r);
    const std::string left = prefix(r) + "left";
    store_->add(left, 1);
    if (node_ == 0) {
      // Node 0 hosts the store: the others must have read the outcome before it can go away.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (store_->add(left, 0) < nnodes_ && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return outcome;
  }

 private:
  static std::string prefix(int r) { return "round/" + std::to_string(r) + "/"; }
  int node_, nnodes_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<chorus::distributed::TCPStore> store_;
};

// Watches a round's failure key from a thread of its own, so a slow store never stalls the
// forwarding of the workers' output.
class FailureWatch {
 public:
  FailureWatch(Rendezvous* rdzv, int round) : rdzv_(rdzv) {
    if (rdzv_ == nullptr) return;
    thread_ = std::thread([this, round] {
      while (!done_.load()) {
        try {
          if (auto f = rdzv_->failure(round)) {
            std::lock_guard<std::mutex> lock(mutex_);
            what_ = *f;
            seen_.store(true);
            return;
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mutex_);
          what_ = std::string("stop: lost the rendezvous store: ") + e.what();
          seen_.store(true);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~FailureWatch() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::optional<std::string> seen() {
    if (!seen_.load()) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    return what_;
  }

 private:
  Rendezvous* rdzv_;
  std::thread thread_;
  std::atomic<bool> done_{false}, seen_{false};
  std::mutex mutex_;
  std::string what_;
};

// A generated job token in a file only this user can read: a 0700 directory made by mkdtemp under
// TMPDIR, the file inside it created with mode 0600. Removed by the destructor (chorusrun's exit;
// a chorusrun killed with SIGKILL leaves it, readable by its user only).
class PrivateTokenFile {
 public:
  explicit PrivateTokenFile(const std::string& token) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/chorusrun-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr)
      throw std::runtime_error("cannot make a directory for the job token (" + dir + "): " + std::strerror(errno));
    dir_ = dir;
    path_ = dir_ + "/job_token";
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot write the job token to " + path_ + ": " + std::strerror(errno));
    write_all(fd, token + "\n");
    ::close(fd);
  }
  ~PrivateTokenFile() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

// [Standalone] A TCP port of 127.0.0.1 that is free now (the kernel's pick for port 0); -1 with
// errno set when none can be had.
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return port;
}

int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorusrun: launch the worker processes of a chorus data-parallel job (torchrun conventions)"};
  int nproc = 1, nnodes = 1, node_rank = 0, master_port = 29500;
  double grace_s = 10.0;
  std::string master_addr = "127.0.0.1";
  std::vector<std::string> command;
  app.add_option("--nproc-per-node,--nproc_per_node", nproc, "worker processes on this node")->check(CLI::PositiveNumber);
  app.add_option("--nnodes", nnodes, "number of nodes")->check(CLI::PositiveNumber);
  app.add_option("--node-rank,--node_rank", node_rank, "this node's index in [0, nnodes)")->check(CLI::NonNegativeNumber);
  CLI::Option* addr_option =
      app.add_option("--master-addr,--master_addr", master_addr, "address of the node running rank 0");
  CLI::Option* port_option = app.add_option("--master-port,--master_port", master_port, "port of rank 0's store (default 29500)")
                                 ->check(CLI::Range(1, 65535));
  bool standalone = false;
  app.add_flag("--standalone", standalone,
               "a one-node job whose store is on 127.0.0.1 at a port chosen free (torchrun's flag): several such jobs "
               "can run on one machine at once");
  app.add_option("--grace-period", grace_s, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::NonNegativeNumber);
  int max_restarts = 0;
  app.add_option("--max-restarts,--max_restarts", max_restarts,
                 "when a worker fails, stop all and start them again, up to this many times (torchrun's flag); "
                 "CHORUS_RESTART_COUNT tells the workers which start this is")
      ->check(CLI::Range(0, 1000000));
  int rdzv_port = -1;
  double rdzv_timeout_s = 300.0;
  app.add_option("--rdzv-port,--rdzv_port", rdzv_port,
                 "with --nnodes > 1 and --max-restarts: port of the launchers' rendezvous, hosted by node 0's "
                 "chorusrun at --master-addr (default: --master-port + 1)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--rdzv-timeout,--rdzv_timeout", rdzv_timeout_s,
                 "seconds to wait for every node to join a round (and for their workers to exit)")
      ->check(CLI::PositiveNumber);
  std::string job_token_file;
  app.add_option("--job-token-file,--job_token_file", job_token_file,
                 "file with the job's secret (mode 0600; the same on every node): only processes that hold it get into "
                 "the job's stores. Alternatives: CHORUS_JOB_TOKEN_FILE, CHORUS_JOB_TOKEN; a job on one node without "
                 "one gets a random one");
  app.prefix_command();  // everything from the first non-option on is the program and its arguments
  app.footer("Usage: chorusrun [options] program [program arguments...]");
  try {
    chorus::cli::refuse_non_finite(app);
    app.parse(argc, argv);
    command = app.remaining();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (command.empty()) {
    std::fprintf(stderr, "chorusrun: no program given (usage: chorusrun [options] program [args...]; see --help)\n");
    return 2;
  }
  if (node_rank >= nnodes) {
    std::fprintf(stderr, "chorusrun: --node-rank %d must be less than --nnodes %d\n", node_rank, nnodes);
    return 2;
  }
  if (standalone) {  // [Standalone]
    if (nnodes != 1) {
      std::fprintf(stderr, "chorusrun: --standalone is a job on this machine alone; it cannot go with --nnodes %d\n",
                   nnodes);
      return 2;
    }
    if (port_option->count() > 0 || addr_option->count() > 0) {
      std::fprintf(stderr, "chorusrun: --standalone chooses the store's address and port itself (127.0.0.1, a free "
                           "port); leave out --master-addr and --master-port\n");
      return 2;
    }
    master_addr = "127.0.0.1";
    master_port = free_loopback_port();
    if (master_port < 0) {
      std::fprintf(stderr, "chorusrun: --standalone: no free port on 127.0.0.1: %s\n", std::strerror(errno));
      return 1;
    }
    std::fprintf(stderr, "chorusrun: --standalone: the job's store is 127.0.0.1:%d\n", master_port);
  }
  // [Job token] (the top of this file): which secret this job's stores ask for.
  std::string job_token, token_file_for_workers;
  std::unique_ptr<PrivateTokenFile> generated_token;
  try {
    namespace dist = chorus::distributed;
    const char* env_file = std::getenv(dist::kJobTokenFileEnv);
    const char* env_token = std::getenv(dist::kJobTokenEnv);
    const bool has_env_file = env_file != nullptr && *env_file != '\0', has_env_token = env_token != nullptr && *env_token != '\0';
    if (!job_token_file.empty() + has_env_file + has_env_token > 1) {
      std::fprintf(stderr, "chorusrun: the job token is given more than once (%s%s%s): give one\n",
                   job_token_file.empty() ? "" : "--job-token-file ", has_env_file ? "CHORUS_JOB_TOKEN_FILE " : "",
                   has_env_token ? "CHORUS_JOB_TOKEN" : "");
      return 2;
    }
    if (!job_token_file.empty() || has_env_file) {
      const std::string path = !job_token_file.empty() ? job_token_file : env_file;
      job_token = dist::read_job_token_file(path);
      token_file_for_workers = std::filesystem::absolute(path).string();
    } else if (has_env_token) {
      job_token = dist::job_token_from_env();  // the workers read the same variable
    } else if (nnodes == 1) {
      job_token = dist::new_job_token();
      generated_token = std::make_unique<PrivateTokenFile>(job_token);
      token_file_for_workers = generated_token->path();
    } else {
      std::fprintf(stderr, "chorusrun: no job token (--job-token-file or CHORUS_JOB_TOKEN): this job's store lets in "
                           "any process that can reach it\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorusrun: %s\n", e.what());
    return 2;
  }
  const int world = nproc * nnodes;
  const unsigned cores = std::thread::hardware_concurrency();
  const bool set_threads = nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr;
  const int threads = std::max(1, static_cast<int>(cores) / nproc);
  if (set_threads) {
    std::fprintf(stderr, "chorusrun: setting OMP_NUM_THREADS=%d for each of %d workers (%u cores); set it to override\n",
                 threads, nproc, cores);
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  struct sigaction dump {};
  dump.sa_handler = on_dump_signal;
  sigemptyset(&dump.sa_mask);
  ::sigaction(SIGUSR1, &dump, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  // One start of every worker, watched until all have exited. The result: the job's exit code, and
  // whether a worker failed by itself (a restart may help) rather than the launcher being signalled.
  struct Round {
    int code = 0;
    bool worker_failed = false;
  };
  // The launchers of several nodes restart together through a rendezvous; one node restarts alone.
  std::unique_ptr<Rendezvous> rdzv;
  if (nnodes > 1 && max_restarts > 0) {
    if (rdzv_port < 0) rdzv_port = master_port % 65535 + 1;
    try {
      rdzv = std::make_unique<Rendezvous>(master_addr, rdzv_port, node_rank, nnodes,
                                          std::chrono::milliseconds(static_cast<int64_t>(rdzv_timeout_s * 1000)),
                                          job_token);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "chorusrun: cannot reach the rendezvous of the %d nodes at %s:%d: %s\n", nnodes,
                   master_addr.c_str(), rdzv_port, e.what());
      return 1;
    }
  }
  // Reports this node's failure of a round to the other nodes; a lost store is said, not thrown.
  auto report = [&](int restart, const std::string& what) {
    if (!rdzv) return;
    try {
      rdzv->report(restart, what);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "chorusrun: cannot tell the other nodes (%s): %s\n", what.c_str(), e.what());
    }
  };

  auto run_round = [&](int restart) -> Round {
    g_dump_signal = 0;  // a SIGUSR1 between rounds was for workers that are gone
    if (standalone && restart > 0) {  // [Standalone] a port free now, not the one the last round had
      const int port = free_loopback_port();
      if (port > 0) {
        master_port = port;
        std::fprintf(stderr, "chorusrun: --standalone: restart %d's store is 127.0.0.1:%d\n", restart, master_port);
      }
    }
    FailureWatch watch(rdzv.get(), restart);
    std::vector<Worker> workers(nproc);
    const pid_t launcher = ::getpid();
    // A worker that cannot be started (out of file descriptors or processes) stops the job: the ones
    // already running are killed and reaped, none is left behind.
    auto abandon_start = [&](const char* what, int local) {
      std::fprintf(stderr, "chorusrun: cannot start worker %d of %d (%s: %s); stopping the %d already started\n", local,
                   nproc, what, std::strerror(errno), local);
      for (int i = 0; i < local; ++i) {
        if (workers[i].pid > 0) {
          ::kill(-workers[i].pid, SIGKILL);
          ::kill(workers[i].pid, SIGKILL);
        }
      }
      for (int i = 0; i < local; ++i) {
        if (workers[i].pid > 0) ::waitpid(workers[i].pid, nullptr, 0);
      }
      return 1;
    };
    for (int local = 0; local < nproc; ++local) {
      Worker& w = workers[local];
      w.local_rank = local;
      w.rank = node_rank * nproc + local;
      int out[2] = {-1, -1}, err[2] = {-1, -1};
      if (::pipe(out) != 0 || ::pipe(err) != 0) {
        for (int fd : {out[0], out[1], err[0], err[1]})
          if (fd >= 0) ::close(fd);
        return Round{abandon_start("pipe", local), false};
      }
      pid_t pid = ::fork();
      if (pid < 0) return Round{abandon_start("fork", local), false};
      if (pid == 0) {
        // Dies with the launcher, even when the launcher is killed with SIGKILL and cannot forward
        // anything (checked once more after the call: the launcher may already be gone).
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != launcher) ::_exit(128 + SIGKILL);
        ::setpgid(0, 0);  // the worker's own process group: a terminal's Ctrl-C reaches it through us
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(err[1], STDERR_FILENO);
        ::close(out[0]);
        ::close(out[1]);
        ::close(err[0]);
        ::close(err[1]);
        ::setenv("RANK", std::to_string(w.rank).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
        ::setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
        ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
        ::setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
        ::setenv("CHORUS_RESTART_COUNT", std::to_string(restart).c_str(), 1);
        if (!token_file_for_workers.empty()) {
          ::setenv(chorus::distributed::kJobTokenFileEnv, token_file_for_workers.c_str(), 1);
          ::unsetenv(chorus::distributed::kJobTokenEnv);
        }
        if (set_threads) ::setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
        // SIGUSR1 asks for a flight-recorder dump (the worker takes it over from SIG_IGN, told so by
        // the variable): a worker that has not installed its handler yet, or is no chorus program,
        // must not die of it. An ignored signal stays ignored across exec.
        ::signal(SIGUSR1, SIG_IGN);
        ::setenv("CHORUS_SIGUSR1_IGNORED_BY_LAUNCHER", "1", 1);
        std::vector<char*> args;
        for (std::string& s : command) args.push_back(s.data());
        args.push_back(nullptr);
        ::execvp(args[0], args.data());
        std::fprintf(stderr, "chorusrun: cannot run %s: %s\n", args[0], std::strerror(errno));
        ::_exit(127);
      }
      ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before any signal
      ::close(out[1]);
      ::close(err[1]);
      w.pid = pid;
      w.out_fd = out[0];
      w.err_fd = err[0];
    }

    int failed_code = 0, failed_rank = -1;
    bool stopping = false;
    auto stop_started = std::chrono::steady_clock::now();
    bool killed = false, peer_failed = false;
    // Each worker leads its own process group: a signal reaches what it started, too.
    // A signal is followed by SIGCONT, as a shell does for a stopped job: a stopped worker (SIGSTOP,
    // the stopped rank a heartbeat reported) takes it at once instead of waiting for the grace
    // period's SIGKILL.
    auto signal_all = [&](int sig) {
      for (Worker& w : workers) {
        if (!w.running) continue;
        ::kill(-w.pid, sig);
        if (sig != SIGKILL && sig != SIGCONT) ::kill(-w.pid, SIGCONT);
      }
    };
    auto all_exited_at = std::chrono::steady_clock::time_point();

    for (;;) {
      if (g_dump_signal != 0) {
        g_dump_signal = 0;
        // To the workers themselves, not their process groups: a child a worker started keeps
        // SIGUSR1's default action, which would end it.
        for (const Worker& w : workers)
          if (w.running) ::kill(w.pid, SIGUSR1);
      }
      if (g_signal != 0) {
        const int sig = g_signal;
        g_signal = 0;
        std::fprintf(stderr, "chorusrun: got signal %d, forwarding it to the workers\n", sig);
        signal_all(sig);
        report(restart, "stop: chorusrun on node " + std::to_string(node_rank) + " got signal " + std::to_string(sig));
        if (!stopping) {
          stopping = true;
          stop_started = std::chrono::steady_clock::now();
          if (failed_code == 0) failed_code = 128 + sig;
        }
      }
      // Another node's failure (or the rendezvous store lost) stops this node's workers too.
      if (!stopping) {
        if (auto why = watch.seen()) {
          std::fprintf(stderr, "chorusrun: the round stops on every node (%s); stopping this node's workers\n",
                       why->c_str());
          stopping = true;
          peer_failed = true;
          stop_started = std::chrono::steady_clock::now();
          signal_all(SIGTERM);
        }
      }
      // Output: poll every open pipe for up to 100 ms.
      std::vector<pollfd> fds;
      std::vector<std::pair<int, bool>> owners;  // (worker, is_stdout)
      for (int i = 0; i < nproc; ++i) {
        if (workers[i].out_fd >= 0) fds.push_back({workers[i].out_fd, POLLIN, 0}), owners.push_back({i, true});
        if (workers[i].err_fd >= 0) fds.push_back({workers[i].err_fd, POLLIN, 0}), owners.push_back({i, false});
      }
      if (!fds.empty()) {
        int ready = ::poll(fds.data(), fds.size(), 100);
        if (ready > 0) {
          for (size_t k = 0; k < fds.size(); ++k) {
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            Worker& w = workers[owners[k].first];
            const std::string prefix = "[" + std::to_string(w.rank) + "]: ";
            if (owners[k].second) {
              const bool open = drain(w.out_fd, w.out_buf);
              emit_lines(w.out_buf, STDOUT_FILENO, prefix, !open);
            } else {
              const bool open = drain(w.err_fd, w.err_buf);
              emit_lines(w.err_buf, STDERR_FILENO, prefix, !open);
            }
          }
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      // Exits.
      bool any_running = false;
      for (Worker& w : workers) {
        if (!w.running) continue;
        int status = 0;
        pid_t r = ::waitpid(w.pid, &status, WNOHANG);
        if (r == w.pid) {
          w.running = false;
          w.exit_code = code_of(status);
          if (w.exit_code != 0 && failed_rank < 0 && !stopping) {
            failed_rank = w.rank;
            failed_code = w.exit_code;
            std::fprintf(stderr, "chorusrun: worker rank %d (pid %d) exited with code %d; stopping the other workers\n",
                         w.rank, static_cast<int>(w.pid), w.exit_code);
            stopping = true;
            stop_started = std::chrono::steady_clock::now();
            signal_all(SIGTERM);
            report(restart, "restart: worker rank " + std::to_string(w.rank) + " on node " + std::to_string(node_rank) +
                                " exited with code " + std::to_string(w.exit_code));
          } else if (w.exit_code != 0) {
            // Every other failure too: the first one seen is not always the cause (a killed worker's
            // peer may fail on the broken connection and be reaped first).
            std::fprintf(stderr, "chorusrun: worker rank %d (pid %d) exited with code %d\n", w.rank,
                         static_cast<int>(w.pid), w.exit_code);
          }
        } else {
          any_running = true;
        }
      }
      if (stopping && any_running && !killed &&
          std::chrono::steady_clock::now() - stop_started > std::chrono::duration<double>(grace_s)) {
        std::fprintf(stderr, "chorusrun: workers still running %.0f s after SIGTERM; sending SIGKILL\n", grace_s);
        signal_all(SIGKILL);
        killed = true;
      }
      bool pipes_open = false;
      for (const Worker& w : workers) pipes_open |= w.out_fd >= 0 || w.err_fd >= 0;
      if (!any_running && !pipes_open) break;
      // A process a worker left behind may hold its output pipe open: read what comes for a
      // second after the last worker exits, then stop waiting for it.
      if (!any_running && all_exited_at == std::chrono::steady_clock::time_point()) {
        all_exited_at = std::chrono::steady_clock::now();
      }
      if (!any_running && std::chrono::steady_clock::now() - all_exited_at > std::chrono::seconds(1)) break;
    }
    return {failed_code != 0 ? failed_code : (peer_failed ? 1 : 0), failed_rank >= 0 || peer_failed};
  };

  // [Elastic restart] torchrun's --max-restarts: a failed worker stops the round (the others get
  // SIGTERM, then SIGKILL), and all start again with CHORUS_RESTART_COUNT one higher; the programs
  // resume from their latest complete checkpoint (the examples' --resume auto). A signal to the
  // launcher itself ends the job without restarting.
  for (int restart = 0;; ++restart) {
    if (rdzv) {
      // Several nodes: the round starts when all have joined, and ends with one outcome for all.
      try {
        rdzv->join(restart);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "chorusrun: %s\n", e.what());
        return 1;
      }
      const Round round = run_round(restart);
      std::optional<std::string> failure;
      try {
        failure = rdzv->finish(restart);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "chorusrun: %s\n", e.what());
        return round.code != 0 ? round.code : 1;
      }
      if (!failure) return round.code;
      const int code = round.code != 0 ? round.code : 1;
      if (failure->rfind("stop:", 0) == 0 || g_signal != 0) return code;
      if (restart >= max_restarts) {
        std::fprintf(stderr, "chorusrun: giving up after %d restart(s) (--max-restarts %d; %s)\n", restart,
                     max_restarts, failure->c_str());
        return code;
      }
      std::fprintf(stderr, "chorusrun: restarting the workers of all %d nodes (%d of %d, --max-restarts; %s)\n",
                   nnodes, restart + 1, max_restarts, failure->c_str());
      continue;
    }
    const Round round = run_round(restart);
    if (round.code == 0 || !round.worker_failed || restart >= max_restarts || g_signal != 0) {
      if (round.code != 0 && round.worker_failed && max_restarts > 0 && restart >= max_restarts)
        std::fprintf(stderr, "chorusrun: giving up after %d restart(s) (--max-restarts %d)\n", restart, max_restarts);
      return round.code;
    }
    std::fprintf(stderr, "chorusrun: restarting the workers (%d of %d, --max-restarts)\n", restart + 1, max_restarts);
  }
}
