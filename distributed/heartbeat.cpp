#include "distributed/heartbeat.h"

#include <cstdio>
#include <cstdlib>

#include "tensor/error.h"

namespace chorus::distributed {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Heartbeat::Heartbeat(std::function<std::shared_ptr<Store>()> connect, int rank, int world_size, HeartbeatOptions options)
    : connect_(std::move(connect)), rank_(rank), world_size_(world_size), options_(std::move(options)) {
  if (!connect_) fail("Heartbeat: no way to connect to the store");
  if (world_size_ < 2 || rank_ < 0 || rank_ >= world_size_) {
    fail("Heartbeat: rank {} of world size {}: expected a rank in [0, world size) and at least 2 ranks", rank_, world_size_);
  }
  if (options_.interval.count() <= 0 || options_.misses < 1) {
    fail("Heartbeat: interval {} ms and misses {} must be positive", options_.interval.count(), options_.misses);
  }
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();  // within one store request: the thread checks stop_ between them
  // Then "left", on the thread's connection (or a new one if a failure dropped it). Its last beat is
  // at most an interval old, so the watcher cannot have counted `misses` silent intervals yet.
  if (store_gone_) return;  // the store's host has exited: nobody is left to watch this rank
  try {
    if (!store_) store_ = connect_();
    store_->set(fmt::format("{}/{}/left", options_.prefix, rank_), std::string("1"));
  } catch (const std::exception&) {
    // The store went away meanwhile.
  }
}

std::optional<HeartbeatOptions> Heartbeat::from_env() {
  HeartbeatOptions o;
  if (const char* s = std::getenv("CHORUS_HEARTBEAT_S"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (*end != '\0' || !(v >= 0) || v > 3600) {
      fail("CHORUS_HEARTBEAT_S='{}': expected the heartbeat interval in seconds, from 0 (off) to 3600", s);
    }
    if (v == 0) return std::nullopt;
    o.interval = std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(v * 1000)));
  }
  if (const char* s = std::getenv("CHORUS_HEARTBEAT_MISSES"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (*end != '\0' || v < 1 || v > 1000) {
      fail("CHORUS_HEARTBEAT_MISSES='{}': expected how many intervals a rank may miss, 1 to 1000", s);
    }
    o.misses = static_cast<int>(v);
  }
  return o;
}

void Heartbeat::report(const std::string& message) {
  if (options_.on_silence) {
    options_.on_silence(message);
    return;
  }
  std::fprintf(stderr, "chorus: %s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(kHeartbeatExitCode);
}

std::optional<std::string> Heartbeat::foreign_counter(const std::vector<std::string>& keys) {
  try {
    std::shared_ptr<Store> store = connect_();
    for (const std::string& key : keys) {
      if (!store->check({key})) continue;
      const Bytes value = store->get(key);
      if (value.size() == 8) continue;
      std::string shown;
      for (uint8_t c : value) shown += c >= 32 && c < 127 ? static_cast<char>(c) : '?';
      if (shown.size() > 40) shown = shown.substr(0, 40) + "...";
      return fmt::format(
          "heartbeat: the store key '{}' holds {} bytes ('{}'), not the 8-byte counter the heartbeats keep there: "
          "another program writes into this job's store (give each job its own MASTER_PORT); noticed by rank {}",
          key, value.size(), shown, rank_);
    }
  } catch (const std::exception&) {
    // The store is gone indeed.
  }
  return std::nullopt;
}

void Heartbeat::run() {
  const auto window = options_.interval * options_.misses;
  const std::string failure_key = options_.prefix + "/failure";
  const auto counter_key = [&](int r) { return fmt::format("{}/{}", options_.prefix, r); };
  const auto left_key = [&](int r) { return fmt::format("{}/{}/left", options_.prefix, r); };
  int watched = (rank_ + 1) % world_size_;  // the next rank on the ring that has not left
  int64_t last_value = -1;
  Clock::time_point changed_at = Clock::now(), answered_at = Clock::now();
  // Once it has reported, or the store has gone, the thread only waits to be stopped: it never ends
  // before the destructor joins it (a thread that ended unjoined is a leak to ThreadSanitizer when
  // a process leaves through _exit).
  bool done = false;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (done) {
      wake_.wait(lock, [this] { return stop_.load(); });
      break;
    }
    lock.unlock();
    std::optional<std::string> message;
    try {
      if (!store_) store_ = connect_();
      store_->add(counter_key(rank_), 1);
      if (options_.on_beat && !stop_) options_.on_beat(*store_);
      if (stop_) continue;
      if (store_->check({failure_key})) {
        message = store_->get_string(failure_key);  // another rank's report: stop with its words
      } else if (watched != rank_) {
        const int64_t value = store_->add(counter_key(watched), 0);
        const auto now = Clock::now();
        if (value != last_value) {
          last_value = value;
          changed_at = now;
        } else if (now - changed_at >= window && !stop_) {
          if (store_->check({left_key(watched)})) {
            watched = (watched + 1) % world_size_;  // it finished cleanly: watch the next one
            last_value = -1;
            changed_at = now;
          } else {
            const std::string mine = fmt::format(
                "heartbeat: rank {} has sent no heartbeat for {:.1f} s ({} intervals of {:.1f} s): the process is "
                "stopped (e.g. SIGSTOP), frozen or cut off; noticed by rank {}",
                watched, seconds(now - changed_at), options_.misses, seconds(options_.interval), rank_);
            // The first report stands: if another rank wrote one meanwhile, every rank says the same.
            const Bytes first = store_->compare_set(failure_key, {}, Bytes(mine.begin(), mine.end()));
            message = std::string(first.begin(), first.end());
          }
        }
      }
      answered_at = Clock::now();
    } catch (const std::exception& e) {
      store_.reset();  // a timed-out request's late reply would be read as the next one's
      const std::string what = e.what();
      if (what.find("timed out") == std::string::npos) {
        // Closed or refused: the store's host (rank 0) has exited, or it dropped the connection
        // because a counter holds what is not a counter (someone else wrote the key).
        message = foreign_counter({counter_key(rank_), counter_key(watched)});
        store_gone_ = !message.has_value();
      } else if (Clock::now() - answered_at >= window) {
        message = fmt::format(
            "heartbeat: the job's store (hosted by rank 0) has not answered for {:.1f} s: rank 0's process is "
            "stopped (e.g. SIGSTOP), frozen or cut off; noticed by rank {}",
            seconds(Clock::now() - answered_at), rank_);
      }
    }
    if (message && !stop_) report(*message);
    done = message.has_value() || store_gone_;
    lock.lock();
    if (done) continue;
    wake_.wait_for(lock, options_.interval, [this] { return stop_.load(); });
  }
}

}  // namespace chorus::distributed
