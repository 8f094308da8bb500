// Two hosts for real: two network namespaces joined by a veth pair, each running chorusrun with
// --nnodes 2 (one process per "host"), the MNIST example over TCP between them. The result must
// equal the 2-process single-host run bit for bit (the final checkpoint), and when the link goes
// down mid-training every process must exit with an error within the configured timeout
// (CHORUS_TIMEOUT_S), none hang. Needs root and iproute2 (`ip netns`); where namespaces cannot be
// created the test says so and is counted as skipped (a "CHORUS-SKIP" line, tools/test.sh).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

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

std::string mnist_flags(const std::string& ckpt_dir, int epochs) {
  return runfile("examples/mnist/mnist") + " --model mlp --epochs " + std::to_string(epochs) +
         " --batch-size 256 --threads 1 --workers 0 --log-every 0.5 --checkpoint-dir " + ckpt_dir;
}

// A failed rendezvous or a hang ends within a minute (the default timeout is 5).
std::string chorusrun_node(const std::string& master, int port, int node, int timeout_s = 60) {
  return "env CHORUS_TIMEOUT_S=" + std::to_string(timeout_s) + " " + runfile("distributed/launcher/chorusrun") + " --nnodes 2 --nproc-per-node 1 --node-rank " +
         std::to_string(node) + " --master-addr " + master + " --master-port " + std::to_string(port) + " ";
}

}  // namespace

TEST_CASE("two hosts over a veth pair train MNIST to the same parameters as one host; a dead link fails fast",
          "[distributed][two_hosts]") {
  if (::geteuid() != 0 || run_command("command -v ip").code != 0) {
    std::printf("CHORUS-SKIP: two-host test needs root and iproute2 (ip netns)\n");
    WARN("skipped: needs root and iproute2");
    return;
  }
  TwoHosts hosts;
  if (!hosts.ok) {
    std::printf("CHORUS-SKIP: network namespaces cannot be created here: %s\n", hosts.why.c_str());
    WARN("skipped: network namespaces cannot be created: " << hosts.why);
    return;
  }
  const std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string one = tmp + "/one_host", two = tmp + "/two_hosts", cut = tmp + "/cut";
  run_command("rm -rf " + one + " " + two + " " + cut + " && mkdir -p " + one + " " + two + " " + cut);

  // One host, 2 processes.
  const auto single = run_command("env CHORUS_TIMEOUT_S=60 " + runfile("distributed/launcher/chorusrun") +
                                  " --nproc-per-node 2 --master-port " +
                                  std::to_string(free_port()) + " " + mnist_flags(one, 1));
  INFO(single.output);
  REQUIRE(single.code == 0);

  // Two hosts, 1 process each, rendezvous at host 0's address.
  const int port = free_port();
  const std::string both = "(" + hosts.in(0, chorusrun_node(hosts.addr[0], port, 0) + mnist_flags(two, 1)) + " > " + tmp +
                           "/h0.log 2>&1; echo $? > " + tmp + "/h0.rc) & (" +
                           hosts.in(1, chorusrun_node(hosts.addr[0], port, 1) + mnist_flags(two, 1)) + " > " + tmp +
                           "/h1.log 2>&1; echo $? > " + tmp + "/h1.rc); wait";
  run_command(both);
  INFO("host 0:\n" << read_file(tmp + "/h0.log") << "\nhost 1:\n" << read_file(tmp + "/h1.log"));
  REQUIRE(read_file(tmp + "/h0.rc") == "0\n");
  REQUIRE(read_file(tmp + "/h1.rc") == "0\n");
  REQUIRE(read_file(tmp + "/h0.log").find("world size 2") != std::string::npos);
  const std::string a = read_file(one + "/checkpoint.safetensors"), b = read_file(two + "/checkpoint.safetensors");
  REQUIRE(a.size() > 100000);
  REQUIRE(a == b);  // same parameters, optimizer state and metadata, bit for bit

  // The link goes down mid-training: both sides fail within the timeout (5 s) plus shutdown.
  const int port2 = free_port();
  const std::string start = "(" + hosts.in(0, chorusrun_node(hosts.addr[0], port2, 0, 5) + mnist_flags(cut, 20)) +
                            " > " + tmp + "/c0.log 2>&1; echo $? > " + tmp + "/c0.rc) & (" +
                            hosts.in(1, chorusrun_node(hosts.addr[0], port2, 1, 5) + mnist_flags(cut, 20)) + " > " +
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
  CHECK(seconds < 30.0);
  // Each side says what failed (a timeout or a lost connection, naming the collective).
  CHECK((log0.find("timed out") != std::string::npos || log0.find("failed") != std::string::npos));
  CHECK((log1.find("timed out") != std::string::npos || log1.find("failed") != std::string::npos));
  std::printf("link down to both hosts exited: %.1f s\n", seconds);
}
