// The caching device allocator: device memory for tensors on every non-CPU device (cuda, sim),
// written once over DeviceRuntime, after PyTorch's CUDACachingAllocator. Raw device allocation is
// slow and synchronizing (cudaMalloc/cudaFree), so memory is taken from the runtime in large
// segments and never given back on free: it is cached and handed out again.
//
// Design
// - Rounding. Every request is rounded up to a multiple of 512 bytes (kMinBlockSize), so blocks stay
//   aligned for any dtype and vector width, and nearly equal requests share cached blocks. A request
//   of 0 bytes gets nullptr and touches no memory (as PyTorch).
// - Two pools per device. Requests up to 1 MiB (kSmallSize) are served by the small pool, whose
//   segments are 2 MiB (kSmallBuffer); larger ones by the large pool, whose segments are 20 MiB
//   (kLargeBuffer) for requests under 10 MiB (kMinLargeAlloc) and the request rounded up to 2 MiB
//   (kRoundLarge) otherwise. Keeping small blocks apart stops a few long-lived small tensors from
//   pinning large segments.
// - Blocks and segments. A segment is one runtime allocation; it is cut into blocks that tile it,
//   linked prev/next in address order. A free block is in its pool; an allocated one is in the
//   device's table of live blocks by address.
// - Best fit. A pool is ordered by (stream, size, address); a request takes the smallest free block
//   of its own stream that is large enough, else a new segment from the runtime.
// - Splitting. When the chosen block is larger than the request, the rest becomes a free block of
//   its own if it is at least 512 bytes (small pool) or more than 1 MiB (large pool); a smaller rest
//   stays inside the allocated block (counted as allocated: large blocks are not worth cutting into
//   slivers that only the smallest large requests could use).
// - Merging. A freed block merges with free neighbours in its segment, so a segment whose tensors
//   are all gone is one free block again, which empty_cache can return to the runtime.
// - Stream ownership ([Stream Ownership]). A block belongs to the stream that was current on its
//   device when it was allocated; its segment belongs to that stream too. A freed block is reused
//   only by allocations on that same stream: work on one stream runs in order, so the next user of
//   the block is ordered after every earlier use on that stream without any synchronization. Free
//   blocks are never handed across streams (the pool key starts with the stream).
// - record_stream ([Record Stream]). A tensor used on another stream (a communication stream, a
//   side stream) must be marked with record_stream(ptr, stream). When such a block is freed, an
//   event is recorded on each of those streams, and the block waits outside the pools until all of
//   them have completed; only then is it freed (merged, returned to its pool). Events are queried,
//   never waited on, at the start of every allocate (process_events), so freeing never blocks the
//   host. Events complete in order per stream, so each stream's queue is checked from the front.
// - Out of memory. When the runtime refuses a segment, the allocator waits for every outstanding
//   event (the only host-blocking path besides empty_cache: blocks awaiting events may be what
//   holds the memory), frees what completed, tries its pool again, then returns every fully free
//   segment to the runtime (empty_cache) and asks once more. If that fails too it throws a
//   chorus::Error with PyTorch's parts and the largest cached block: "sim:0 out of memory: tried to
//   allocate 3.00 GiB (N bytes); 1.00 GiB allocated by tensors, 1.50 GiB reserved by chorus (512.00
//   MiB of it cached but unallocated, the largest cached free block 100.00 MiB), 0.50 GiB free of
//   2.00 GiB total (...)", then what to do (a smaller batch, --accumulate, fragmentation). Free is
//   total minus what this allocator holds: DeviceRuntime reports no other use (with cudaMemGetInfo
//   it could).
// - A failed device (a sticky error, tensor/sim/sim.h): a free whose event records fail keeps its
//   block out of the pools for good instead of throwing from a destructor.
// - Statistics per device: allocated (live blocks, whole block sizes), requested (the bytes asked
//   for), reserved (segments), peaks of allocated and reserved, counts of allocations, frees, OOMs,
//   OOM retries and runtime mallocs/frees; snapshot() lists every segment and block.
// - Threads. One mutex per device guards its pools, table and statistics. deallocate may run on any
//   thread that may make device calls. The lock is not held while the host waits for events
//   (synchronize_events), but it is held while empty_cache and the out-of-memory retry return
//   segments to the runtime, as PyTorch's allocator holds its own around cudaFree, and cudaFree
//   (sim's free too) waits for the device: so work the device waits for must not wait for this
//   lock. Stream tasks make no device calls ([No device calls on a stream], tensor/sim/sim.cpp) and
//   sim's kernels hold non-owning views, so none frees a tensor; a task that captured the last
//   owner of a device tensor, destroyed on its stream's thread, could deadlock against a free.
//
// Each device type has one CachingAllocator, installed by its backend at static initialization
// (install_caching_allocator registers it as the type's Allocator); the free functions at the end
// are the user API (torch.cuda.memory_allocated & co.).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/runtime.h"
#include "tensor/storage.h"

namespace chorus {

struct MemoryStats {
  size_t allocated_bytes = 0;  // live blocks (a block may exceed its request, see Splitting)
  size_t requested_bytes = 0;  // bytes the live allocations asked for
  size_t reserved_bytes = 0;   // segments held from the runtime
  size_t peak_allocated_bytes = 0;
  size_t peak_reserved_bytes = 0;
  uint64_t num_allocs = 0;
  uint64_t num_frees = 0;
  uint64_t num_ooms = 0;           // allocations that threw out of memory
  uint64_t num_alloc_retries = 0;  // allocations that had to wait for events / empty the cache
  uint64_t num_device_mallocs = 0;  // segments taken from the runtime
  uint64_t num_device_frees = 0;    // segments returned to it
};

// One segment and its blocks in address order (torch.cuda.memory_snapshot).
struct MemoryBlockInfo {
  enum class State : uint8_t { Free, Allocated, AwaitingEvents };
  uintptr_t address = 0;
  size_t size = 0;
  State state = State::Free;
};
struct MemorySegmentInfo {
  uintptr_t address = 0;
  size_t size = 0;
  bool small_pool = false;
  StreamHandle stream = nullptr;  // the stream owning every block of the segment
  std::vector<MemoryBlockInfo> blocks;
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kMinBlockSize = 512;
  static constexpr size_t kSmallSize = size_t(1) << 20;
  static constexpr size_t kSmallBuffer = size_t(2) << 20;
  static constexpr size_t kLargeBuffer = size_t(20) << 20;
  static constexpr size_t kMinLargeAlloc = size_t(10) << 20;
  static constexpr size_t kRoundLarge = size_t(2) << 20;

  explicit CachingAllocator(DeviceRuntime& runtime);
  // Waits for pending events and returns free segments; segments with live blocks are left alone.
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // On the current stream of `device` (current_stream(device)); throws chorus::Error when out of memory.
  void* allocate(size_t nbytes, Device device) override;
  void deallocate(void* ptr, Device device) override;

  // Marks the live block at `ptr` (on stream's device) as used by `stream`; see [Record Stream].
  void record_stream(void* ptr, const Stream& stream);
  // Whether `ptr` is a live block of this allocator on `device` (not from_blob memory).
  bool owns(void* ptr, Device device);
  // Waits for pending events, then returns every free, unsplit segment of `device` to the runtime.
  void empty_cache(Device device);

  MemoryStats stats(Device device);
  void reset_peak_memory_stats(Device device);
  std::vector<MemorySegmentInfo> snapshot(Device device);

  DeviceRuntime& runtime() const { return runtime_; }

  // The size a request is rounded to, and the segment size a new segment for it gets.
  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct DeviceState;
  struct Block;
  struct BlockPool;

  DeviceState& state(Device device, const char* what);
  void* allocate_slow(DeviceState& st, size_t rounded, size_t nbytes, StreamHandle stream, Device device);
  Block* find_free_block(BlockPool& pool, StreamHandle stream, size_t size);
  Block* new_segment(DeviceState& st, BlockPool& pool, StreamHandle stream, size_t size);
  void* hand_out(DeviceState& st, Block* block, size_t size, size_t nbytes);
  void free_block(DeviceState& st, Block* block);
  void process_events(DeviceState& st);
  void synchronize_events(DeviceState& st);
  void release_cached_segments(DeviceState& st);
  std::string out_of_memory_message(DeviceState& st, Device device, size_t nbytes, size_t size);

  DeviceRuntime& runtime_;
  std::mutex states_mutex_;
  std::map<int, std::unique_ptr<DeviceState>> states_;
};

// The caching allocator of `type` (throws chorus::Error when none is installed).
CachingAllocator& caching_allocator_for(DeviceType type);
// Creates the caching allocator over `runtime` (once per device type; later calls return the first)
// and registers it as the Allocator of runtime.type().
CachingAllocator& install_caching_allocator(DeviceRuntime& runtime);

// The user API, per device (torch.cuda.memory_allocated & co.).
size_t memory_allocated(Device device);
size_t memory_reserved(Device device);
size_t max_memory_allocated(Device device);
size_t max_memory_reserved(Device device);
void reset_peak_memory_stats(Device device);
MemoryStats memory_stats(Device device);
void empty_cache(Device device);
// Marks `storage` as used on `stream`: its memory is not reused before the work `stream` has been
// given so far completes (see [Record Stream]). A no-op for empty storage.
void record_stream(const Storage& storage, const Stream& stream);
// Whether `storage`'s memory is a live block of its device's caching allocator: false for the CPU,
// empty storage, and device memory from from_blob, which record_stream refuses.
bool from_caching_allocator(const Storage& storage);

}  // namespace chorus
