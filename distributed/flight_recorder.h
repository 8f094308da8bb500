// Flight recorder: every process keeps a ring of its last collectives (operation, sequence number,
// tensor sizes and dtypes, process group, and how far each got: issued, started, finished or
// failed), as PyTorch's NCCL flight recorder does. It answers the question a hung job raises: which
// rank did not enter collective #k, or entered a different one?
//
// - Recording: ProcessGroupGloo records every operation (CPU tensors, and sim/CUDA tensors staged
//   through Gloo). One mutex and two short strings per operation; CHORUS_FLIGHT_RECORDER_ENTRIES sets
//   the ring's size (default 2000; 0 turns the recorder off).
// - Dumps: on a collective's timeout, on SIGUSR1 (chorusrun forwards it to its workers), and when
//   another rank asks (below), the process writes its ring as JSON to
//   `$CHORUS_FLIGHT_RECORDER_FILE<rank>.json` (default prefix /tmp/chorus_flight_rank_), atomically.
//   `chorus_flight DUMP...` (distributed/launcher) prints them side by side as a table.
// - Desync report: when a collective times out, the rank publishes its recent records in the job's
//   store, asks every other rank to do the same (their heartbeat threads answer within one
//   interval, heartbeat.h, so a rank stuck in user code answers too), waits a bounded time (one
//   interval + 1 s, under the heartbeat's own window), and
//   appends to the timeout's error what the records say: which ranks never entered collective #k
//   (and their last one), which entered a different one, and the first sequence number at which
//   the ranks' records differ.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "distributed/store.h"
#include "tensor/tensor.h"

namespace chorus::distributed {

enum class FlightState { Issued, Started, Finished, Failed };
const char* flight_state_name(FlightState state);

struct FlightEntry {
  uint64_t id = 0;      // issue order in this process, from 1
  std::string group;    // the process group's name, the same on every rank ("default_pg", "group_1")
  uint64_t seq = 0;     // the collective's sequence number in its group (point-to-point: their own count)
  bool p2p = false;     // a send or receive (two ranks only: not compared across the group)
  std::string op;       // "allreduce(sum)", "broadcast(root=0)", "send(to 2)"
  std::string tensors;  // "float32[4],float32[2, 3]"
  FlightState state = FlightState::Issued;
  double issued_s = 0, started_s = 0, finished_s = 0;  // seconds since the Unix epoch; 0: not yet
  std::string error;                                   // a failed entry's error
  // What must agree across ranks for the same collective.
  std::string signature() const { return tensors.empty() ? op : op + " " + tensors; }
};

// One process's dump.
struct FlightDump {
  int rank = -1, world_size = -1;
  int pid = 0;
  std::string host, reason;
  double time_s = 0;
  size_t capacity = 0;
  uint64_t dropped = 0;  // entries that fell out of the ring before this dump
  std::vector<FlightEntry> entries;
};

std::string to_json(const FlightDump& dump);
// A dump read back; `source` names it in errors. Anything that is not a dump this version wrote is a
// chorus::Error naming the source, what was found and what was expected.
FlightDump parse_flight_dump(const std::string& text, const std::string& source);
// The dumps side by side: a row per (group, collective), a column per rank, rows where the ranks
// disagree marked. Point-to-point operations are listed per rank after the table.
std::string flight_table(const std::vector<FlightDump>& dumps);

// What a timed-out collective's records say, given each member's dump (nullopt: none arrived).
// `members` are the group's ranks in the exchange's numbering (the job's ranks), in group order.
std::string desync_report(const std::string& group, uint64_t seq, int me, const std::vector<int>& members,
                          const std::map<int, std::optional<FlightDump>>& dumps, std::chrono::milliseconds waited);

// Where ranks exchange their records: keys `<prefix>/<id>` (a dump) and `<prefix>/request` in `store`.
struct FlightExchange {
  std::shared_ptr<Store> store;
  // A connection of the exchange's own whose requests time out within `wait` (init_process_group's
  // TCPStore jobs): a store host that stopped must not hold the report for the store's own timeout.
  // Unset: `store` is used.
  std::function<std::shared_ptr<Store>()> connect;
  std::string prefix = "chorus_flight";
  int id = 0;  // this process's number in it (the job's rank)
  // How long a reporting rank waits for the others' records (CHORUS_FLIGHT_RECORDER_WAIT_S, when
  // set, replaces it).
  std::chrono::milliseconds wait{5000};
};

class FlightRecorder {
 public:
  // The process's recorder, sized by CHORUS_FLIGHT_RECORDER_ENTRIES (read once; a malformed value is
  // a chorus::Error naming the variable).
  static FlightRecorder& global();
  explicit FlightRecorder(size_t capacity);

  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }
  // Records an operation as issued; returns its id (0 when the recorder is off: the calls below then
  // do nothing).
  uint64_t issue(std::string group, uint64_t seq, bool p2p, std::string op, std::string tensors);
  void start(uint64_t id);
  void finish(uint64_t id, const std::string& error = {});
  std::vector<FlightEntry> entries() const;
  FlightDump snapshot(const std::string& reason, size_t last = SIZE_MAX) const;

  // The job: set by init_process_group (the rank and world size go into dumps and the file name;
  // the exchange is where desync reports meet), cleared by destroy_process_group.
  void set_job(int rank, int world_size, std::optional<FlightExchange> exchange);
  void clear_job();
  std::optional<FlightExchange> job_exchange() const;

  // Writes the ring to `$CHORUS_FLIGHT_RECORDER_FILE<rank>.json` (temporary file, then rename) and
  // returns the path; `rank` is used when no job is set. Never throws: a failure comes back as text
  // saying so, for the error it is appended to.
  std::string write_dump(const std::string& reason, int rank = -1) const;
  // After collective `seq` of `group` timed out here: writes the dump, publishes this rank's recent
  // records through `exchange`, asks the others to, waits for the members' up to exchange.wait, and
  // returns the desync report (never throws: store trouble is reported in the text). Once per job:
  // the collectives queued behind a timed-out one fail at once, and later reports would only repeat
  // the first (or wait again for ranks that never answer); they point to it instead.
  std::string report_timeout(const std::string& group, uint64_t seq, const std::vector<int>& members,
                             const FlightExchange& exchange);
  // Called by the heartbeat every interval with its own store connection: when a rank has asked for
  // records since the last call, publishes this rank's and writes its dump file.
  void answer_request(Store& store);
  // SIGUSR1 writes the dump (a thread waits for the signal; the handler only posts a semaphore).
  // Installed once, and only where SIGUSR1 still has its default action.
  void install_dump_signal();

 private:
  void publish(Store& store, const FlightExchange& exchange, const std::string& reason) const;

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<FlightEntry> ring_;
  uint64_t next_id_ = 1;
  uint64_t dropped_ = 0;
  int rank_ = -1, world_size_ = -1;
  std::optional<FlightExchange> exchange_;
  std::string answered_;  // the last request answered (its value)
  std::string reported_;  // the job's first timed-out collective, once reported ("#k of group g")
};

// "float32[4],int64[2, 3]": what the recorder (and the debug mode's fingerprint) says of tensors.
std::string describe_tensors(const TensorList& tensors);

// True for the errors Gloo and chorus give when an operation ran out of time.
bool is_timeout_error(const std::string& what);
// True for a connection its peer closed or reset. Not always a rank that is gone: Gloo closes a
// pair when an operation on it times out, so in a desync the rank whose timeout fires first cuts
// the others off before their own timeouts fire (ProcessGroupGloo reports on both).
bool is_peer_closed_error(const std::string& what);

}  // namespace chorus::distributed
