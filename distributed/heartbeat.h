// Heartbeats: a rank whose process stops (SIGSTOP, a frozen machine or container, a lost network) is
// noticed within seconds and named, instead of surfacing as the next collective's timeout minutes
// later. A process whose main thread alone is stuck (a deadlock in user code, a hung device call)
// still beats from this thread: the collective's timeout remains what ends that, and the flight
// recorder's desync report (flight_recorder.h, answered from this thread) names the rank then.
//
// init_process_group starts one for every multi-process job whose TCPStore it made (env:// and
// tcp://). Each rank runs one thread with its own connection to the job's store. Every `interval` it
// adds 1 to its counter ("<prefix>/<rank>") and reads the counter of the next rank on the ring that
// has not left, and the job's failure key:
// - a watched rank whose counter has not moved for `misses` x `interval` is reported: the message
//   (naming the rank, how long it has been silent, and who noticed) goes to the failure key, so
//   every other rank stops with the same words within one interval;
// - a store that has not answered for that long (rank 0 hosts it) is reported as rank 0 being silent;
// - a report calls `on_silence`, which by default prints it and ends the process with exit code
//   kHeartbeatExitCode (as PyTorch's NCCL watchdog tears a process down): chorusrun then stops the
//   job, or restarts it with --max-restarts.
// A rank that leaves cleanly (destroy_process_group, or the end of the program) marks itself as left
// first and is not reported; a store that closes or refuses the connection (its host exited) ends
// the heartbeat quietly, since the collectives then fail on their own. After a request times out the
// connection is made again (a late reply must not be read as the next request's). Settings: CHORUS_HEARTBEAT_S (the interval
// in seconds, default 5; 0 turns heartbeats off) and CHORUS_HEARTBEAT_MISSES (default 3).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/store.h"

namespace chorus::distributed {

inline constexpr int kHeartbeatExitCode = 75;

struct HeartbeatOptions {
  std::chrono::milliseconds interval{5000};
  int misses = 3;
  // Called once, on the heartbeat's thread, with the report. Null: print it to stderr and end the
  // process with kHeartbeatExitCode.
  std::function<void(const std::string& message)> on_silence{};
  // Keys live under this prefix of the store (one job may start several heartbeats in turn).
  std::string prefix = "heartbeat";
  // Called every interval, on the heartbeat's thread, with its store connection, after the beat:
  // init_process_group answers the flight recorder's requests for this rank's records here
  // (flight_recorder.h), so a rank whose main thread is stuck still answers. Its store errors count
  // as the heartbeat's own.
  std::function<void(Store& store)> on_beat{};
};

class Heartbeat {
 public:
  // `connect` makes a store connection of the heartbeat's own (its requests must not queue behind
  // the program's, and their timeout should be about one interval); called again after a failure.
  Heartbeat(std::function<std::shared_ptr<Store>()> connect, int rank, int world_size, HeartbeatOptions options);
  // Stops the thread (it checks for that between its store requests), then marks this rank as left.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // CHORUS_HEARTBEAT_S and CHORUS_HEARTBEAT_MISSES; nullopt when CHORUS_HEARTBEAT_S is 0. A malformed
  // value is a chorus::Error naming the variable and what is expected.
  static std::optional<HeartbeatOptions> from_env();

 private:
  void run();
  void report(const std::string& message);
  // After the store dropped a request: the message naming a key of `keys` that holds something
  // other than a counter (the store refuses to add to it), or nullopt (the store is gone).
  std::optional<std::string> foreign_counter(const std::vector<std::string>& keys);

  std::function<std::shared_ptr<Store>()> connect_;
  std::shared_ptr<Store> store_;  // the thread's connection (the destructor's after the join)
  bool store_gone_ = false;       // the store closed or refused: its host has exited (thread's, then destructor's)
  const int rank_, world_size_;
  HeartbeatOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace chorus::distributed
