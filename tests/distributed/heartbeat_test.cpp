// distributed::Heartbeat in one process, over a real TCPStore on loopback, with short intervals: a
// rank that never beats is named by the rank watching it and every rank reports the same words; a
// rank that leaves cleanly is not reported and its watcher moves on round the ring; a store that
// stops answering is reported; a store that goes away ends the heartbeat quietly; the settings come
// from the environment. (tests/distributed:chorusrun_test stops a real process with SIGSTOP.)
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>

#include "distributed/heartbeat.h"
#include "distributed/store.h"
#include "tensor/error.h"

using namespace chorus;
using namespace chorus::distributed;
using namespace std::chrono_literals;

namespace {

// What the heartbeats reported, by rank, and when (from the start).
struct Reports {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<int, std::string> message;
  std::map<int, double> seconds;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  HeartbeatOptions options(int rank, std::chrono::milliseconds interval = 100ms) {
    HeartbeatOptions o;
    o.interval = interval;
    o.misses = 3;
    o.on_silence = [this, rank](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      message[rank] = m;
      seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      changed.notify_all();
    };
    return o;
  }
  // Waits until `count` ranks have reported, or `limit`; true if they did.
  bool wait_for(size_t count, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, limit, [&] { return message.size() >= count; });
  }
};

// How a heartbeat connects to the store at `port` (again after a failure), timing requests out
// after `timeout` (one interval).
std::function<std::shared_ptr<Store>()> client(int port, std::chrono::milliseconds timeout = 100ms) {
  return [port, timeout] {
    return std::make_shared<TCPStore>("127.0.0.1", port, TCPStoreOptions{.is_server = false, .timeout = timeout});
  };
}

}  // namespace

TEST_CASE("heartbeat: a silent rank is named by its watcher, and every rank stops with the same report", "[heartbeat]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true});
  Reports reports;
  // Ranks 0 and 1 beat; rank 2 never does (as a process stopped right after joining).
  auto h0 = std::make_unique<Heartbeat>(client(server.port()), 0, 3, reports.options(0));
  auto h1 = std::make_unique<Heartbeat>(client(server.port()), 1, 3, reports.options(1));
  REQUIRE(reports.wait_for(2, 10s));
  const std::string expected = "heartbeat: rank 2 has sent no heartbeat for";
  CHECK_THAT(reports.message[1], Catch::StartsWith(expected) && Catch::Contains("(3 intervals of 0.1 s)") &&
                                     Catch::EndsWith("noticed by rank 1"));
  CHECK(reports.message[0] == reports.message[1]);  // rank 0 read rank 1's report from the store
  CHECK(reports.seconds[1] >= 0.3);  // not before 3 missed intervals
}

TEST_CASE("heartbeat: a rank that leaves cleanly is not reported", "[heartbeat]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true});
  Reports reports;
  // 1 s windows (4 intervals of 250 ms): a thread starved for a while (TSan, a loaded machine) must
  // not look silent in a case that asserts silence is absent.
  auto options = [&](int rank) {
    HeartbeatOptions o = reports.options(rank, 250ms);
    o.misses = 4;
    return o;
  };
  auto h0 = std::make_unique<Heartbeat>(client(server.port(), 250ms), 0, 3, options(0));
  auto h1 = std::make_unique<Heartbeat>(client(server.port(), 250ms), 1, 3, options(1));
  auto h2 = std::make_unique<Heartbeat>(client(server.port(), 250ms), 2, 3, options(2));
  CHECK_FALSE(reports.wait_for(1, 2000ms));  // two windows with everyone beating
  h2.reset();                                // rank 2 finishes first (destroy_process_group)
  CHECK_FALSE(reports.wait_for(1, 3000ms));  // three more: its watcher (rank 1) moved on to rank 0
}

TEST_CASE("heartbeat: past a rank that left, the watcher names the next silent one", "[heartbeat]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true});
  TCPStore elsewhere("127.0.0.1", 0, {.is_server = true});
  Reports reports;
  // Rank 0 beats into another store, so it is silent in this job's; rank 2, its only watcher,
  // leaves at once. Rank 1 watches rank 2, finds it left, moves on to rank 0 and names it.
  auto h0 = std::make_unique<Heartbeat>(client(elsewhere.port()), 0, 3, reports.options(0));
  auto h1 = std::make_unique<Heartbeat>(client(server.port()), 1, 3, reports.options(1));
  std::make_unique<Heartbeat>(client(server.port()), 2, 3, reports.options(2)).reset();
  REQUIRE(reports.wait_for(2, 10s));  // rank 1, and rank 0 (about rank 1, in the other store)
  std::lock_guard<std::mutex> lock(reports.mutex);
  REQUIRE(reports.message.count(1) == 1);
  CHECK_THAT(reports.message[1], Catch::StartsWith("heartbeat: rank 0 has sent no heartbeat") &&
                                     Catch::EndsWith("noticed by rank 1"));
  CHECK(reports.seconds[1] >= 0.6);  // a window on rank 2, then one on rank 0
  CHECK(reports.message.count(2) == 0);
}

TEST_CASE("heartbeat: a counter overwritten by a foreign value is named, not taken for a store that went away",
          "[heartbeat]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true});
  Reports reports;
  server.set("heartbeat/1", std::string("hello"));  // rank 1's counter, written by another program
  auto h0 = std::make_unique<Heartbeat>(client(server.port()), 0, 2, reports.options(0));
  REQUIRE(reports.wait_for(1, 10s));
  CHECK_THAT(reports.message[0], Catch::Equals("heartbeat: the store key 'heartbeat/1' holds 5 bytes ('hello'), not the "
                                               "8-byte counter the heartbeats keep there: another program writes into "
                                               "this job's store (give each job its own MASTER_PORT); noticed by rank 0"));
}

TEST_CASE("heartbeat: a store that stops answering is reported as rank 0 being silent", "[heartbeat]") {
  // A listening socket that never accepts: connections complete (the kernel's backlog), requests
  // are never answered, as with a rank 0 stopped while hosting the store.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  Reports reports;
  {
    auto h = std::make_unique<Heartbeat>(client(ntohs(addr.sin_port)), 1, 2, reports.options(1));
    REQUIRE(reports.wait_for(1, 10s));
  }
  ::close(fd);
  CHECK_THAT(reports.message[1], Catch::StartsWith("heartbeat: the job's store (hosted by rank 0) has not answered for") &&
                                     Catch::EndsWith("noticed by rank 1"));
  CHECK(reports.seconds[1] >= 0.3);
}

TEST_CASE("heartbeat: a store that goes away ends the heartbeats quietly", "[heartbeat]") {
  Reports reports;
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, TCPStoreOptions{.is_server = true});
  const int port = server->port();
  auto h0 = std::make_unique<Heartbeat>(client(port), 0, 2, reports.options(0));
  auto h1 = std::make_unique<Heartbeat>(client(port), 1, 2, reports.options(1));
  server.reset();  // rank 0's process ended, and with it the store
  CHECK_FALSE(reports.wait_for(1, 1500ms));  // five windows: no report (refused or closed is not silence)
  h0.reset();  // leaving with the store gone does not throw or hang
  h1.reset();
}

TEST_CASE("heartbeat: settings from the environment, refused with a message when malformed", "[heartbeat]") {
  ::unsetenv("CHORUS_HEARTBEAT_S");
  ::unsetenv("CHORUS_HEARTBEAT_MISSES");
  auto o = Heartbeat::from_env();
  REQUIRE(o.has_value());
  CHECK(o->interval == 5000ms);
  CHECK(o->misses == 3);
  ::setenv("CHORUS_HEARTBEAT_S", "0.25", 1);
  ::setenv("CHORUS_HEARTBEAT_MISSES", "4", 1);
  o = Heartbeat::from_env();
  REQUIRE(o.has_value());
  CHECK(o->interval == 250ms);
  CHECK(o->misses == 4);
  ::setenv("CHORUS_HEARTBEAT_S", "0", 1);
  CHECK_FALSE(Heartbeat::from_env().has_value());
  for (const char* bad : {"soon", "-1", "nan", "1e9"}) {
    ::setenv("CHORUS_HEARTBEAT_S", bad, 1);
    CHECK_THROWS_WITH(Heartbeat::from_env(), Catch::Contains(std::string("CHORUS_HEARTBEAT_S='") + bad + "'"));
  }
  ::setenv("CHORUS_HEARTBEAT_S", "1", 1);
  for (const char* bad : {"0", "x", "2.5"}) {
    ::setenv("CHORUS_HEARTBEAT_MISSES", bad, 1);
    CHECK_THROWS_WITH(Heartbeat::from_env(), Catch::Contains(std::string("CHORUS_HEARTBEAT_MISSES='") + bad + "'"));
  }
  ::unsetenv("CHORUS_HEARTBEAT_S");
  ::unsetenv("CHORUS_HEARTBEAT_MISSES");
  TCPStore server("127.0.0.1", 0, {.is_server = true});
  CHECK_THROWS_WITH(Heartbeat(client(server.port()), 0, 1, {}), Catch::Contains("at least 2 ranks"));
}
