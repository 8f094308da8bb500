// Stores over real sockets and files: TCPStore's semantics with many concurrent clients, timeouts
// that name the missing keys, malformed and oversized frames that close one connection without
// hurting the server, FileStore across instances, PrefixStore's namespacing; with a job token,
// only clients that hold it get in (store_auth.h), and a loopback store listens on loopback only.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "distributed/store.h"
#include "distributed/store_auth.h"
#include "distributed/store_protocol.h"
#include "tests/distributed/worker_launcher.h"

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

// What the server says on stderr (its thread writes there) while one of these lives: fd 2 goes to
// a file, and comes back on destruction.
class StderrCapture {
 public:
  StderrCapture() {
    const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
    path_ = dir + "/store_test_stderr_" + std::to_string(::getpid());
    std::fflush(stderr);
    saved_ = ::dup(2);
    FILE* f = std::fopen(path_.c_str(), "w");
    ::dup2(fileno(f), 2);
    std::fclose(f);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    std::fflush(stderr);
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }

 private:
  std::string path_;
  int saved_ = -1;
};

TEST_CASE("TCPStore with a job token: clients holding the same token get in and see the store's contract",
          "[distributed][store][job_token]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 5000ms, .job_token = "the job's secret"});
  TCPStore client("127.0.0.1", server.port(), {.timeout = 5000ms, .job_token = "the job's secret"});
  check_semantics(server, client);
}

TEST_CASE("TCPStore with a job token refuses a client with no token or a wrong one, logs it, and keeps serving the "
          "job's clients",
          "[distributed][store][job_token]") {
  StderrCapture log;
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 5000ms, .job_token = "right"});
  TCPStore good("127.0.0.1", server.port(), {.timeout = 5000ms, .job_token = "right"});
  good.set("before", "1");
  const std::string where = "the store at 127.0.0.1:" + std::to_string(server.port()) + " refused this process";
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(TCPStore("127.0.0.1", server.port(), {.timeout = 30000ms}),
                    Catch::Contains(where) && Catch::Contains("wrong or missing job token") &&
                        Catch::Contains("CHORUS_JOB_TOKEN / --job-token-file") && Catch::Contains("this process has none"));
  CHECK_THROWS_WITH(TCPStore("127.0.0.1", server.port(), {.timeout = 30000ms, .job_token = "wrong"}),
                    Catch::Contains(where) && Catch::Contains("wrong or missing job token"));
  // Refused at once, not after the 30 s of connect retries.
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  {  // a request without the handshake (a raw or foreign client) is never read: the key stays unset
    int fd = raw_connect(server.port());
    const Bytes frame = store_protocol::encode(store_protocol::kSet, {bytes("intruder"), bytes("x")});
    CHECK(::write(fd, frame.data(), frame.size()) == static_cast<ssize_t>(frame.size()));
    CHECK(closed_by_server(fd));
    ::close(fd);
  }
  {  // a large frame before authenticating is refused at its header, not buffered
    int fd = raw_connect(server.port());
    const uint8_t header[4] = {0, 0, 0x10, 0};  // 1 MiB
    CHECK(::write(fd, header, 4) == 4);
    CHECK(closed_by_server(fd));
    ::close(fd);
  }
  // The job's client was never disturbed.
  CHECK(good.get_string("before") == "1");
  good.set("after", "2");
  CHECK(server.get_string("after") == "2");
  CHECK_FALSE(good.check({"intruder"}));
  TCPStore late("127.0.0.1", server.port(), {.timeout = 5000ms, .job_token = "right"});
  CHECK(late.get_string("after") == "2");
  const std::string said = log.text();
  log.restore();
  INFO(said);
  const std::string refused = "store: refused a client from 127.0.0.1:";
  CHECK_THAT(said, Catch::Contains(refused) && Catch::Contains("it has no job token") &&
                       Catch::Contains("wrong job token") && Catch::Contains("without the job-token handshake") &&
                       Catch::Contains("a frame of 1048576 bytes before the job-token handshake"));
  size_t lines = 0;
  for (size_t at = said.find(refused); at != std::string::npos; at = said.find(refused, at + 1)) ++lines;
  CHECK(lines == 4);
}

TEST_CASE("a client with a job token fails at once, naming the reason, at a store that has none",
          "[distributed][store][job_token]") {
  TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 5000ms});
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(TCPStore("127.0.0.1", server.port(), {.timeout = 30000ms, .job_token = "mine"}),
                    Catch::Contains("has no job token, but this process has one"));
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  // Without a token on either side: as before the token existed.
  TCPStore open("127.0.0.1", server.port(), {.timeout = 5000ms});
  open.set("k", "v");
  CHECK(server.get_string("k") == "v");
}

// A process in the store's place that answers the handshake without knowing the token: the client
// must not trust it (the server proves itself too).
TEST_CASE("a client refuses a store that cannot prove it holds the job token", "[distributed][store][job_token]") {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  std::thread impostor([listener] {
    const int fd = ::accept(listener, nullptr, nullptr);
    // Reads one request frame, answers with `body`.
    auto answer = [fd](const Bytes& body) {
      uint8_t header[4];
      if (::recv(fd, header, 4, MSG_WAITALL) != 4) return;
      Bytes request(store_protocol::get_u32(header));
      if (!request.empty() && ::recv(fd, request.data(), request.size(), MSG_WAITALL) <= 0) return;
      Bytes frame;
      store_protocol::put_u32(frame, static_cast<uint32_t>(body.size()));
      frame.insert(frame.end(), body.begin(), body.end());
      (void)!::write(fd, frame.data(), frame.size());
    };
    Bytes challenge(1 + store_auth::kNonceBytes, 7);
    challenge[0] = 1;
    answer(challenge);
    Bytes accepted(33, 0);  // "accepted", with a proof it cannot compute
    accepted[0] = 1;
    answer(accepted);
    ::close(fd);
  });
  CHECK_THROWS_WITH(TCPStore("127.0.0.1", port, {.timeout = 5000ms, .job_token = "secret"}),
                    Catch::Contains("could not prove that it holds the job token"));
  impostor.join();
  ::close(listener);
}

TEST_CASE("a store given a loopback address listens on loopback only; any other, on every interface",
          "[distributed][store][job_token]") {
  {
    TCPStore server("127.0.0.1", 0, {.is_server = true, .timeout = 5000ms});
    CHECK(chorus::testing::listening_addresses(server.port()) == std::vector<std::string>{"0100007F"});  // 127.0.0.1
  }
  {
    TCPStore server("localhost", 0, {.is_server = true, .timeout = 5000ms});
    CHECK(chorus::testing::listening_addresses(server.port()) == std::vector<std::string>{"0100007F"});
    TCPStore client("localhost", server.port(), {.timeout = 5000ms});  // tries ::1, then 127.0.0.1
    client.set("k", "v");
  }
  {
    TCPStore server("0.0.0.0", 0, {.is_server = true, .timeout = 5000ms});
    CHECK(chorus::testing::listening_addresses(server.port()) == std::vector<std::string>{"00000000000000000000000000000000"});  // ::
    TCPStore client("127.0.0.1", server.port(), {.timeout = 5000ms});
    client.set("k", "v");
  }
}

}  // namespace
}  // namespace chorus::distributed
