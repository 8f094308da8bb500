// The caching device allocator (design in caching_allocator.h): pools, best fit, split and merge,
// stream ownership, record_stream events, the out-of-memory retry, statistics, and the per-type
// registry behind the user API.
#include "tensor/caching_allocator.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "tensor/error.h"
#include "tensor/fault.h"
#include "tensor/stream_sanitizer.h"

namespace chorus {

struct CachingAllocator::Block {
  StreamHandle stream = nullptr;
  size_t size = 0;
  size_t requested = 0;  // bytes asked for, while allocated
  char* ptr = nullptr;
  BlockPool* pool = nullptr;
  bool allocated = false;
  int event_count = 0;                 // recorded events not yet completed ([Record Stream])
  std::set<StreamHandle> stream_uses;  // streams other than `stream` that used the block
  Block* prev = nullptr;               // neighbours in the segment, in address order
  Block* next = nullptr;

  bool mergeable() const { return !allocated && event_count == 0 && stream_uses.empty(); }
};

namespace {

// Pool order: stream first ([Stream Ownership]: a lookup never crosses streams), then best fit.
struct BySizeOrder {
  template <typename B>
  bool operator()(const B* a, const B* b) const {
    if (a->stream != b->stream) return std::less<StreamHandle>()(a->stream, b->stream);
    if (a->size != b->size) return a->size < b->size;
    return std::less<char*>()(a->ptr, b->ptr);
  }
};
struct ByAddress {
  template <typename B>
  bool operator()(const B* a, const B* b) const {
    return std::less<char*>()(a->ptr, b->ptr);
  }
};

std::string format_size(size_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  if (bytes < (size_t(1) << 20)) return fmt::format("{:.2f} KiB", bytes / 1024.0);
  if (bytes < (size_t(1) << 30)) return fmt::format("{:.2f} MiB", bytes / double(1 << 20));
  return fmt::format("{:.2f} GiB", bytes / double(1 << 30));
}

}  // namespace

struct CachingAllocator::BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}
  std::set<Block*, BySizeOrder> blocks;
  const bool is_small;
};

struct CachingAllocator::DeviceState {
  explicit DeviceState(Device d) : device(d) {}
  const Device device;
  std::mutex mutex;
  BlockPool small{true};
  BlockPool large{false};
  std::unordered_map<void*, Block*> live;    // allocated blocks by address
  std::set<Block*, ByAddress> segments;      // the first block of every segment
  // Per stream, events recorded for freed blocks, oldest first ([Record Stream]).
  std::map<StreamHandle, std::deque<std::pair<EventHandle, Block*>>> pending;
  std::vector<EventHandle> spare_events;     // completed events, for reuse
  std::vector<EventHandle> all_events;       // every event created (destroyed with the allocator)
  std::vector<Block*> lost;                  // blocks whose free met a failed device (their memory is gone)
  MemoryStats stats;
};

CachingAllocator::CachingAllocator(DeviceRuntime& runtime) : runtime_(runtime) {}

CachingAllocator::~CachingAllocator() {
  for (auto& [index, st] : states_) {
    try {
      synchronize_events(*st);
      std::lock_guard<std::mutex> lock(st->mutex);
      process_events(*st);
      release_cached_segments(*st);
    } catch (const std::exception&) {
      // A failed device (its sticky error): what it held is lost with it. Not thrown (a destructor).
    }
    std::lock_guard<std::mutex> lock(st->mutex);
    // Blocks still waiting for events (none unless the device failed above), each once.
    std::set<Block*> waiting;
    for (auto& [stream, queue] : st->pending)
      for (auto& entry : queue) waiting.insert(entry.second);
    for (Block* b : waiting) delete b;
    for (EventHandle e : st->all_events) runtime_.destroy_event(e);
    // Segments with live blocks stay with the runtime (their tensors still use them); their Block
    // records are dropped with the pools.
    for (BlockPool* pool : {&st->small, &st->large})
      for (Block* b : pool->blocks) delete b;
    for (auto& [ptr, b] : st->live) delete b;
    for (Block* b : st->lost) delete b;
  }
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::DeviceState& CachingAllocator::state(Device device, const char* what) {
  if (device.type != runtime_.type()) {
    fail("CachingAllocator::{}: device {} is not a {} device (this allocator serves {} memory)", what, device.str(),
         device_type_name(runtime_.type()), device_type_name(runtime_.type()));
  }
  std::lock_guard<std::mutex> lock(states_mutex_);
  auto it = states_.find(device.index);
  if (it != states_.end()) return *it->second;
  if (runtime_.device_count() == 0 || device.index < 0 || device.index >= runtime_.device_count()) {
    // runtime_for words it as everywhere else: "no CUDA device: <reason>", or the valid indices.
    runtime_for(device, fmt::format("CachingAllocator::{}", what).c_str());
  }
  return *states_.emplace(device.index, std::make_unique<DeviceState>(device)).first->second;
}

// ---- Allocation ------------------------------------------------------------------------------

void* CachingAllocator::allocate(size_t nbytes, Device device) {
  check_device_calls_allowed("CachingAllocator::allocate");
  DeviceState& st = state(device, "allocate");
  if (nbytes == 0) return nullptr;
  // [Stream Ownership]: the block belongs to the stream work on `device` goes to from this thread.
  const StreamHandle stream = current_stream(device).handle();
  const size_t size = round_size(nbytes);
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    process_events(st);
    BlockPool& pool = size <= kSmallSize ? st.small : st.large;
    Block* block = find_free_block(pool, stream, size);
    if (block == nullptr) block = new_segment(st, pool, stream, segment_size(size));
    if (block != nullptr) return hand_out(st, block, size, nbytes);
  }
  return allocate_slow(st, size, nbytes, stream, device);
}

// Nothing cached fits and the runtime refused a segment. Blocks waiting for other streams' events
// and free cached segments may be what holds the memory: wait for the events (without the lock: a
// stream task may be freeing a tensor right now), retry the pool, empty the cache, retry once more.
void* CachingAllocator::allocate_slow(DeviceState& st, size_t size, size_t nbytes, StreamHandle stream,
                                      Device device) {
  synchronize_events(st);
  std::lock_guard<std::mutex> lock(st.mutex);
  ++st.stats.num_alloc_retries;
  process_events(st);
  BlockPool& pool = size <= kSmallSize ? st.small : st.large;
  Block* block = find_free_block(pool, stream, size);
  if (block == nullptr) {
    release_cached_segments(st);
    block = new_segment(st, pool, stream, segment_size(size));
  }
  if (block != nullptr) return hand_out(st, block, size, nbytes);

  ++st.stats.num_ooms;
  fail("{}", out_of_memory_message(st, device, nbytes, size));
}

// PyTorch's parts (tried to allocate; total capacity and free; allocated by tensors; reserved by
// the allocator and how much of that is cached but unallocated), plus the largest cached free
// block, which says whether fragmentation is the problem: after the retry above, what is still
// cached lies in segments that also hold live tensors, so it cannot go back to the device. Then
// what the user can do about it (the examples' flags).
std::string CachingAllocator::out_of_memory_message(DeviceState& st, Device device, size_t nbytes, size_t size) {
  const size_t total = runtime_.total_memory(device.index);
  const size_t reserved = st.stats.reserved_bytes;
  const size_t allocated = st.stats.allocated_bytes;
  const size_t free = total > reserved ? total - reserved : 0;
  const size_t cached = reserved > allocated ? reserved - allocated : 0;
  size_t largest = 0;
  for (BlockPool* pool : {&st.small, &st.large})
    for (const Block* b : pool->blocks) largest = std::max(largest, b->size);
  return fmt::format(
      "{} out of memory: tried to allocate {} ({} bytes); {} allocated by tensors, {} reserved by chorus ({} of it "
      "cached but unallocated, the largest cached free block {}), {} free of {} total (a new segment for this request "
      "needs {}). Pending frees were waited for and every free cached segment returned to the device (empty_cache) "
      "before giving up, so live tensors hold this memory. To fit, make a step smaller: a smaller --batch-size, or "
      "--accumulate N (the same global batch in N micro-batches), or --amp bf16; under chorusrun --max-restarts with "
      "--resume auto the job can go on from its last checkpoint with the new flags (docs/reliability.md, \"Device "
      "faults\"). If the cached but unallocated memory is large, it is fragmented: segments that still hold a live "
      "block cannot be returned, and chorus has no expandable segments (PyTorch's "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
      device.str(), format_size(nbytes), nbytes, format_size(allocated), format_size(reserved), format_size(cached),
      format_size(largest), format_size(free), format_size(total), format_size(segment_size(size)));
}

CachingAllocator::Block* CachingAllocator::find_free_block(BlockPool& pool, StreamHandle stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.blocks.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(DeviceState& st, BlockPool& pool, StreamHandle stream,
                                                       size_t size) {
  void* ptr = runtime_.malloc(st.device.index, size);
  if (ptr == nullptr) return nullptr;
  auto* block = new Block;
  block->stream = stream;
  block->size = size;
  block->ptr = static_cast<char*>(ptr);
  block->pool = &pool;
  st.segments.insert(block);
  MemoryStats& s = st.stats;
  s.reserved_bytes += size;
  s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, s.reserved_bytes);
  ++s.num_device_mallocs;
  return block;
}

// `block` (out of its pool) serves a request of `size` rounded bytes: split off the rest when it is
// worth keeping as a block of its own, then mark it allocated.
void* CachingAllocator::hand_out(DeviceState& st, Block* block, size_t size, size_t nbytes) {
  const size_t rest = block->size - size;
  const bool split = block->pool->is_small ? rest >= kMinBlockSize : rest > kSmallSize;
  if (split) {
    auto* remaining = new Block;
    remaining->stream = block->stream;
    remaining->size = rest;
    remaining->ptr = block->ptr + size;
    remaining->pool = block->pool;
    remaining->prev = block;
    remaining->next = block->next;
    if (block->next != nullptr) block->next->prev = remaining;
    block->next = remaining;
    block->size = size;
    block->pool->blocks.insert(remaining);
  }
  block->allocated = true;
  block->requested = nbytes;
  st.live.emplace(block->ptr, block);
  // [A refused hand-out writes nothing] The stream-order sanitizer first: when it refuses the
  // hand-out (another stream may still use the block's last tenant) it throws before the poison is
  // queued. Queued first, the poison was a write racing that other stream's pending read, with
  // nothing ordering the two: ThreadSanitizer reported it in stream_group_tsan_test's negative
  // control (2026-12-04: one fresh-clone CI, after many that passed; 6 runs of 6 with
  // CHORUS_SIM_DELAY_US=3000). stream_sanitizer_test checks the rule without timing.
  // A refused hand-out gives the block back to its pool (merged with the split-off rest) before the
  // report goes up: else it stayed live with no owner, never freed, its segment never released.
  if (stream_sanitizer::active(runtime_.type())) {
    try {
      stream_sanitizer::on_allocate(st.device, block->ptr, size, block->stream);
    } catch (...) {
      st.live.erase(block->ptr);
      block->allocated = false;
      block->requested = 0;
      free_block(st, block);
      throw;
    }
  }
  // Poisoned (where the runtime does it: sim) in stream order, so that a reader another stream
  // still has of the block's last tenant sees garbage, as on a GPU that reused the memory.
  runtime_.poison(block->ptr, size, block->stream);
  MemoryStats& s = st.stats;
  s.allocated_bytes += block->size;
  s.requested_bytes += nbytes;
  s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, s.allocated_bytes);
  ++s.num_allocs;
  return block->ptr;
}

// ---- Free --------------------------------------------------------------------------------------

void CachingAllocator::deallocate(void* ptr, Device device) {
  if (ptr == nullptr) return;
  check_device_calls_allowed("CachingAllocator::deallocate");
  DeviceState& st = state(device, "deallocate");
  std::unique_lock<std::mutex> lock(st.mutex);
  auto it = st.live.find(ptr);
  if (it == st.live.end()) {
    fail("CachingAllocator::deallocate: {} is not a live block on {} (freed twice, or from another device)", ptr,
         device.str());
  }
  Block* block = it->second;
  st.live.erase(it);
  block->allocated = false;
  if (stream_sanitizer::active(device.type)) stream_sanitizer::on_free(device, ptr);
  MemoryStats& s = st.stats;
  s.allocated_bytes -= block->size;
  s.requested_bytes -= block->requested;
  ++s.num_frees;
  if (block->stream_uses.empty()) {
    free_block(st, block);
    return;
  }
  // [Record Stream]: the block may still be in use by work queued on other streams. Record an event
  // on each; the block returns to its pool when process_events sees all of them complete. The
  // records happen outside the mutex: a device call may wait (a driver lock held by another
  // thread's blocking copy, free or host_free), and nothing else may wait for the allocator meanwhile. The block is
  // neither live nor free until its events are pending, so no one else touches it.
  std::set<StreamHandle> streams = std::move(block->stream_uses);
  block->stream_uses.clear();
  std::vector<std::pair<StreamHandle, EventHandle>> records;
  for (StreamHandle stream : streams) {
    EventHandle event = nullptr;
    if (!st.spare_events.empty()) {
      event = st.spare_events.back();
      st.spare_events.pop_back();
    }
    records.emplace_back(stream, event);
  }
  block->event_count += static_cast<int>(records.size());
  lock.unlock();
  std::vector<EventHandle> made;
  try {
    // A record on the device's default stream (on CUDA the null stream, which names the current
    // device's) needs the device current ([A stream's device is current], tensor/runtime.h); the
    // pool streams do not. Inside the try: a failed device's error lands in the catch below.
    std::optional<StreamDeviceGuard> on_device;
    const StreamHandle default_handle = runtime_.default_stream(device.index);
    for (auto& [stream, event] : records) {
      if (stream == default_handle && !on_device) on_device.emplace(Stream(device, stream));
      if (event == nullptr) {
        event = runtime_.create_event(device.index, /*enable_timing=*/false);
        made.push_back(event);
      }
      runtime_.record_event(event, stream);
      if (stream_sanitizer::active(device.type)) stream_sanitizer::on_record(event, device, stream);
    }
  } catch (const Error&) {
    // The device has failed (a sticky error: every later call on it throws, tensor/sim/sim.h). A
    // free runs in destructors, on stream threads too, where throwing ends the process; so the block
    // stays out of the pools for good (its memory is lost with the device) and the error surfaces at
    // the caller's next device call instead.
    lock.lock();
    st.all_events.insert(st.all_events.end(), made.begin(), made.end());
    st.lost.push_back(block);  // its record goes with the allocator
    return;
  }
  lock.lock();
  st.all_events.insert(st.all_events.end(), made.begin(), made.end());
  for (auto& [stream, event] : records) st.pending[stream].emplace_back(event, block);
}

// Returns a block nobody uses any more to its pool, merged with free neighbours.
void CachingAllocator::free_block(DeviceState& st, Block* block) {
  BlockPool& pool = *block->pool;
  if (Block* prev = block->prev; prev != nullptr && prev->mergeable()) {
    pool.blocks.erase(prev);
    if (prev->prev == nullptr) {  // prev was the segment's first block; now `block` is
      st.segments.erase(prev);
      block->ptr = prev->ptr;
      st.segments.insert(block);
    } else {
      block->ptr = prev->ptr;
    }
    block->size += prev->size;
    block->prev = prev->prev;
    if (block->prev != nullptr) block->prev->next = block;
    delete prev;
  }
  if (Block* next = block->next; next != nullptr && next->mergeable()) {
    pool.blocks.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next != nullptr) block->next->prev = block;
    delete next;
  }
  pool.blocks.insert(block);
}

void CachingAllocator::record_stream(void* ptr, const Stream& stream) {
  if (ptr == nullptr) return;
  DeviceState& st = state(stream.device(), "record_stream");
  std::lock_guard<std::mutex> lock(st.mutex);
  auto it = st.live.find(ptr);
  if (it == st.live.end()) {
    fail("record_stream: {} is not a live block of the caching allocator on {} (the stream's device; memory "
         "from from_blob or another device cannot be recorded)",
         ptr, stream.device().str());
  }
  if (fault::removed(fault::Point::kAllocatorRecordStream)) return;  // a negative control (tensor/fault.h)
  // Work on the owning stream is ordered anyway ([Stream Ownership]).
  if (stream.handle() != it->second->stream) it->second->stream_uses.insert(stream.handle());
}

bool CachingAllocator::owns(void* ptr, Device device) {
  DeviceState& st = state(device, "owns");
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.live.count(ptr) > 0;
}

// ---- Events, empty_cache -----------------------------------------------------------------------

// Frees the blocks whose events have all completed. Only queries: never blocks the host.
void CachingAllocator::process_events(DeviceState& st) {
  for (auto it = st.pending.begin(); it != st.pending.end();) {
    auto& queue = it->second;
    // Events on one stream complete in the order they were recorded: stop at the first pending one.
    while (!queue.empty() && runtime_.query_event(queue.front().first)) {
      auto [event, block] = queue.front();
      if (stream_sanitizer::active(st.device.type)) stream_sanitizer::on_event_done(event);
      queue.pop_front();
      st.spare_events.push_back(event);
      if (--block->event_count == 0) free_block(st, block);
    }
    it = queue.empty() ? st.pending.erase(it) : std::next(it);
  }
}

// Waits (host-blocking) for every event recorded so far, without holding the lock; process_events
// then frees their blocks. Events are never destroyed while the allocator lives, so a handle stays
// valid even if another thread recycles it meanwhile (a wait on its newer record just ends later).
void CachingAllocator::synchronize_events(DeviceState& st) {
  std::vector<EventHandle> events;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    for (auto& [stream, queue] : st.pending)
      for (auto& entry : queue) events.push_back(entry.first);
  }
  if (events.empty()) return;
  note_host_sync();
  for (EventHandle e : events) runtime_.synchronize_event(e);
}

// Returns every segment that is one free block to the runtime (called with the lock held).
void CachingAllocator::release_cached_segments(DeviceState& st) {
  for (BlockPool* pool : {&st.small, &st.large}) {
    for (auto it = pool->blocks.begin(); it != pool->blocks.end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {
        ++it;
        continue;
      }
      it = pool->blocks.erase(it);
      st.segments.erase(b);
      try {
        runtime_.free(st.device.index, b->ptr);
      } catch (const Error&) {
        // A failed device refuses the free (CUDA returns its sticky error from cudaFree): the
        // segment is lost with the device; its record is kept, deleted with the allocator.
        st.lost.push_back(b);
        throw;
      }
      st.stats.reserved_bytes -= b->size;
      ++st.stats.num_device_frees;
      delete b;
    }
  }
}

void CachingAllocator::empty_cache(Device device) {
  check_device_calls_allowed("CachingAllocator::empty_cache");  // (it waits for events and frees segments)
  DeviceState& st = state(device, "empty_cache");
  synchronize_events(st);
  std::lock_guard<std::mutex> lock(st.mutex);
  process_events(st);
  release_cached_segments(st);
}

// ---- Statistics ----------------------------------------------------------------------------------

MemoryStats CachingAllocator::stats(Device device) {
  DeviceState& st = state(device, "stats");
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.stats;
}

void CachingAllocator::reset_peak_memory_stats(Device device) {
  DeviceState& st = state(device, "reset_peak_memory_stats");
  std::lock_guard<std::mutex> lock(st.mutex);
  st.stats.peak_allocated_bytes = st.stats.allocated_bytes;
  st.stats.peak_reserved_bytes = st.stats.reserved_bytes;
}

std::vector<MemorySegmentInfo> CachingAllocator::snapshot(Device device) {
  DeviceState& st = state(device, "snapshot");
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<MemorySegmentInfo> out;
  out.reserve(st.segments.size());
  for (Block* head : st.segments) {
    MemorySegmentInfo seg;
    seg.address = reinterpret_cast<uintptr_t>(head->ptr);
    seg.small_pool = head->pool->is_small;
    seg.stream = head->stream;
    for (Block* b = head; b != nullptr; b = b->next) {
      using State = MemoryBlockInfo::State;
      const State state = b->allocated ? State::Allocated : b->event_count > 0 ? State::AwaitingEvents : State::Free;
      seg.blocks.push_back({reinterpret_cast<uintptr_t>(b->ptr), b->size, state});
      seg.size += b->size;
    }
    out.push_back(std::move(seg));
  }
  return out;
}

// ---- Registry and the user API ---------------------------------------------------------------------

namespace {

struct AllocatorRegistry {
  std::mutex mutex;
  CachingAllocator* allocators[3] = {nullptr, nullptr, nullptr};
};

// A function-local static: backends install at static initialization, in any order.
AllocatorRegistry& allocator_registry() {
  static auto* r = new AllocatorRegistry();  // leaked: stream threads may free tensors at exit
  return *r;
}

}  // namespace

CachingAllocator& install_caching_allocator(DeviceRuntime& runtime) {
  AllocatorRegistry& r = allocator_registry();
  CachingAllocator* allocator;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    CachingAllocator*& slot = r.allocators[static_cast<int>(runtime.type())];
    if (slot == nullptr) slot = new CachingAllocator(runtime);  // leaked, as the registry
    allocator = slot;
  }
  register_allocator(runtime.type(), allocator);
  return *allocator;
}

CachingAllocator& caching_allocator_for(DeviceType type) {
  AllocatorRegistry& r = allocator_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  CachingAllocator* a = r.allocators[static_cast<int>(type)];
  if (a == nullptr) {
    fail("no caching allocator for {} devices: {}", device_type_name(type),
         type == DeviceType::CPU ? "CPU memory does not go through it"
                                 : "this build of chorus has no such backend (CUDA needs a CUDA toolkit at build time)");
  }
  return *a;
}

size_t memory_allocated(Device device) { return memory_stats(device).allocated_bytes; }
size_t memory_reserved(Device device) { return memory_stats(device).reserved_bytes; }
size_t max_memory_allocated(Device device) { return memory_stats(device).peak_allocated_bytes; }
size_t max_memory_reserved(Device device) { return memory_stats(device).peak_reserved_bytes; }
MemoryStats memory_stats(Device device) { return caching_allocator_for(device.type).stats(device); }
void reset_peak_memory_stats(Device device) { caching_allocator_for(device.type).reset_peak_memory_stats(device); }
void empty_cache(Device device) { caching_allocator_for(device.type).empty_cache(device); }

bool from_caching_allocator(const Storage& storage) {
  if (!storage || storage->data() == nullptr || storage->device().is_cpu()) return false;
  return caching_allocator_for(storage->device().type).owns(storage->data(), storage->device());
}

void record_stream(const Storage& storage, const Stream& stream) {
  if (!storage || storage->data() == nullptr) return;
  if (storage->device() != stream.device()) {
    fail("record_stream: the storage is on {} but the stream on {}", storage->device().str(), stream.device().str());
  }
  caching_allocator_for(stream.device().type).record_stream(storage->data(), stream);
}

}  // namespace chorus
