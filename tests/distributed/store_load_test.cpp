// TCPStore under load (issue 35 item 5): 256 clients connected at once, each adding to a shared
// counter, writing its own keys and reading its neighbour's, as 256 ranks' rendezvous and
// heartbeats would. Every add must count, every value must be the one its writer wrote, and once
// the clients have gone the process's sockets and threads are what they were before (the server is
// one poll loop: no thread per client). Prints the request rate (not asserted).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "distributed/store.h"

namespace chorus::distributed {
namespace {

using namespace std::chrono_literals;

// The process's open descriptors: all of them, or only its sockets (what a store connection holds;
// the C library may open a file of its own once, on first use, and keep it).
std::vector<std::string> descriptors() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0) out.push_back(target);
  }
  ::closedir(d);
  return out;
}

int open_sockets() {
  int n = 0;
  for (const std::string& target : descriptors()) n += target.rfind("socket:", 0) == 0;
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

// `clients` clients at once, `rounds` rounds each of add, set and a get of the neighbour's key;
// returns the seconds it took, and counts errors and wrong values.
double run_clients(TCPStore& server, int clients, int rounds, const std::string& tag, std::atomic<int>& errors,
                   std::atomic<int>& wrong) {
  std::barrier connected(clients);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      try {
        TCPStore store("127.0.0.1", server.port(), {.timeout = 60000ms});
        connected.arrive_and_wait();  // every connection open at once
        const int neighbour = (c + 1) % clients;
        auto key = [&](int who, int r) { return tag + "/" + std::to_string(who) + "/" + std::to_string(r); };
        for (int r = 0; r < rounds; ++r) {
          store.add(tag + "/total", 1);
          store.set(key(c, r), "value " + std::to_string(c * 1000 + r));
          // Waits (polling) for the neighbour's key of this round, then checks it.
          if (store.get_string(key(neighbour, r)) != "value " + std::to_string(neighbour * 1000 + r)) ++wrong;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "client %d: %s\n", c, e.what());
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("TCPStore serves 256 concurrent clients correctly and leaks nothing when they leave", "[distributed][store]") {
  constexpr int kClients = 256, kRounds = 40;
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 60000ms});
  std::atomic<int> errors{0}, wrong{0};
  // Before any client: the server's listening socket, and its own client connection (both ends).
  const int sockets_before = open_sockets(), threads_before = threads_now();
  run_clients(server, 8, 2, "warm", errors, wrong);
  const double seconds = run_clients(server, kClients, kRounds, "load", errors, wrong);
  CHECK(errors == 0);
  CHECK(wrong == 0);
  CHECK(server.add("load/total", 0) == kClients * kRounds);
  CHECK(server.num_keys() == 2 + 8 * 2 + kClients * kRounds);
  std::printf("store load: %d clients x %d rounds (add, set, get) in %.2f s: %.0f requests/s at least\n", kClients,
              kRounds, seconds, 3.0 * kClients * kRounds / seconds);
  // The server closes each connection when it sees its client's end: back to where it was (a
  // deadline only a leak reaches).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (open_sockets() > sockets_before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  INFO(fmt::format("descriptors now: {}", fmt::join(descriptors(), ", ")));
  CHECK(open_sockets() == sockets_before);
  CHECK(threads_now() == threads_before);
}

}  // namespace chorus::distributed
