// Several hosts for real, as network namespaces, each running chorusrun with --nnodes N (one process
// per "host"), the MNIST example over TCP between them.
// - Two hosts joined by a veth pair, with a job token: the result must equal the 2-process single-host run bit for bit
//   (the final checkpoint), and when the link goes down mid-training every process must exit with an
//   error within the configured timeout (CHORUS_TIMEOUT_S), none hang.
// - Four hosts on a bridge, with --max-restarts: one host's worker is killed with SIGKILL
//   mid-epoch; the launchers of all four meet again in their rendezvous, every worker resumes from
//   the last checkpoint, and the final checkpoint equals the uninterrupted 4-process run's.
// Needs root and iproute2 (`ip netns`); where namespaces cannot be created the test says so and is
// counted as skipped (a "CHORUS-SKIP" line, tools/test.sh).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/distributed/worker_launcher.h"

using chorus::testing::free_port;
using chorus::testing::run_command;
using chorus::testing::runfile;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Two namespaces with a veth pair between them, removed on destruction.
struct TwoHosts {
  std::string ns[2], veth[2], addr[2];
  bool ok = false;
  std::string why;

  TwoHosts() {
    const int id = static_cast<int>(::getpid() % 100000);
    for (int i = 0; i < 2; ++i) {
      ns[i] = "chorus2h" + std::to_string(id) + "_" + std::to_string(i);
      veth[i] = "c2h" + std::to_string(id) + (i ? "b" : "a");  // under IFNAMSIZ (15)
      addr[i] = "10.251." + std::to_string(id % 250) + "." + std::to_string(i + 1);
    }
    const std::string setup = "set -e; ip netns add " + ns[0] + "; ip netns add " + ns[1] + "; ip link add " + veth[0] +
                              " type veth peer name " + veth[1] + "; ip link set " + veth[0] + " netns " + ns[0] +
                              "; ip link set " + veth[1] + " netns " + ns[1] + "; ip -n " + ns[0] + " addr add " + addr[0] + "/24 dev " + veth[0] + "; ip -n " + ns[1] +
                              " addr add " + addr[1] + "/24 dev " + veth[1] + "; ip -n " + ns[0] + " link set lo up; ip -n " +
                              ns[1] + " link set lo up; ip -n " + ns[0] + " link set " + veth[0] + " up; ip -n " + ns[1] +
                              " link set " + veth[1] + " up";
    const auto r = run_command(setup);
    ok = r.code == 0;
    why = r.output;
  }
  ~TwoHosts() { run_command("ip netns del " + ns[0] + "; ip netns del " + ns[1]); }
  std::string in(int host, const std::string& cmd) const { return "ip netns exec " + ns[host] + " " + cmd; }
};

// N namespaces ("hosts"), each with a veth to a bridge in a namespace of its own (the switch);
// everything is removed on destruction.
struct BridgedHosts {
  std::string sw;
  std::vector<std::string> ns, veth, addr;
  bool ok = false;
  std::string why;

  explicit BridgedHosts(int n) {
    const int id = static_cast<int>(::getpid() % 100000);
    sw = "chorussw" + std::to_string(id);
    std::string setup = "set -e; ip netns add " + sw + "; ip -n " + sw + " link add br0 type bridge; ip -n " + sw +
                        " link set br0 up";
    for (int i = 0; i < n; ++i) {
      ns.push_back("chorusnh" + std::to_string(id) + "_" + std::to_string(i));
      veth.push_back("cnh" + std::to_string(id) + "h" + std::to_string(i));  // under IFNAMSIZ (15)
      addr.push_back("10.252." + std::to_string(id % 250) + "." + std::to_string(i + 1));
      const std::string port = "cnh" + std::to_string(id) + "p" + std::to_string(i);
      setup += "; ip netns add " + ns[i] + "; ip link add " + veth[i] + " type veth peer name " + port +
               "; ip link set " + veth[i] + " netns " + ns[i] + "; ip link set " + port + " netns " + sw + "; ip -n " +
               sw + " link set " + port + " master br0; ip -n " + sw + " link set " + port + " up; ip -n " + ns[i] +
               " addr add " + addr[i] + "/24 dev " + veth[i] + "; ip -n " + ns[i] + " link set lo up; ip -n " + ns[i] +
               " link set " + veth[i] + " up";
    }
    const auto r = run_command(setup);
    ok = r.code == 0;
    why = r.output;
  }
  ~BridgedHosts() {
    std::string cleanup = "ip netns del " + sw;
    for (const std::string& n : ns) cleanup += "; ip netns del " + n;
    run_command(cleanup);
  }
  std::string in(int host, const std::string& cmd) const { return "ip netns exec " + ns[host] + " " + cmd; }
};

// Whether the hosts were made; if not, says why as a skip (tools/test.sh counts "CHORUS-SKIP").
template <class Hosts>
bool made(const Hosts& hosts) {
  if (hosts.ok) return true;
  std::printf("CHORUS-SKIP: network namespaces cannot be created here: %s\n", hosts.why.c_str());
  WARN("skipped: network namespaces cannot be created: " << hosts.why);
  return false;
}

std::string scratch_root() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

bool can_make_namespaces() {
  if (::geteuid() != 0 || run_command("command -v ip").code != 0) {
    std::printf("CHORUS-SKIP: multi-host tests need root and iproute2 (ip netns)\n");
    WARN("skipped: needs root and iproute2");
    return false;
  }
  return true;
}

std::string mnist_flags(const std::string& ckpt_dir, int epochs) {
  return runfile("examples/mnist/mnist") + " --model mlp --epochs " + std::to_string(epochs) +
         " --batch-size 256 --threads 1 --workers 0 --log-every 0.5 --checkpoint-dir " + ckpt_dir;
}

// A failed rendezvous or a hang ends within a minute (the default timeout is 5). Both nodes prove
// the job token in `token_file` to the store (docs/reliability.md, "Job token").
std::string chorusrun_node(const std::string& master, int port, int node, const std::string& token_file,
                           int timeout_s = 60) {
  return "env CHORUS_TIMEOUT_S=" + std::to_string(timeout_s) + " " + runfile("distributed/launcher/chorusrun") + " --nnodes 2 --nproc-per-node 1 --node-rank " +
         std::to_string(node) + " --master-addr " + master + " --master-port " + std::to_string(port) +
         " --job-token-file " + token_file + " ";
}

// A job token only its owner may read, as on a real cluster (each host would hold a copy).
std::string make_token_file(const std::string& dir) {
  const std::string path = dir + "/job_token";
  run_command("rm -f " + path + " && (umask 077; head -c 32 /dev/urandom | base64 > " + path + ")");
  return path;
}

}  // namespace

TEST_CASE("two hosts over a veth pair train MNIST to the same parameters as one host; a dead link fails fast",
          "[distributed][two_hosts]") {
  if (!can_make_namespaces()) return;
  TwoHosts hosts;
  if (!made(hosts)) return;
  const std::string tmp = scratch_root();
  const std::string one = tmp + "/one_host", two = tmp + "/two_hosts", cut = tmp + "/cut";
  run_command("rm -rf " + one + " " + two + " " + cut + " && mkdir -p " + one + " " + two + " " + cut);
  const std::string token = make_token_file(tmp);

  // One host, 2 processes.
  const auto single = run_command("env CHORUS_TIMEOUT_S=60 " + runfile("distributed/launcher/chorusrun") +
                                  " --nproc-per-node 2 --master-port " +
                                  std::to_string(free_port()) + " " + mnist_flags(one, 1));
  INFO(single.output);
  REQUIRE(single.code == 0);

  // Two hosts, 1 process each, rendezvous at host 0's address.
  const int port = free_port();
  const std::string both = "(" + hosts.in(0, chorusrun_node(hosts.addr[0], port, 0, token) + mnist_flags(two, 1)) + " > " + tmp +
                           "/h0.log 2>&1; echo $? > " + tmp + "/h0.rc) & (" +
                           hosts.in(1, chorusrun_node(hosts.addr[0], port, 1, token) + mnist_flags(two, 1)) + " > " + tmp +
                           "/h1.log 2>&1; echo $? > " + tmp + "/h1.rc); wait";
  run_command(both);
  INFO("host 0:\n" << read_file(tmp + "/h0.log") << "\nhost 1:\n" << read_file(tmp + "/h1.log"));
  REQUIRE(read_file(tmp + "/h0.rc") == "0\n");
  REQUIRE(read_file(tmp + "/h1.rc") == "0\n");
  REQUIRE(read_file(tmp + "/h0.log").find("world size 2") != std::string::npos);
  // With the token: no warning that the store lets anyone in, nobody refused.
  CHECK(read_file(tmp + "/h0.log").find("no job token") == std::string::npos);
  CHECK(read_file(tmp + "/h0.log").find("store: refused") == std::string::npos);
  const std::string a = read_file(one + "/checkpoint.safetensors"), b = read_file(two + "/checkpoint.safetensors");
  REQUIRE(a.size() > 100000);
  REQUIRE(a == b);  // same parameters, optimizer state and metadata, bit for bit

  // The link goes down mid-training: both sides fail within the timeout (5 s) plus shutdown.
  const int port2 = free_port();
  const std::string start = "(" + hosts.in(0, chorusrun_node(hosts.addr[0], port2, 0, token, 5) + mnist_flags(cut, 20)) +
                            " > " + tmp + "/c0.log 2>&1; echo $? > " + tmp + "/c0.rc) & (" +
                            hosts.in(1, chorusrun_node(hosts.addr[0], port2, 1, token, 5) + mnist_flags(cut, 20)) + " > " +
                            tmp + "/c1.log 2>&1; echo $? > " + tmp + "/c1.rc) & wait";
  std::thread job([&] { run_command(start); });
  // Wait for training to be under way (a progress line), then take the link down.
  const auto t0 = std::chrono::steady_clock::now();
  while (read_file(tmp + "/c0.log").find("step") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(read_file(tmp + "/c0.log").find("step") != std::string::npos);
  run_command(hosts.in(0, "ip link set " + hosts.veth[0] + " down"));
  const auto cut_at = std::chrono::steady_clock::now();
  job.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
  const std::string log0 = read_file(tmp + "/c0.log"), log1 = read_file(tmp + "/c1.log");
  INFO("after the link went down: " << seconds << " s\nhost 0:\n" << log0 << "\nhost 1:\n" << log1);
  CHECK(read_file(tmp + "/c0.rc") != "0\n");
  CHECK(read_file(tmp + "/c1.rc") != "0\n");
  // Measured 2026-11-28: 18.7 s in -c opt, 25.0 s under ASan (5.1 s before that day's job token and
  // flight recorder: the collective's 5 s timeout, then up to 6 s for the desync report's exchange,
  // which cannot reach rank 0's store across the dead link; the rest not yet explained). Far below
  // the 300 s of a default timeout either way; the bound leaves room for sanitizer builds.
  CHECK(seconds < 45.0);
  // Each side says what failed: a timeout or a lost connection, naming the collective, or the
  // heartbeat monitor's report that the peer went silent (which of the two a rank meets first is a
  // race: in CI of 2026-11-29 rank 0's monitor reported rank 1 "cut off" after 15 s, before any
  // collective of rank 0's failed).
  auto says_what_failed = [](const std::string& log) {
    return log.find("timed out") != std::string::npos || log.find("failed") != std::string::npos ||
           log.find("has sent no heartbeat") != std::string::npos;
  };
  CHECK(says_what_failed(log0));
  CHECK(says_what_failed(log1));
  std::printf("link down to both hosts exited: %.1f s\n", seconds);
}

// Hierarchical allreduce across real "nodes": 2 hosts x 2 processes (chorusrun --nnodes 2
// --nproc-per-node 2 in each namespace): inside a host over loopback, across over the veth pair;
// dist_worker's "hierarchical 2" checks the sum against the flat allreduce and DDP with the hook
// against plain DDP (tests/distributed/dist_worker.cpp).
TEST_CASE("two hosts x two processes: the hierarchical allreduce sums as the flat one", "[distributed][two_hosts][hierarchical]") {
  if (!can_make_namespaces()) return;
  TwoHosts hosts;
  if (!made(hosts)) return;
  const std::string tmp = scratch_root();
  const int port = free_port();
  auto node = [&](int i) {
    return hosts.in(i, "env CHORUS_TIMEOUT_S=60 " + runfile("distributed/launcher/chorusrun") +
                           " --nnodes 2 --nproc-per-node 2 --node-rank " + std::to_string(i) + " --master-addr " +
                           hosts.addr[0] + " --master-port " + std::to_string(port) + " " +
                           runfile("tests/distributed/dist_worker") + " hierarchical 2");
  };
  run_command("(" + node(0) + " > " + tmp + "/hier0.log 2>&1; echo $? > " + tmp + "/hier0.rc) & (" + node(1) + " > " +
              tmp + "/hier1.log 2>&1; echo $? > " + tmp + "/hier1.rc); wait");
  const std::string log0 = read_file(tmp + "/hier0.log"), log1 = read_file(tmp + "/hier1.log");
  INFO("host 0:\n" << log0 << "\nhost 1:\n" << log1);
  CHECK(read_file(tmp + "/hier0.rc") == "0\n");
  CHECK(read_file(tmp + "/hier1.rc") == "0\n");
  CHECK(log0.find("hierarchical allreduce, 2 nodes x 2") != std::string::npos);
  CHECK(log1.find("CHECK FAILED") == std::string::npos);
}

TEST_CASE("four hosts on a bridge restart together after one host's worker is killed, and end where one host does",
          "[distributed][hosts][elastic]") {
  if (!can_make_namespaces()) return;
  constexpr int kHosts = 4;
  BridgedHosts hosts(kHosts);
  if (!made(hosts)) return;
  const std::string tmp = scratch_root();
  const std::string ref = tmp + "/four_ref", job = tmp + "/four_hosts";
  run_command("rm -rf " + ref + " " + job + " && mkdir -p " + ref + " " + job);
  const std::string flags = " --model mlp --epochs 2 --batch-size 256 --threads 1 --workers 0 --log-every 60 "
                            "--checkpoint-every 40 --resume auto --checkpoint-dir ";

  // One host, 4 processes, uninterrupted.
  const auto single = run_command("env CHORUS_TIMEOUT_S=60 " + runfile("distributed/launcher/chorusrun") +
                                  " --nproc-per-node 4 --master-port " + std::to_string(free_port()) + " " +
                                  runfile("examples/mnist/mnist") + flags + ref);
  INFO(single.output);
  REQUIRE(single.code == 0);

  // Four hosts, one process each; every launcher writes its pid (ip netns exec keeps it) and log.
  const int port = free_port(), rdzv = free_port();
  std::string all;
  for (int h = 0; h < kHosts; ++h) {
    const std::string node = "env CHORUS_TIMEOUT_S=60 " + runfile("distributed/launcher/chorusrun") + " --nnodes " +
                             std::to_string(kHosts) + " --nproc-per-node 1 --node-rank " + std::to_string(h) +
                             " --master-addr " + hosts.addr[0] + " --master-port " + std::to_string(port) +
                             " --rdzv-port " + std::to_string(rdzv) + " --rdzv-timeout 120 --max-restarts 2 " +
                             runfile("examples/mnist/mnist") + flags + job;
    all += "(sh -c 'echo $$ > " + tmp + "/l" + std::to_string(h) + ".pid; exec " + hosts.in(h, node) + "' > " + tmp +
           "/l" + std::to_string(h) + ".log 2>&1; echo $? > " + tmp + "/l" + std::to_string(h) + ".rc) & ";
  }
  std::thread run_all([&] { run_command(all + "wait"); });
  // After the second mid-epoch checkpoint of epoch 1, kill -9 host 2's worker.
  const std::string log0 = tmp + "/l0.log";
  const auto t0 = std::chrono::steady_clock::now();
  while (read_file(log0).find("at epoch 1 step 80") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool reached = read_file(log0).find("at epoch 1 step 80") != std::string::npos;
  std::string victim;
  if (reached) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a few steps past the checkpoint
    const auto children = run_command("pgrep -P $(cat " + tmp + "/l2.pid)");
    victim = children.output.substr(0, children.output.find('\n'));
    if (!victim.empty()) run_command("kill -9 " + victim);
  }
  run_all.join();
  std::string logs;
  for (int h = 0; h < kHosts; ++h) logs += "host " + std::to_string(h) + ":\n" + read_file(tmp + "/l" + std::to_string(h) + ".log");
  INFO(logs);
  REQUIRE(reached);
  REQUIRE_FALSE(victim.empty());
  for (int h = 0; h < kHosts; ++h) {
    const std::string log = read_file(tmp + "/l" + std::to_string(h) + ".log");
    CHECK(read_file(tmp + "/l" + std::to_string(h) + ".rc") == "0\n");
    CHECK(log.find("restarting the workers of all 4 nodes (1 of 2") != std::string::npos);
    CHECK(log.find("(2 of 2") == std::string::npos);
  }
  CHECK(read_file(tmp + "/l2.log").find("exited with code 137") != std::string::npos);  // the SIGKILL
  CHECK(read_file(log0).find("world size 4") != std::string::npos);
  CHECK(read_file(log0).find("(restart 1)") != std::string::npos);
  const std::string a = read_file(ref + "/checkpoint.safetensors"), b = read_file(job + "/checkpoint.safetensors");
  REQUIRE(a.size() > 100000);
  REQUIRE(a == b);  // the restarted four-host job ends with the uninterrupted run's parameters and state
}
