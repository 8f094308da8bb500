// Stores. The TCP protocol is deliberately small: every request and reply is a frame
//   [u32 body length][body]   with body = [u8 command][u32 arg count]([u32 length][bytes])*
// in little-endian. The server is one thread polling all connections; a frame longer than
// max_frame_bytes or whose arguments overrun it is a protocol error that closes that one connection
// (a stray or hostile client cannot crash or stall the server). Waiting for keys is done by the
// client (check, back off, retry) so the server never blocks. With a job token, each connection
// passes the handshake of store_auth.h before the server reads a request from it.
#include "distributed/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "distributed/process_group.h"
#include "distributed/store_auth.h"
#include "distributed/store_protocol.h"
#include "tensor/error.h"

namespace chorus::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using namespace store_protocol;

Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Blocking I/O with a deadline.
void send_all(int fd, const uint8_t* data, size_t n, Clock::time_point deadline, const std::string& who) {
  while (n > 0) {
    pollfd p{fd, POLLOUT, 0};
    const int ms = static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
    if (::poll(&p, 1, ms) <= 0) fail("{}: timed out sending to the store", who);
    const ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail("{}: send failed: {}", who, std::strerror(errno));
    }
    data += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, uint8_t* data, size_t n, Clock::time_point deadline, const std::string& who) {
  while (n > 0) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
    const int r = ::poll(&p, 1, ms);
    if (r == 0) fail("{}: timed out waiting for the store server's reply", who);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("{}: poll failed: {}", who, std::strerror(errno));
    }
    const ssize_t k = ::recv(fd, data, n, 0);
    if (k == 0) fail("{}: the store server closed the connection (did rank 0 exit?)", who);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail("{}: recv failed: {}", who, std::strerror(errno));
    }
    data += k;
    n -= static_cast<size_t>(k);
  }
}

// The loopback address `host` names, when it is a loopback address written out (127.x.y.z, ::1) or
// "localhost" and every address it resolves to is a loopback one (an IPv4 one preferred: clients
// try each address of the name in turn); nullopt otherwise, or when it does not resolve (the server
// then listens on every interface, as it always did). Other names are not trusted to be local
// only: Debian maps the machine's own name to 127.0.1.1, and other nodes reach that name by the
// machine's real address.
std::optional<sockaddr_storage> loopback_address(const std::string& host) {
  in_addr v4_literal{};
  in6_addr v6_literal{};
  const bool literal =
      ::inet_pton(AF_INET, host.c_str(), &v4_literal) == 1 || ::inet_pton(AF_INET6, host.c_str(), &v6_literal) == 1;
  if (!literal && host != "localhost") return std::nullopt;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return std::nullopt;
  std::optional<sockaddr_storage> v4, v6;
  bool all_loopback = res != nullptr;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage a{};
    std::memcpy(&a, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET) {
      const bool loop = (ntohl(reinterpret_cast<sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
      all_loopback = all_loopback && loop;
      if (loop && !v4) v4 = a;
    } else if (ai->ai_family == AF_INET6) {
      const bool loop = IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr);
      all_loopback = all_loopback && loop;
      if (loop && !v6) v6 = a;
    } else {
      all_loopback = false;
    }
  }
  ::freeaddrinfo(res);
  if (!all_loopback) return std::nullopt;
  return v4 ? v4 : v6;
}

// "address:port" of a peer, for the server's log (an IPv4 client of the dual-stack socket as IPv4).
std::string peer_name(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port = ntohs(a->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) ::inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], text, sizeof(text));
    else ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port = ntohs(a->sin6_port);
  }
  if (std::strchr(text, ':') != nullptr) return fmt::format("[{}]:{}", text, port);
  return fmt::format("{}:{}", text, port);
}

}  // namespace

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(1);
  while (!check(keys)) {
    if (Clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (const auto& k : keys) if (!check({k})) missing.push_back(k);
      fail("Store::wait: keys [{}] were not set within {} ms", fmt::join(missing, ", "), timeout.count());
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

// ------------------------------------------------------------------------------------ server
class TCPStore::Server {
 public:
  Server(const std::string& host, int port, uint32_t max_frame, std::string job_token)
      : max_frame_(max_frame), job_token_(std::move(job_token)) {
    const std::optional<sockaddr_storage> loopback = loopback_address(host);
    listen_fd_ = ::socket(loopback ? loopback->ss_family : AF_INET6, SOCK_STREAM, 0);
    bool v6 = listen_fd_ >= 0;
    if (!v6 && !loopback) listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd_ < 0) fail("TCPStore server: socket() failed: {}", std::strerror(errno));
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (loopback) {
      sockaddr_storage addr = *loopback;
      socklen_t len = sizeof(sockaddr_in);
      if (addr.ss_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
        len = sizeof(sockaddr_in6);
      } else {
        reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
      }
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len);
    } else if (v6) {
      int zero = 0;  // accept IPv4 too
      ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_addr = in6addr_any;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    } else {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    }
    if (rc != 0) {
      const int err = errno;
      ::close(listen_fd_);
      fail("TCPStore server: cannot bind port {}: {} (is another job using MASTER_PORT={}?)", port, std::strerror(err), port);
    }
    if (::listen(listen_fd_, 1024) != 0) fail("TCPStore server: listen failed: {}", std::strerror(errno));
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    if (::pipe(wake_) != 0) fail("TCPStore server: pipe failed: {}", std::strerror(errno));
    thread_ = std::thread([this] { loop(); });
  }

  ~Server() {
    stop_ = true;
    const char c = 0;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
    for (auto& [fd, client] : clients_) ::close(fd);
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  int port() const { return port_; }

 private:
  // What the server knows of one connection: the bytes it sent that are not answered yet, and,
  // with a job token, the handshake it has not finished (null once it has).
  struct Client {
    Bytes buffer;
    std::unique_ptr<store_auth::ServerHandshake> handshake;
    std::string peer;
  };

  void loop() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      for (auto& [fd, client] : clients_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) break;
      if (fds[0].revents & POLLIN) {
        sockaddr_storage peer{};
        socklen_t peer_len = sizeof(peer);
        const int fd = ::accept(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len);
        if (fd >= 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          Client& client = clients_[fd];
          client.peer = peer_name(peer);
          if (!job_token_.empty()) client.handshake = std::make_unique<store_auth::ServerHandshake>(job_token_);
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (!serve(fds[i].fd)) {
          ::close(fds[i].fd);
          clients_.erase(fds[i].fd);
        }
      }
    }
  }

  // Reads what is available from one client and answers complete frames; false drops the client.
  // A client still in its handshake reaches nothing else: the table sees only what an
  // authenticated client sends after it.
  bool serve(int fd) {
    uint8_t chunk[65536];
    const ssize_t k = ::recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (k == 0) return false;
    if (k < 0) return errno == EAGAIN || errno == EINTR;
    Client& client = clients_[fd];
    Bytes& buf = client.buffer;
    buf.insert(buf.end(), chunk, chunk + k);
    std::vector<Bytes> replies;
    bool ok = true;
    if (client.handshake) {
      std::string why;
      switch (client.handshake->feed(buf, replies, why)) {
        case store_auth::ServerHandshake::State::kWaiting:
          break;
        case store_auth::ServerHandshake::State::kAccepted:
          client.handshake.reset();
          break;
        case store_auth::ServerHandshake::State::kRefused:
          // Said on stderr, which chorusrun prefixes with the hosting rank; the job goes on.
          std::fprintf(stderr, "store: refused a client from %s: %s\n", client.peer.c_str(), why.c_str());
          std::fflush(stderr);
          ok = false;
          break;
      }
    }
    if (ok && !client.handshake) ok = serve_frames(buf, max_frame_, table_, replies);
    for (const Bytes& frame : replies) {
      try {
        send_all(fd, frame.data(), frame.size(), Clock::now() + std::chrono::seconds(30), "TCPStore server");
      } catch (const Error&) {
        return false;
      }
    }
    return ok;
  }

  uint32_t max_frame_;
  std::string job_token_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::map<int, Client> clients_;
  Table table_;
};

// ------------------------------------------------------------------------------------ client
TCPStore::TCPStore(const std::string& host, int port, TCPStoreOptions options)
    : Store(options.timeout), host_(host), port_(port), options_(options), mutex_(std::make_unique<std::mutex>()) {
  ignore_sigpipe();
  if (options.is_server) {
    server_ = std::make_unique<Server>(host, port, options.max_frame_bytes, options.job_token);
    port_ = server_->port();
  }
  // Connect, retrying until the timeout: workers usually start before rank 0's server is up.
  const auto deadline = Clock::now() + options.timeout;
  const std::string who = fmt::format("TCPStore({}:{})", host_, port_);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error;
  while (true) {
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* ai = res; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline) {
      fail("{}: could not connect within {} ms ({}); is rank 0 running and MASTER_ADDR/MASTER_PORT right?", who,
           options.timeout.count(), last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  try {
    handshake(who);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  if (options.is_server && options.num_workers > 0) {
    // Every process (this one included) checks in; the server waits for all of them.
    add("__chorus_workers", 1);
    const auto until = Clock::now() + options.timeout;
    while (add("__chorus_workers", 0) < options.num_workers) {
      if (Clock::now() >= until) {
        fail("{}: only {} of {} workers connected within {} ms", who, add("__chorus_workers", 0), options.num_workers,
             options.timeout.count());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } else if (options.num_workers > 0) {
    add("__chorus_workers", 1);
  }
}

TCPStore::~TCPStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TCPStore::handshake(const std::string& who) {
  store_auth::client_handshake(options_.job_token, fmt::format("{}:{}", host_, port_),
                               [&](uint8_t command, const std::vector<Bytes>& args) {
                                 try {
                                   return request(command, args);
                                 } catch (const Error& e) {
                                   fail("{}: lost the connection during the job-token handshake: {}", who, e.what());
                                 }
                               });
}

Bytes TCPStore::request(uint8_t command, const std::vector<Bytes>& args) {
  std::lock_guard<std::mutex> lock(*mutex_);
  const std::string who = fmt::format("TCPStore({}:{})", host_, port_);
  const Bytes frame = encode(command, args);
  const auto deadline = Clock::now() + timeout_;
  send_all(fd_, frame.data(), frame.size(), deadline, who);
  uint8_t header[4];
  recv_all(fd_, header, 4, deadline, who);
  const uint32_t len = get_u32(header);
  if (len > options_.max_frame_bytes) fail("{}: reply of {} bytes exceeds the frame limit", who, len);
  Bytes reply(len);
  if (len > 0) recv_all(fd_, reply.data(), len, deadline, who);
  return reply;
}

void TCPStore::set(const std::string& key, const Bytes& value) { request(kSet, {to_bytes(key), value}); }

Bytes TCPStore::get(const std::string& key) {
  const auto deadline = Clock::now() + timeout_;
  auto backoff = std::chrono::milliseconds(1);
  while (true) {
    Bytes r = request(kGet, {to_bytes(key)});
    if (!r.empty() && r[0] == 1) return Bytes(r.begin() + 1, r.end());
    if (Clock::now() >= deadline) fail("TCPStore::get: key '{}' was not set within {} ms", key, timeout_.count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

int64_t TCPStore::add(const std::string& key, int64_t delta) { return bytes_i64(request(kAdd, {to_bytes(key), i64_bytes(delta)})); }

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return request(kCompareSet, {to_bytes(key), expected, desired});
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  std::vector<Bytes> args;
  for (const auto& k : keys) args.push_back(to_bytes(k));
  Bytes r = request(kCheck, args);
  return !r.empty() && r[0] == 1;
}

bool TCPStore::delete_key(const std::string& key) {
  Bytes r = request(kDelete, {to_bytes(key)});
  return !r.empty() && r[0] == 1;
}

int64_t TCPStore::num_keys() { return bytes_i64(request(kNumKeys, {})); }

// ------------------------------------------------------------------------------------ file store
namespace {

// The file is a log of records [u32 key length][key][u32 value length or 0xffffffff = deleted][value];
// the last record of a key wins. Every operation holds an flock for its whole read-modify-write.
class LockedFile {
 public:
  LockedFile(const std::string& path, const char* who) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("{}: cannot open '{}': {}", who, path, std::strerror(errno));
    if (::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fail("{}: cannot lock '{}': {}", who, path, std::strerror(errno));
    }
  }
  ~LockedFile() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  std::map<std::string, Bytes> read(const char* who) {
    std::map<std::string, Bytes> out;
    Bytes all;
    ::lseek(fd_, 0, SEEK_SET);
    uint8_t buf[65536];
    ssize_t k;
    while ((k = ::read(fd_, buf, sizeof(buf))) > 0) all.insert(all.end(), buf, buf + k);
    size_t pos = 0;
    while (pos < all.size()) {
      if (pos + 4 > all.size()) fail("{}: '{}' is corrupt (truncated record)", who, path_);
      const uint32_t kl = get_u32(&all[pos]);
      pos += 4;
      if (pos + kl + 4 > all.size()) fail("{}: '{}' is corrupt (truncated key)", who, path_);
      std::string key(all.begin() + static_cast<std::ptrdiff_t>(pos), all.begin() + static_cast<std::ptrdiff_t>(pos + kl));
      pos += kl;
      const uint32_t vl = get_u32(&all[pos]);
      pos += 4;
      if (vl == 0xffffffffu) {
        out.erase(key);
        continue;
      }
      if (pos + vl > all.size()) fail("{}: '{}' is corrupt (truncated value)", who, path_);
      out[key] = Bytes(all.begin() + static_cast<std::ptrdiff_t>(pos), all.begin() + static_cast<std::ptrdiff_t>(pos + vl));
      pos += vl;
    }
    return out;
  }
  void append(const std::string& key, const Bytes* value, const char* who) {
    Bytes rec;
    put_u32(rec, static_cast<uint32_t>(key.size()));
    rec.insert(rec.end(), key.begin(), key.end());
    put_u32(rec, value ? static_cast<uint32_t>(value->size()) : 0xffffffffu);
    if (value) rec.insert(rec.end(), value->begin(), value->end());
    ::lseek(fd_, 0, SEEK_END);
    size_t off = 0;
    while (off < rec.size()) {
      const ssize_t k = ::write(fd_, rec.data() + off, rec.size() - off);
      if (k < 0) {
        if (errno == EINTR) continue;
        fail("{}: cannot write '{}': {}", who, path_, std::strerror(errno));
      }
      off += static_cast<size_t>(k);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout) : Store(timeout), path_(std::move(path)) {
  LockedFile f(path_, "FileStore");  // creates it, and proves we can lock it
}

void FileStore::set(const std::string& key, const Bytes& value) {
  LockedFile f(path_, "FileStore::set");
  f.append(key, &value, "FileStore::set");
}

Bytes FileStore::get(const std::string& key) {
  wait({key});
  LockedFile f(path_, "FileStore::get");
  auto data = f.read("FileStore::get");
  auto it = data.find(key);
  if (it == data.end()) fail("FileStore::get: key '{}' disappeared while reading", key);
  return it->second;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  LockedFile f(path_, "FileStore::add");
  auto data = f.read("FileStore::add");
  int64_t v = 0;
  if (auto it = data.find(key); it != data.end()) v = bytes_i64(it->second);
  v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(delta));  // wraps, no UB
  Bytes b = i64_bytes(v);
  f.append(key, &b, "FileStore::add");
  return v;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  LockedFile f(path_, "FileStore::compare_set");
  auto data = f.read("FileStore::compare_set");
  auto it = data.find(key);
  const bool matches = it == data.end() ? expected.empty() : it->second == expected;
  if (matches) {
    f.append(key, &desired, "FileStore::compare_set");
    return desired;
  }
  return it == data.end() ? Bytes() : it->second;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  LockedFile f(path_, "FileStore::check");
  auto data = f.read("FileStore::check");
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
}

bool FileStore::delete_key(const std::string& key) {
  LockedFile f(path_, "FileStore::delete_key");
  auto data = f.read("FileStore::delete_key");
  if (!data.count(key)) return false;
  f.append(key, nullptr, "FileStore::delete_key");
  return true;
}

int64_t FileStore::num_keys() {
  LockedFile f(path_, "FileStore::num_keys");
  return static_cast<int64_t>(f.read("FileStore::num_keys").size());
}

// ------------------------------------------------------------------------------------ prefix store
PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store ? store->timeout() : kDefaultStoreTimeout), prefix_(std::move(prefix)), store_(std::move(store)) {
  if (!store_) fail("PrefixStore: the underlying store is null");
}

void PrefixStore::set(const std::string& k, const Bytes& value) { store_->set(key(k), value); }
Bytes PrefixStore::get(const std::string& k) { return store_->get(key(k)); }
int64_t PrefixStore::add(const std::string& k, int64_t delta) { return store_->add(key(k), delta); }
Bytes PrefixStore::compare_set(const std::string& k, const Bytes& e, const Bytes& d) { return store_->compare_set(key(k), e, d); }
bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(key(k));
  return store_->check(full);
}
bool PrefixStore::delete_key(const std::string& k) { return store_->delete_key(key(k)); }
int64_t PrefixStore::num_keys() { return store_->num_keys(); }
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(key(k));
  store_->wait(full, timeout);
}

}  // namespace chorus::distributed
