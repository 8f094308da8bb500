// Store: the small key-value service processes rendezvous through (Gloo's connection setup and
// NCCL's unique id travel through it). TCPStore: rank 0 hosts a server at MASTER_ADDR:MASTER_PORT
// and every process (rank 0 included) is a client. FileStore: one shared file, for one machine.
// PrefixStore: a namespace inside another store (one per process group).
//
// A TCPStore with a job token (TCPStoreOptions::job_token; job_token.h says where processes find
// it) lets in only clients that prove they hold the same token, before reading any request of
// theirs (store_auth.h); others are refused with a line on the server's stderr, and the server
// keeps serving the job. Given a loopback MASTER_ADDR, the server listens on loopback only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <mutex>
#include <vector>

namespace chorus::distributed {

using Bytes = std::vector<uint8_t>;
inline constexpr std::chrono::milliseconds kDefaultStoreTimeout{300000};

class Store {
 public:
  explicit Store(std::chrono::milliseconds timeout = kDefaultStoreTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits (up to the store's timeout) for the key, then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at key (0 if absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to `desired` if its current value equals `expected` (an empty `expected` means "key
  // absent"); returns the value the key holds afterwards.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // True if every key exists now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;
  // Waits until every key exists; throws chorus::Error naming the missing keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 protected:
  std::chrono::milliseconds timeout_;
};

struct TCPStoreOptions {
  bool is_server = false;  // this process hosts the server (rank 0)
  int num_workers = -1;    // if > 0, the constructor waits until this many clients have connected
  std::chrono::milliseconds timeout = kDefaultStoreTimeout;
  // Frames larger than this are rejected (the connection is dropped, the server keeps running).
  uint32_t max_frame_bytes = 256u << 20;
  // The job's secret (job_token_from_env()). Server: "" lets in anyone who reaches it (as before
  // the token existed); otherwise only clients with the same token. Client: the token it proves.
  std::string job_token{};
};

class TCPStore : public Store {
 public:
  // Port 0 with is_server picks a free port (see port()). The server listens on `host`'s address
  // when that is a loopback one (127.0.0.1, ::1, localhost: nothing off this machine can reach a
  // store its clients find there), on every interface otherwise. A store that refuses this
  // process's token (or lack of one) -> chorus::Error at once, without the connect retries.
  TCPStore(const std::string& host, int port, TCPStoreOptions options = {});
  ~TCPStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::set;
  using Store::wait;
  int port() const { return port_; }

  class Server;

 private:
  Bytes request(uint8_t command, const std::vector<Bytes>& args);
  // The job-token handshake (store_auth.h), right after connecting.
  void handshake(const std::string& who);

  std::string host_;
  int port_;
  TCPStoreOptions options_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
  std::unique_ptr<std::mutex> mutex_;
};

class FileStore : public Store {
 public:
  // All processes pass the same path; num_workers is informational (cleanup is the user's).
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = kDefaultStoreTimeout);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::set;
  using Store::wait;

 private:
  std::string path_;
};

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::set;
  using Store::wait;
  const std::shared_ptr<Store>& underlying() const { return store_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace chorus::distributed
