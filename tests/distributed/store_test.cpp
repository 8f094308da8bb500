// Stores over real sockets and files: TCPStore's semantics with many concurrent clients, timeouts
// that name the missing keys, malformed and oversized frames that close one connection without
// hurting the server, FileStore across instances, PrefixStore's namespacing.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "distributed/store.h"

namespace chorus::distributed {
namespace {

using namespace std::chrono_literals;

std::string str(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Exercises the Store contract on any implementation.
void check_semantics(Store& a, Store& b) {
  a.set("k", "v1");
  CHECK(b.get_string("k") == "v1");
  b.set("k", "v2");  // overwrite
  CHECK(a.get_string("k") == "v2");
  CHECK(a.add("counter", 5) == 5);
  CHECK(b.add("counter", -2) == 3);
  CHECK(a.add("counter", 0) == 3);
  // compare_set: empty expected means "absent".
  CHECK(str(a.compare_set("cs", {}, bytes("first"))) == "first");
  CHECK(str(b.compare_set("cs", bytes("wrong"), bytes("second"))) == "first");
  CHECK(str(b.compare_set("cs", bytes("first"), bytes("second"))) == "second");
  CHECK(a.check({"k", "counter"}));
  CHECK_FALSE(a.check({"k", "missing"}));
  const int64_t keys = a.num_keys();
  CHECK(keys >= 3);
  CHECK(a.delete_key("k"));
  CHECK_FALSE(a.delete_key("k"));
  CHECK(b.num_keys() == keys - 1);
  // wait: returns once another client sets the key; times out naming the missing key.
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    b.set("late", "here");
  });
  a.wait({"late"}, 5000ms);
  setter.join();
  CHECK(a.get_string("late") == "here");
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(a.wait({"late", "never"}, 300ms), Catch::Contains("never"));
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  // Binary values survive.
  Bytes bin = {0, 255, 10, 0, 7};
  a.set("bin", bin);
  CHECK(b.get("bin") == bin);
}

TEST_CASE("TCPStore: set/get/add/compare_set/check/delete/num_keys/wait across clients", "[distributed][store]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 5000ms});
  TCPStore client("127.0.0.1", server.port(), {.timeout = 5000ms});
  check_semantics(server, client);
  // get of a key nobody sets times out with the key's name (the store's own timeout).
  TCPStore impatient("127.0.0.1", server.port(), {.timeout = 200ms});
  CHECK_THROWS_WITH(impatient.get("nobody"), Catch::Contains("nobody"));
}

TEST_CASE("TCPStore: many concurrent clients add atomically", "[distributed][store]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 10000ms});
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      try {
        TCPStore c("127.0.0.1", server.port(), {.timeout = 10000ms});
        for (int i = 0; i < 50; ++i) c.add("total", 1);
        c.set("done/" + std::to_string(t), "1");
      } catch (...) {
        ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  CHECK(server.add("total", 0) == 16 * 50);
}

int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

// True when the server closed the connection (read returns 0 or an error) within 3 s.
bool closed_by_server(int fd) {
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[64];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  return n <= 0;
}

TEST_CASE("TCPStore: malformed and oversized frames close that connection; the server keeps serving",
          "[distributed][store]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 5000ms, .max_frame_bytes = 1 << 20});
  server.set("alive", "yes");
  {  // a frame announcing 2 GiB
    int fd = raw_connect(server.port());
    const uint8_t frame[4] = {0, 0, 0, 0x80};
    CHECK(::write(fd, frame, 4) == 4);
    CHECK(closed_by_server(fd));
    ::close(fd);
  }
  {  // an argument whose length overruns its frame
    int fd = raw_connect(server.port());
    const uint8_t frame[] = {10, 0, 0, 0, /*cmd*/ 1, /*args*/ 1, 0, 0, 0, /*len*/ 200, 0, 0, 0, 'x'};
    CHECK(::write(fd, frame, sizeof(frame)) == static_cast<ssize_t>(sizeof(frame)));
    CHECK(closed_by_server(fd));
    ::close(fd);
  }
  {  // an unknown command
    int fd = raw_connect(server.port());
    const uint8_t frame[] = {5, 0, 0, 0, /*cmd*/ 99, 0, 0, 0, 0};
    CHECK(::write(fd, frame, sizeof(frame)) == static_cast<ssize_t>(sizeof(frame)));
    CHECK(closed_by_server(fd));
    ::close(fd);
  }
  {  // a client that connects and vanishes mid-frame
    int fd = raw_connect(server.port());
    const uint8_t partial[] = {50, 0, 0, 0, 1};
    CHECK(::write(fd, partial, sizeof(partial)) == static_cast<ssize_t>(sizeof(partial)));
    ::close(fd);
  }
  TCPStore client("127.0.0.1", server.port(), {.timeout = 5000ms});
  CHECK(client.get_string("alive") == "yes");
  client.set("after", "ok");
  CHECK(server.get_string("after") == "ok");
}

TEST_CASE("TCPStore: a client with no server fails within its timeout with a clear error", "[distributed][store]") {
  int port;
  {
    TCPStore probe("127.0.0.1", 0, {.is_server = true});
    port = probe.port();
  }  // closed: nobody listens there now
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(TCPStore("127.0.0.1", port, {.timeout = 500ms}),
                    Catch::Contains("could not connect") && Catch::Contains("MASTER_ADDR"));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("FileStore shares keys between instances on one path; PrefixStore namespaces them", "[distributed][store]") {
  const auto path = std::filesystem::temp_directory_path() / ("chorus_filestore_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  {
    FileStore a(path.string(), 5000ms), b(path.string(), 5000ms);
    check_semantics(a, b);
  }
  std::filesystem::remove(path);
  auto base = std::make_shared<TCPStore>("127.0.0.1", 0, TCPStoreOptions{.is_server = true, .timeout = 5000ms});
  PrefixStore p1("group_1", base), p2("group_2", base);
  p1.set("x", "one");
  p2.set("x", "two");
  CHECK(p1.get_string("x") == "one");
  CHECK(p2.get_string("x") == "two");
  CHECK(base->get_string("group_1/x") == "one");
  CHECK(p1.add("n", 3) == 3);
  CHECK_FALSE(p2.check({"n"}));
  PrefixStore q1("group_4", base), q2("group_4", base);  // the contract holds through a prefix
  check_semantics(q1, q2);
}

}  // namespace
}  // namespace chorus::distributed
