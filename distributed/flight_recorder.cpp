#include "distributed/flight_recorder.h"

#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::distributed {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kDumpVersion = 1;
constexpr const char* kDumpFormat = "chorus flight recorder";
// What a rank publishes for a desync report: its most recent entries (the file has the whole ring).
constexpr size_t kPublishedEntries = 256;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

size_t capacity_from_env() {
  const char* s = std::getenv("CHORUS_FLIGHT_RECORDER_ENTRIES");
  if (s == nullptr || *s == '\0') return 2000;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (*end != '\0' || v < 0 || v > 10'000'000) {
    fail("CHORUS_FLIGHT_RECORDER_ENTRIES='{}': expected how many collectives the flight recorder keeps, 0 (off) to "
         "10000000",
         s);
  }
  return static_cast<size_t>(v);
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// CHORUS_FLIGHT_RECORDER_FILE, or $TMPDIR/chorus_flight_port<MASTER_PORT>_rank_ (jobs on one machine
// apart), or /tmp/chorus_flight_rank_.
std::string dump_prefix() {
  const char* prefix = std::getenv("CHORUS_FLIGHT_RECORDER_FILE");
  if (prefix != nullptr && *prefix != '\0') return prefix;
  const char* dir = std::getenv("TMPDIR");
  const char* port = std::getenv("MASTER_PORT");
  return fmt::format("{}/chorus_flight_{}rank_", dir != nullptr && *dir != '\0' ? dir : "/tmp",
                     port != nullptr && *port != '\0' ? fmt::format("port{}_", port) : std::string());
}

std::optional<FlightState> state_from_name(const std::string& s) {
  for (FlightState st : {FlightState::Issued, FlightState::Started, FlightState::Finished, FlightState::Failed}) {
    if (s == flight_state_name(st)) return st;
  }
  return std::nullopt;
}

// The collectives (not point-to-point) of one group in a dump, by sequence number.
std::map<uint64_t, const FlightEntry*> collectives(const FlightDump& dump, const std::string& group) {
  std::map<uint64_t, const FlightEntry*> out;
  for (const FlightEntry& e : dump.entries)
    if (!e.p2p && e.group == group) out[e.seq] = &e;
  return out;
}

std::string describe(const FlightEntry& e) {
  return fmt::format("#{} {} ({})", e.seq, e.signature(), flight_state_name(e.state));
}

}  // namespace

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::Issued: return "issued";
    case FlightState::Started: return "started";
    case FlightState::Finished: return "finished";
    case FlightState::Failed: return "failed";
  }
  return "?";
}

std::string describe_tensors(const TensorList& tensors) {
  std::vector<std::string> parts;
  for (const Tensor& t : tensors) parts.push_back(fmt::format("{}{}", dtype_name(t.dtype()), shape_str(t.sizes())));
  return fmt::format("{}", fmt::join(parts, ","));
}

bool is_timeout_error(const std::string& what) {
  std::string lower = what;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

bool is_peer_closed_error(const std::string& what) {
  std::string lower = what;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("closed by peer") != std::string::npos || lower.find("reset by peer") != std::string::npos;
}

// ----------------------------------------------------------------------------------- JSON form
std::string to_json(const FlightDump& dump) {
  json entries = json::array();
  for (const FlightEntry& e : dump.entries) {
    entries.push_back({{"id", e.id},
                       {"group", e.group},
                       {"seq", e.seq},
                       {"p2p", e.p2p},
                       {"op", e.op},
                       {"tensors", e.tensors},
                       {"state", flight_state_name(e.state)},
                       {"issued", e.issued_s},
                       {"started", e.started_s},
                       {"finished", e.finished_s},
                       {"error", e.error}});
  }
  const json out = {{"format", kDumpFormat}, {"version", kDumpVersion}, {"rank", dump.rank},
                    {"world_size", dump.world_size}, {"pid", dump.pid}, {"host", dump.host},
                    {"reason", dump.reason}, {"time", dump.time_s}, {"capacity", dump.capacity},
                    {"dropped", dump.dropped}, {"entries", entries}};
  return out.dump(1);
}

FlightDump parse_flight_dump(const std::string& text, const std::string& source) {
  const std::string expected =
      "expected a chorus flight-recorder dump (a JSON object with format \"chorus flight recorder\", version 1, rank, "
      "world_size and entries)";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("flight recorder dump {}: not JSON ({}); {}", source, e.what(), expected);
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kDumpFormat) {
    fail("flight recorder dump {}: no \"format\": \"{}\" field; {}", source, kDumpFormat, expected);
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kDumpVersion) {
    fail("flight recorder dump {}: version {} (this chorus reads version {}); {}", source,
         j.contains("version") ? j["version"].dump() : std::string("missing"), kDumpVersion, expected);
  }
  FlightDump d;
  auto integer = [&](const json& obj, const char* key, const std::string& where) -> int64_t {
    if (!obj.contains(key) || !obj[key].is_number_integer()) {
      fail("flight recorder dump {}: {} has no integer \"{}\" (found {}); {}", source, where, key,
           obj.contains(key) ? obj[key].dump() : std::string("nothing"), expected);
    }
    return obj[key].get<int64_t>();
  };
  auto text_field = [&](const json& obj, const char* key, const std::string& where) -> std::string {
    if (!obj.contains(key) || !obj[key].is_string()) {
      fail("flight recorder dump {}: {} has no string \"{}\" (found {}); {}", source, where, key,
           obj.contains(key) ? obj[key].dump() : std::string("nothing"), expected);
    }
    return obj[key].get<std::string>();
  };
  auto number = [&](const json& obj, const char* key, const std::string& where) -> double {
    if (!obj.contains(key) || !obj[key].is_number()) {
      fail("flight recorder dump {}: {} has no number \"{}\" (found {}); {}", source, where, key,
           obj.contains(key) ? obj[key].dump() : std::string("nothing"), expected);
    }
    return obj[key].get<double>();
  };
  d.rank = static_cast<int>(integer(j, "rank", "the dump"));
  d.world_size = static_cast<int>(integer(j, "world_size", "the dump"));
  if (d.rank < 0 || (d.world_size > 0 && d.rank >= d.world_size)) {
    fail("flight recorder dump {}: rank {} of world size {}: expected 0 <= rank < world size", source, d.rank,
         d.world_size);
  }
  d.pid = static_cast<int>(integer(j, "pid", "the dump"));
  d.host = text_field(j, "host", "the dump");
  d.reason = text_field(j, "reason", "the dump");
  d.time_s = number(j, "time", "the dump");
  d.capacity = static_cast<size_t>(integer(j, "capacity", "the dump"));
  d.dropped = static_cast<uint64_t>(integer(j, "dropped", "the dump"));
  if (!j.contains("entries") || !j["entries"].is_array()) {
    fail("flight recorder dump {}: \"entries\" is not an array; {}", source, expected);
  }
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    const json& e = j["entries"][i];
    const std::string where = fmt::format("entry {}", i);
    if (!e.is_object()) fail("flight recorder dump {}: {} is not an object; {}", source, where, expected);
    FlightEntry f;
    const int64_t id = integer(e, "id", where), seq = integer(e, "seq", where);
    if (id < 1 || seq < 0) fail("flight recorder dump {}: {} has id {} and seq {}: expected id >= 1, seq >= 0", source, where, id, seq);
    f.id = static_cast<uint64_t>(id);
    f.seq = static_cast<uint64_t>(seq);
    f.group = text_field(e, "group", where);
    if (!e.contains("p2p") || !e["p2p"].is_boolean()) fail("flight recorder dump {}: {} has no boolean \"p2p\"; {}", source, where, expected);
    f.p2p = e["p2p"].get<bool>();
    f.op = text_field(e, "op", where);
    f.tensors = text_field(e, "tensors", where);
    const std::string state = text_field(e, "state", where);
    const std::optional<FlightState> st = state_from_name(state);
    if (!st) {
      fail("flight recorder dump {}: {} has state '{}': expected issued, started, finished or failed", source, where, state);
    }
    f.state = *st;
    f.issued_s = number(e, "issued", where);
    f.started_s = number(e, "started", where);
    f.finished_s = number(e, "finished", where);
    f.error = text_field(e, "error", where);
    d.entries.push_back(std::move(f));
  }
  return d;
}

// ------------------------------------------------------------------------------ the table
std::string flight_table(const std::vector<FlightDump>& input) {
  if (input.empty()) return "no dumps\n";
  std::vector<const FlightDump*> dumps;
  for (const FlightDump& d : input) dumps.push_back(&d);
  std::sort(dumps.begin(), dumps.end(), [](const FlightDump* a, const FlightDump* b) { return a->rank < b->rank; });
  for (size_t i = 1; i < dumps.size(); ++i) {
    if (dumps[i]->rank == dumps[i - 1]->rank) fail("flight_table: two dumps of rank {}", dumps[i]->rank);
  }
  // Rows: every (group, seq) any rank recorded, in order of group then sequence number.
  std::set<std::pair<std::string, uint64_t>> rows;
  for (const FlightDump* d : dumps)
    for (const FlightEntry& e : d->entries)
      if (!e.p2p) rows.insert({e.group, e.seq});
  std::vector<std::map<std::pair<std::string, uint64_t>, const FlightEntry*>> cells(dumps.size());
  for (size_t r = 0; r < dumps.size(); ++r)
    for (const FlightEntry& e : dumps[r]->entries)
      if (!e.p2p) cells[r][{e.group, e.seq}] = &e;

  std::vector<std::string> header{"group", "#"};
  for (const FlightDump* d : dumps) header.push_back(fmt::format("rank {}", d->rank));
  header.push_back("");
  std::vector<std::vector<std::string>> table{header};
  for (const auto& row : rows) {
    std::vector<std::string> line{row.first, std::to_string(row.second)};
    std::set<std::string> signatures;
    bool missing = false;
    for (size_t r = 0; r < dumps.size(); ++r) {
      auto it = cells[r].find(row);
      if (it == cells[r].end()) {
        // Past the rank's last record of this group: it never got there; before it: the ring no
        // longer holds it.
        bool any = false;
        uint64_t max_seq = 0;
        for (const auto& [key, e] : cells[r]) {
          if (key.first != row.first) continue;
          any = true;
          max_seq = std::max(max_seq, key.second);
        }
        const bool never = !any || max_seq < row.second;
        line.push_back(never ? "-- not entered" : "(not in the ring)");
        missing = missing || never;
        continue;
      }
      signatures.insert(it->second->signature());
      line.push_back(fmt::format("{} [{}]", it->second->signature(), flight_state_name(it->second->state)));
    }
    line.push_back(signatures.size() > 1 ? "<-- ranks differ" : missing ? "<-- not every rank entered" : "");
    table.push_back(std::move(line));
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& line : table)
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  std::string out;
  for (const FlightDump* d : dumps) {
    out += fmt::format("rank {}: pid {} on {}, dumped because: {}{}\n", d->rank, d->pid, d->host, d->reason,
                       d->dropped > 0 ? fmt::format(" ({} older entries dropped from the ring)", d->dropped) : "");
  }
  for (const auto& line : table) {
    std::string text;
    for (size_t c = 0; c < line.size(); ++c) {
      text += line[c];
      if (c + 1 < line.size()) text += std::string(width[c] - line[c].size() + 2, ' ');
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + "\n";
  }
  for (const FlightDump* d : dumps) {
    std::vector<std::string> p2p;
    for (const FlightEntry& e : d->entries)
      if (e.p2p) p2p.push_back(fmt::format("{} {} #{} [{}]", e.group, e.signature(), e.seq, flight_state_name(e.state)));
    if (!p2p.empty()) out += fmt::format("rank {} point-to-point: {}\n", d->rank, fmt::join(p2p, "; "));
  }
  return out;
}

// --------------------------------------------------------------------------- desync report
std::string desync_report(const std::string& group, uint64_t seq, int me, const std::vector<int>& members,
                          const std::map<int, std::optional<FlightDump>>& dumps, std::chrono::milliseconds waited) {
  auto dump_of = [&](int r) -> const FlightDump* {
    auto it = dumps.find(r);
    return it == dumps.end() || !it->second ? nullptr : &*it->second;
  };
  const FlightDump* mine_dump = dump_of(me);
  const FlightEntry* mine = nullptr;
  std::map<uint64_t, const FlightEntry*> my_collectives;
  if (mine_dump) {
    my_collectives = collectives(*mine_dump, group);
    auto it = my_collectives.find(seq);
    if (it != my_collectives.end()) mine = it->second;
  }
  // Without this rank's own record of #seq (it fell out of the ring or of what was published), the
  // others can only be placed by how far they got, not compared.
  const std::string my_signature = mine ? mine->signature() : std::string("(not in this rank's records)");
  std::vector<std::string> lines, never, different, silent;
  for (int r : members) {
    if (r == me) continue;
    const FlightDump* d = dump_of(r);
    if (!d) {
      silent.push_back(std::to_string(r));
      lines.push_back(fmt::format("rank {} sent no flight record within {:.1f} s (its process is stopped or gone, or it "
                                  "is outside any collective with heartbeats off)",
                                  r, waited.count() / 1000.0));
      continue;
    }
    const auto theirs = collectives(*d, group);
    if (theirs.empty()) {
      never.push_back(std::to_string(r));
      lines.push_back(fmt::format("rank {} never entered collective #{}: it has issued no collective in group {}", r, seq, group));
      continue;
    }
    const FlightEntry& last = *theirs.rbegin()->second;
    auto it = theirs.find(seq);
    if (last.seq < seq) {
      never.push_back(std::to_string(r));
      lines.push_back(fmt::format("rank {} never entered collective #{}: its last is {}", r, seq, describe(last)));
    } else if (it == theirs.end()) {
      lines.push_back(fmt::format("rank {} is past #{} (its last is {}); #{} is no longer in its records", r, seq,
                                  describe(last), seq));
    } else if (mine && it->second->signature() != my_signature) {
      different.push_back(std::to_string(r));
      lines.push_back(fmt::format("rank {} entered a different collective as #{}: {} ({}); this rank: {}", r, seq,
                                  it->second->signature(), flight_state_name(it->second->state), my_signature));
    } else {
      lines.push_back(fmt::format("rank {} entered #{} too ({})", r, seq, flight_state_name(it->second->state)));
    }
  }
  // The first sequence number every rank recorded that the ranks disagree on.
  std::optional<std::string> first_difference;
  if (mine_dump) {
    for (const auto& [s, e] : my_collectives) {
      if (s > seq || first_difference) break;
      for (int r : members) {
        const FlightDump* d = dump_of(r);
        if (r == me || !d) continue;
        const auto theirs = collectives(*d, group);
        auto it = theirs.find(s);
        if (it != theirs.end() && it->second->signature() != e->signature()) {
          first_difference = fmt::format("the ranks' records first differ at #{}: this rank ran {}, rank {} ran {}", s,
                                         e->signature(), r, it->second->signature());
          break;
        }
      }
    }
  }
  std::string summary;
  if (!never.empty()) summary += fmt::format("rank(s) {} never entered it", fmt::join(never, ", "));
  if (!different.empty()) {
    summary += fmt::format("{}rank(s) {} entered a different one", summary.empty() ? "" : "; ", fmt::join(different, ", "));
  }
  if (!silent.empty()) summary += fmt::format("{}rank(s) {} sent no record", summary.empty() ? "" : "; ", fmt::join(silent, ", "));
  if (summary.empty()) {
    summary = "every rank entered it with the same arguments: not a desync (a slow or cut network, or a rank stopped "
              "inside it?)";
  }
  std::string out = fmt::format("desync report (flight recorder) for collective #{} of group {}, {} on this rank (rank {}): {}",
                                seq, group, my_signature, me, summary);
  for (const std::string& l : lines) out += "\n  " + l;
  if (first_difference) out += "\n  " + *first_difference;
  return out;
}

// ---------------------------------------------------------------------------- the recorder
FlightRecorder& FlightRecorder::global() {
  static FlightRecorder* recorder = new FlightRecorder(capacity_from_env());  // never destroyed: threads outlive main
  return *recorder;
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity) {}

uint64_t FlightRecorder::issue(std::string group, uint64_t seq, bool p2p, std::string op, std::string tensors) {
  if (capacity_ == 0) return 0;
  FlightEntry e;
  e.group = std::move(group);
  e.seq = seq;
  e.p2p = p2p;
  e.op = std::move(op);
  e.tensors = std::move(tensors);
  e.issued_s = now_s();
  std::lock_guard<std::mutex> lock(mutex_);
  e.id = next_id_++;
  if (ring_.size() == capacity_) {
    ring_.pop_front();
    ++dropped_;
  }
  ring_.push_back(std::move(e));
  return ring_.back().id;
}

void FlightRecorder::start(uint64_t id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.empty() || id < ring_.front().id) return;  // fell out of the ring
  FlightEntry& e = ring_[id - ring_.front().id];
  e.state = FlightState::Started;
  e.started_s = now_s();
}

void FlightRecorder::finish(uint64_t id, const std::string& error) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.empty() || id < ring_.front().id) return;
  FlightEntry& e = ring_[id - ring_.front().id];
  e.state = error.empty() ? FlightState::Finished : FlightState::Failed;
  e.finished_s = now_s();
  if (e.started_s == 0) e.started_s = e.finished_s;
  e.error = error;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {ring_.begin(), ring_.end()};
}

FlightDump FlightRecorder::snapshot(const std::string& reason, size_t last) const {
  FlightDump d;
  d.pid = static_cast<int>(::getpid());
  d.host = hostname();
  d.reason = reason;
  d.time_s = now_s();
  d.capacity = capacity_;
  std::lock_guard<std::mutex> lock(mutex_);
  d.rank = std::max(rank_, 0);
  d.world_size = world_size_;
  const size_t skip = ring_.size() > last ? ring_.size() - last : 0;
  d.dropped = dropped_ + skip;
  d.entries.assign(ring_.begin() + static_cast<std::ptrdiff_t>(skip), ring_.end());
  return d;
}

void FlightRecorder::set_job(int rank, int world_size, std::optional<FlightExchange> exchange) {
  std::lock_guard<std::mutex> lock(mutex_);
  rank_ = rank;
  world_size_ = world_size;
  exchange_ = std::move(exchange);
  answered_.clear();
  reported_.clear();
}

void FlightRecorder::clear_job() {
  std::lock_guard<std::mutex> lock(mutex_);
  exchange_.reset();
}

std::optional<FlightExchange> FlightRecorder::job_exchange() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exchange_;
}

std::string FlightRecorder::write_dump(const std::string& reason, int rank) const {
  FlightDump d = snapshot(reason);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (rank_ < 0 && rank >= 0) d.rank = rank;
  }
  const std::string path = fmt::format("{}{}.json", dump_prefix(), d.rank);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    // A new file of this process's only: not one that is there already, nor a link someone put there.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    const std::string text = to_json(d) + "\n";
    bool ok = fd >= 0;
    for (size_t done = 0; ok && done < text.size();) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += static_cast<size_t>(n);
    }
    if (fd >= 0) ok = ::close(fd) == 0 && ok;
    if (!ok) {
      if (fd >= 0) std::remove(tmp.c_str());
      return fmt::format("(the flight recorder could not write {}: {}; check CHORUS_FLIGHT_RECORDER_FILE)", tmp,
                         std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return fmt::format("(the flight recorder could not rename {} to {})", tmp, path);
  }
  return path;
}

void FlightRecorder::publish(Store& store, const FlightExchange& exchange, const std::string& reason) const {
  FlightDump d = snapshot(reason, kPublishedEntries);
  d.rank = exchange.id;
  store.set(fmt::format("{}/{}", exchange.prefix, exchange.id), to_json(d));
}

std::string FlightRecorder::report_timeout(const std::string& group, uint64_t seq, const std::vector<int>& members,
                                           const FlightExchange& given) {
  if (!enabled()) return "(flight recorder off: CHORUS_FLIGHT_RECORDER_ENTRIES=0)";
  const std::string reason = fmt::format("collective #{} of group {} timed out", seq, group);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reported_.empty()) return fmt::format("(the desync report is with this job's first timed-out collective, {})", reported_);
    reported_ = fmt::format("#{} of group {}", seq, group);
  }
  FlightExchange exchange = given;
  if (const char* s = std::getenv("CHORUS_FLIGHT_RECORDER_WAIT_S"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (*end != '\0' || !(v >= 0) || v > 3600) {
      return fmt::format("(no desync report: CHORUS_FLIGHT_RECORDER_WAIT_S='{}': expected seconds, 0 to 3600)", s);
    }
    exchange.wait = std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
  }
  const std::string file = write_dump(reason, exchange.id);
  std::map<int, std::optional<FlightDump>> dumps;
  const auto start = Clock::now();
  try {
    const std::shared_ptr<Store> store = exchange.connect ? exchange.connect() : exchange.store;
    if (!store) fail("no store to exchange records through");
    publish(*store, exchange, reason);
    const std::string request = fmt::format("rank {}: {}", exchange.id, reason);
    const Bytes asked = store->compare_set(exchange.prefix + "/request", {}, Bytes(request.begin(), request.end()));
    {
      // This rank has published: its heartbeat need not answer the request (the first one stands).
      std::lock_guard<std::mutex> lock(mutex_);
      answered_.assign(asked.begin(), asked.end());
    }
    const auto deadline = start + exchange.wait;
    std::set<int> waiting(members.begin(), members.end());
    auto backoff = std::chrono::milliseconds(5);
    while (!waiting.empty()) {
      for (auto it = waiting.begin(); it != waiting.end();) {
        const std::string key = fmt::format("{}/{}", exchange.prefix, *it);
        if (store->check({key})) {
          dumps[*it] = parse_flight_dump(store->get_string(key), fmt::format("from rank {}", *it));
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
      if (waiting.empty() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
    }
  } catch (const std::exception& e) {
    return fmt::format("(no desync report: {}); flight recorder dump: {}", e.what(), file);
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return fmt::format("{}\nflight recorder dump: {}",
                     desync_report(group, seq, exchange.id, members, dumps, waited), file);
}

void FlightRecorder::answer_request(Store& store) {
  std::optional<FlightExchange> exchange = job_exchange();
  if (!exchange || !enabled()) return;
  const std::string key = exchange->prefix + "/request";
  if (!store.check({key})) return;
  const std::string request = store.get_string(key);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (request == answered_) return;
    answered_ = request;
  }
  // The file first: the asking rank may end the job as soon as it has read the published records.
  const std::string reason = "asked by " + request;
  write_dump(reason);
  publish(store, *exchange, reason);
}

namespace {

sem_t dump_signal;

void on_dump_signal(int) { ::sem_post(&dump_signal); }  // async-signal-safe; the thread does the rest

}  // namespace

void FlightRecorder::install_dump_signal() {
  static std::once_flag once;
  std::call_once(once, [this] {
    if (!enabled()) return;
    struct sigaction current = {};
    if (::sigaction(SIGUSR1, nullptr, &current) != 0) return;
    // Left alone: a handler the program installed, or an ignore it chose; chorusrun's ignore (set so
    // that a worker not this far yet survives a forwarded SIGUSR1) is taken over.
    const char* from_launcher = std::getenv("CHORUS_SIGUSR1_IGNORED_BY_LAUNCHER");
    const bool launcher_ignore = current.sa_handler == SIG_IGN && from_launcher != nullptr && std::string(from_launcher) == "1";
    if (current.sa_handler != SIG_DFL && !launcher_ignore) return;
    if (::sem_init(&dump_signal, 0, 0) != 0) return;
    std::thread([this] {
      while (true) {
        if (::sem_wait(&dump_signal) != 0) continue;  // EINTR
        const std::string path = write_dump("SIGUSR1");
        std::fprintf(stderr, "chorus: flight recorder dump written to %s\n", path.c_str());
        std::fflush(stderr);
      }
    }).detach();
    struct sigaction sa = {};
    sa.sa_handler = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
  });
}

}  // namespace chorus::distributed
