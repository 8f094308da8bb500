// TCPStore under load (issue 35 item 5): 256 clients connected at once, each adding to a shared
// counter, writing its own keys and reading its neighbour's, as 256 ranks' rendezvous and
// heartbeats would. Every add must count, every value must be the one its writer wrote, and once
// the clients have gone the server's descriptors and threads are what they were before (the
// server is one poll loop: no thread per client). Prints the request rate (not asserted).
#include <catch2/catch.hpp>

#include <dirent.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "distributed/store.h"

namespace chorus::distributed {
namespace {

using namespace std::chrono_literals;

int open_descriptors() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

int threads_now() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

}  // namespace

TEST_CASE("TCPStore serves 256 concurrent clients correctly and leaks nothing when they leave", "[distributed][store]") {
  constexpr int kClients = 256, kRounds = 40;
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 60000ms});
  const int fds_before = open_descriptors(), threads_before = threads_now();
  std::atomic<int> errors{0}, wrong{0};
  std::barrier connected(kClients);
  const auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        try {
          TCPStore store("127.0.0.1", server.port(), {.timeout = 60000ms});
          connected.arrive_and_wait();  // all 256 connections open at once
          const int neighbour = (c + 1) % kClients;
          for (int r = 0; r < kRounds; ++r) {
            store.add("total", 1);
            store.set("client/" + std::to_string(c) + "/" + std::to_string(r), "value " + std::to_string(c * 1000 + r));
            // Waits (polling) for the neighbour's key of this round, then checks it.
            const std::string got = store.get_string("client/" + std::to_string(neighbour) + "/" + std::to_string(r));
            if (got != "value " + std::to_string(neighbour * 1000 + r)) ++wrong;
          }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "client %d: %s\n", c, e.what());
          ++errors;
        }
      });
    }
    for (auto& t : clients) t.join();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(errors == 0);
  CHECK(wrong == 0);
  CHECK(server.add("total", 0) == kClients * kRounds);
  CHECK(server.num_keys() == 1 + kClients * kRounds);
  std::printf("store load: %d clients x %d rounds (add, set, get) in %.2f s: %.0f requests/s at least\n", kClients,
              kRounds, seconds, 3.0 * kClients * kRounds / seconds);
  // The server closes each connection when its client does: back to where it was (a deadline only
  // a leak reaches).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (open_descriptors() > fds_before && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  CHECK(open_descriptors() == fds_before);
  if (open_descriptors() != fds_before) std::system("ls -l /proc/$PPID/fd >&2; ls -l /proc/self/fd >&2");
  CHECK(threads_now() == threads_before);
}

}  // namespace chorus::distributed
