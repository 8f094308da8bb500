// The stream-order sanitizer (see stream_sanitizer.h for the model).
#include "tensor/stream_sanitizer.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "tensor/error.h"
#include "tensor/tensor.h"

namespace chorus::stream_sanitizer {
namespace {

using Clock = std::vector<uint64_t>;  // indexed by stream number

void merge(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}
uint64_t at(const Clock& c, int stream) { return static_cast<size_t>(stream) < c.size() ? c[stream] : 0; }

// Unset: on for sim, off for cuda (PyTorch's sanitizer is opt-in on CUDA too: it costs host time).
int env_setting() {
  const char* v = std::getenv("CHORUS_STREAM_SANITIZER");
  if (v == nullptr || *v == '\0') return -1;
  const std::string s = v;
  if (s == "0") return 0;
  if (s == "1") return 1;
  std::fprintf(stderr, "CHORUS_STREAM_SANITIZER=%s: expected 0 or 1\n", v);
  std::abort();
}

std::atomic<bool>* flags() {
  static std::atomic<bool>* f = [] {
    auto* a = new std::atomic<bool>[3];
    const int setting = env_setting();
    a[static_cast<int>(DeviceType::CPU)] = false;
    a[static_cast<int>(DeviceType::CUDA)] = setting == 1;
    a[static_cast<int>(DeviceType::Sim)] = setting != 0;
    return a;
  }();
  return f;
}

std::atomic<uint64_t> g_reports{0};


struct Record {
  int stream = 0;
  uint64_t epoch = 0;
  uintptr_t lo = 0, hi = 0;
  bool write = false;
  std::string op;
};

struct Block {
  uintptr_t base = 0;
  size_t bytes = 0;
  int stream = 0;  // the stream it was handed out on
  Device device;
  uint64_t serial = 0;  // the n-th block handed out in this process, for reports
  std::vector<Record> records;
};

struct StreamInfo {
  Device device;
  bool is_default = false;
  Clock clock;
};

class Sanitizer {
 public:
  // `commit` false: only the check (a report throws), nothing recorded: for work checked before it
  // is launched and recorded once it was (a collective its communicator may still refuse).
  void launch(const char* op, Device device, StreamHandle handle, const std::vector<Access>& accesses, bool commit) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int s = stream_number(handle, device);
    Clock& clock = streams_[s].clock;
    merge(clock, host());
    if (clock.size() <= static_cast<size_t>(s)) clock.resize(s + 1, 0);
    const uint64_t epoch = clock[s] + 1;
    // Check every access before recording any: a report leaves the state as it was.
    std::vector<Block*> blocks(accesses.size(), nullptr);
    for (size_t k = 0; k < accesses.size(); ++k) {
      const Access& a = accesses[k];
      if (a.bytes == 0) continue;
      Block* block = blocks[k] = find_live(a.ptr);
      if (block == nullptr) continue;
      const uintptr_t lo = reinterpret_cast<uintptr_t>(a.ptr), hi = lo + a.bytes;
      for (const Record& r : block->records) {
        if (r.stream == s || r.hi <= lo || hi <= r.lo || !(a.write || r.write)) continue;
        if (at(clock, r.stream) >= r.epoch) continue;
        report(fmt::format("{} on {} {} bytes [{:#x}, +{}) of block #{} ({} bytes at {:#x}, allocated on {}), which {} "
                           "on {} {} ([{:#x}, +{})), and nothing orders {} after that: no wait on an event recorded "
                           "after it, no host synchronization that saw it finish",
                           op, describe(s), a.write ? "writes" : "reads", lo, a.bytes, block->serial, block->bytes,
                           block->base, describe(block->stream), r.op, describe(r.stream),
                           r.write ? "wrote" : "read", r.lo, r.hi - r.lo, describe(s)));
      }
    }
    if (!commit) return;
    clock[s] = epoch;
    for (size_t k = 0; k < accesses.size(); ++k) {
      const Access& a = accesses[k];
      Block* block = blocks[k];
      if (block == nullptr) continue;
      const uintptr_t lo = reinterpret_cast<uintptr_t>(a.ptr), hi = lo + a.bytes;
      // A record this access covers may go when everything that conflicts with it also conflicts
      // with this access, and is ordered after it only if it is ordered after this one: any record
      // under a write (checked ordered before it), and this stream's own reads under any access.
      auto& recs = block->records;
      recs.erase(std::remove_if(recs.begin(), recs.end(),
                                [&](const Record& r) {
                                  return lo <= r.lo && r.hi <= hi && (a.write || (r.stream == s && !r.write));
                                }),
                 recs.end());
      recs.push_back(Record{s, epoch, lo, hi, a.write, op});
    }
  }

  void record(EventHandle event, Device device, StreamHandle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int s = stream_number(handle, device);
    merge(streams_[s].clock, host());
    events_[event] = streams_[s].clock;  // the latest record is what a later wait captures
  }

  void wait(StreamHandle handle, Device device, EventHandle event) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int s = stream_number(handle, device);
    auto it = events_.find(event);
    if (it != events_.end()) merge(streams_[s].clock, it->second);
  }

  void event_done(EventHandle event) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = events_.find(event);
    if (it != events_.end()) merge(host(), it->second);
  }
  void event_destroyed(EventHandle event) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.erase(event);
  }
  void stream_done(StreamHandle handle, Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = numbers_.find(StreamKey{device.type, device.index, handle});
    if (it != numbers_.end()) merge(host(), streams_[it->second].clock);
  }
  void device_done(Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const StreamInfo& info : streams_)
      if (info.device == device) merge(host(), info.clock);
  }

  void allocate(Device device, const void* ptr, size_t bytes, StreamHandle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int s = stream_number(handle, device);
    Clock& clock = streams_[s].clock;
    merge(clock, host());
    const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr), hi = lo + bytes;
    // Freed blocks overlapping the new one: every other stream's access must be ordered before it.
    auto it = freed_.upper_bound(lo);
    if (it != freed_.begin()) --it;
    while (it != freed_.end() && it->first < hi) {
      Block& old = it->second;
      const uintptr_t old_hi = it->first + old.bytes;
      if (old_hi <= lo) {
        ++it;
        continue;
      }
      for (const Record& r : old.records) {
        if (r.stream == s || r.hi <= lo || hi <= r.lo || at(clock, r.stream) >= r.epoch) continue;
        report(fmt::format("block #{} ({} bytes at {:#x}, allocated on {}) was freed and its memory handed out again "
                           "on {} ({} bytes at {:#x}) while {} on {} may still {} it ([{:#x}, +{})): a tensor used on "
                           "another stream needs record_stream(), or the freeing stream must wait for that work",
                           old.serial, old.bytes, it->first, describe(old.stream), describe(s), bytes, lo, r.op,
                           describe(r.stream), r.write ? "write" : "read", r.lo, r.hi - r.lo));
      }
      // The part of the old block outside the new one stays, with the records that touch it.
      std::vector<Record> rest;
      for (const Record& r : old.records)
        if (r.lo < lo || r.hi > hi) rest.push_back(r);
      if (rest.empty() || (it->first >= lo && old_hi <= hi)) {
        it = freed_.erase(it);
      } else {
        old.records = std::move(rest);
        ++it;
      }
    }
    Block& block = live_[lo];
    block = Block{lo, bytes, s, device, ++serial_, {}};
  }

  void free(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == live_.end()) return;
    Block& slot = freed_[it->first];
    if (slot.records.empty()) {
      slot = std::move(it->second);
    } else {
      slot.records.insert(slot.records.end(), it->second.records.begin(), it->second.records.end());
      slot.bytes = std::max(slot.bytes, it->second.bytes);
    }
    live_.erase(it);
  }

 private:
  int stream_number(StreamHandle handle, Device device) {
    const StreamKey key{device.type, device.index, handle};
    auto it = numbers_.find(key);
    if (it != numbers_.end()) return it->second;
    const int n = static_cast<int>(streams_.size());
    numbers_.emplace(key, n);
    StreamInfo info;
    info.device = device;
    info.is_default = default_stream(device).handle() == handle;
    streams_.push_back(std::move(info));
    return n;
  }
  std::string describe(int s) const {
    const StreamInfo& info = streams_[s];
    return fmt::format("stream {} ({}{})", s, info.device.str(), info.is_default ? ", its default stream" : "");
  }
  Block* find_live(const void* ptr) {
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    auto it = live_.upper_bound(addr);
    if (it == live_.begin()) return nullptr;
    --it;
    if (addr >= it->first + it->second.bytes) return nullptr;
    return &it->second;
  }
  [[noreturn]] void report(const std::string& what) {
    g_reports.fetch_add(1);
    const std::string msg = "stream-order sanitizer: " + what;
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    throw Error(msg);
  }

  // What each host thread has seen complete. Per thread: a query that another thread (a watchdog)
  // saw succeed orders nothing this thread issues, so the verdicts follow the program's own
  // synchronizations, not which thread happened to look first. (Kept here, not thread_local: hooks
  // run during static destruction, after the main thread's thread_locals are gone.)
  Clock& host() { return hosts_[std::this_thread::get_id()]; }

  std::mutex mutex_;
  std::unordered_map<std::thread::id, Clock> hosts_;
  std::vector<StreamInfo> streams_;
  // A stream is its device and handle: on CUDA every device's default stream is handle 0.
  using StreamKey = std::tuple<DeviceType, int, StreamHandle>;
  std::map<StreamKey, int> numbers_;
  std::unordered_map<EventHandle, Clock> events_;
  std::map<uintptr_t, Block> live_, freed_;
  uint64_t serial_ = 0;
};

Sanitizer& sanitizer() {
  static Sanitizer* s = new Sanitizer();  // leaked: hooks may run during static destruction
  return *s;
}

}  // namespace

bool active(DeviceType type) { return flags()[static_cast<int>(type)].load(std::memory_order_relaxed); }
void set_active(DeviceType type, bool on) {
  if (type != DeviceType::CPU) flags()[static_cast<int>(type)].store(on);
}
uint64_t reports() { return g_reports.load(); }

Access access_of(const Tensor& t, bool write) {
  if (!t.defined() || t.numel() == 0) return {};
  const auto elem = static_cast<int64_t>(t.element_size());
  int64_t low = 0, high = 0;
  const auto& sizes = t.sizes();
  const auto& strides = t.strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    const int64_t span = (sizes[d] - 1) * strides[d];
    (span < 0 ? low : high) += span;
  }
  const char* base = static_cast<const char*>(t.raw_data_ptr());
  return Access{base + low * elem, static_cast<size_t>((high - low + 1) * elem), write};
}

void on_launch(const char* op, Device device, StreamHandle stream, const std::vector<Access>& accesses) {
  sanitizer().launch(op, device, stream, accesses, /*commit=*/true);
}
void check_launch(const char* op, Device device, StreamHandle stream, const std::vector<Access>& accesses) {
  sanitizer().launch(op, device, stream, accesses, /*commit=*/false);
}
void on_record(EventHandle event, Device device, StreamHandle stream) { sanitizer().record(event, device, stream); }
void on_wait(StreamHandle stream, Device device, EventHandle event) { sanitizer().wait(stream, device, event); }
void on_event_done(EventHandle event) { sanitizer().event_done(event); }
void on_event_destroyed(EventHandle event) { sanitizer().event_destroyed(event); }
void on_stream_done(StreamHandle stream, Device device) { sanitizer().stream_done(stream, device); }
void on_device_done(Device device) { sanitizer().device_done(device); }
void on_allocate(Device device, const void* ptr, size_t bytes, StreamHandle stream) {
  sanitizer().allocate(device, ptr, bytes, stream);
}
void on_free(Device, const void* ptr) { sanitizer().free(ptr); }

}  // namespace chorus::stream_sanitizer
