#include "tensor/storage.h"

#include <malloc.h>
#include <sanitizer/asan_interface.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "tensor/cpu_memory.h"
#include "tensor/error.h"
#include "tensor/sanitizers.h"

namespace chorus {

// [Aligned huge mapping] `bytes` (a multiple of the page size) of fresh anonymous memory with
// protection `prot`, starting on a 2 MiB boundary and advised for transparent huge pages
// (MADV_HUGEPAGE: the kernel's default "madvise" mode then backs it with 2 MiB pages when first
// touched; where THP is off the advice changes nothing). nullptr when the mapping fails. Maps 2 MiB
// more than asked, then unmaps the ends so that what is left starts on a boundary. Used for large
// CPU blocks ([Huge blocks] below) and for sim's device segments ([Huge segments],
// tensor/sim/sim.cpp, which declares it: no header).
void* map_huge_aligned(size_t bytes, int prot) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t span = bytes + kHuge;
  void* raw = ::mmap(nullptr, span, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
  const uintptr_t end = aligned + bytes;
  if (aligned > start) ::munmap(raw, aligned - start);
  if (start + span > end) ::munmap(reinterpret_cast<void*>(end), start + span - end);
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // advice: failure changes nothing
  return reinterpret_cast<void*>(aligned);
}

namespace {

constexpr size_t kCpuAlignment = 64;

// Small blocks come from malloc. Blocks of 1 MiB and more are cached when freed and handed out again
// for requests of about the same size: glibc returns such blocks to the kernel (mmap/munmap), so
// every new large tensor would fault its pages in again, which costs more than the arithmetic on
// them (an add of 16M floats: 200 ms with fresh pages, 8 ms with warm ones, on this project's VMs).
// At most kCacheLimit bytes are held free; beyond it blocks go back to the system. Smaller blocks:
// see the constructor.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kLarge = size_t(1) << 20;
  static constexpr size_t kGranule = size_t(64) << 10;
  static constexpr size_t kCacheLimit = size_t(2) << 30;
  static constexpr size_t kHuge = size_t(2) << 20;

  CpuAllocator() {
    // Below 32 MiB, let glibc keep freed memory in its heap instead of returning it (trim) or
    // mapping each block afresh (mmap): a 256 KiB matmul output otherwise faults in 64 pages
    // every step, which costs as much as the product itself.
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }

  void* allocate(size_t nbytes, Device) override {
    // aligned_alloc wants a multiple of the alignment; a zero-byte tensor still gets a valid pointer.
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    const size_t asked = rounded;  // before a large block's rounding to kGranule
    if (rounded >= kLarge) {
      rounded = (rounded + kGranule - 1) / kGranule * kGranule;
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.lower_bound(rounded);
      if (it != free_.end() && it->first <= rounded + rounded / 4) {  // reuse without wasting much
        void* ptr = it->second;
        expose(ptr, asked, it->first);
        cached_bytes_ -= it->first;
        free_.erase(it);
        return ptr;
      }
    }
    void* ptr = fresh(rounded);
    if (ptr == nullptr && rounded >= kLarge) {
      release_cache();  // the cache may be what is holding the memory
      ptr = fresh(rounded);
    }
    if (ptr == nullptr) fail("CPU allocator: out of memory allocating {} bytes", nbytes);
    if (rounded >= kLarge) {
      expose(ptr, asked, rounded);
      std::lock_guard<std::mutex> lock(mutex_);
      large_[ptr] = rounded;
    }
    return ptr;
  }

  // [Poisoned cache] Under AddressSanitizer, a large block is addressable only as far as the tensor
  // asked for (rounded to the 64 bytes every CPU block is rounded to, as a small block's malloc size
  // is), and a cached free block not at all: ASan sees a large block's reuse as malloc's, never its
  // free, so without this a use after free of a cached block, or a read past a tensor into the rest
  // of a larger cached block, went unreported. cpu_memory_test checks it in the ASan build. Outside
  // ASan the macros are no-ops.
  static void expose(void* ptr, size_t asked, size_t block) {
    ASAN_UNPOISON_MEMORY_REGION(ptr, asked);
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(ptr) + asked, block - asked);
  }

  // [Huge blocks] A block of 2 MiB or more is mapped by itself (mmap) on a 2 MiB boundary and
  // marked for transparent huge pages (MADV_HUGEPAGE; the kernel's default "madvise" mode then
  // backs it with 2 MiB pages when first touched), as PyTorch does with THP_MEM_ALLOC_ENABLE. A
  // fresh block's pages fault in on first touch; with 4 KiB pages a 188 MB dataset is 46,000
  // faults, and on this project's VMs, whose page tables are paravirtualized, those faults were a
  // large share of a short run (examples/resnet, 4 steps: 232k faults before, 57k after). Mapped,
  // not taken from malloc: 2 MiB-aligned blocks in glibc's heap (posix_memalign) left it faulting
  // pages in again on every BERT-mini step (28-72 faults a step against none, and the step 15%
  // slower). The cache below holds such blocks like any other large block. Under AddressSanitizer
  // they stay malloc's memory, so that ASan keeps its redzones around them. Where THP is off
  // ("never"), madvise changes nothing.
  static bool mapped(size_t bytes) {
#if CHORUS_ASAN
    (void)bytes;
    return false;
#else
    return bytes >= kHuge;
#endif
  }

  static void* fresh(size_t bytes) {
    if (!mapped(bytes)) return std::aligned_alloc(kCpuAlignment, bytes);
    return map_huge_aligned(bytes, PROT_READ | PROT_WRITE);  // bytes: a multiple of kGranule
  }

  static void release(void* ptr, size_t bytes) {
    ASAN_UNPOISON_MEMORY_REGION(ptr, bytes);  // back to ASan's allocator as it gave it
    if (mapped(bytes)) {
      ::munmap(ptr, bytes);
    } else {
      std::free(ptr);
    }
  }

  void deallocate(void* ptr, Device) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = large_.find(ptr);
      if (it != large_.end()) {
        if (cached_bytes_ + it->second <= kCacheLimit) {
          ASAN_POISON_MEMORY_REGION(ptr, it->second);  // [Poisoned cache]
          free_.emplace(it->second, ptr);
          cached_bytes_ += it->second;
          return;
        }
        const size_t bytes = it->second;
        large_.erase(it);
        release(ptr, bytes);
        return;
      }
    }
    std::free(ptr);
  }

  void release_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, ptr] : free_) {
      large_.erase(ptr);
      release(ptr, size);
    }
    free_.clear();
    cached_bytes_ = 0;
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;        // cached free blocks by size
  std::unordered_map<void*, size_t> large_;  // every live or cached large block's size
  size_t cached_bytes_ = 0;
};

struct Registry {
  std::mutex mutex;
  Allocator* allocators[3] = {nullptr, nullptr, nullptr};
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    // Never destroyed (tensors held by other statics may be freed after it would be), so its cached
    // blocks stay reachable to the end: LeakSanitizer does not count them as leaks.
    static CpuAllocator* cpu = new CpuAllocator();
    reg->allocators[static_cast<int>(DeviceType::CPU)] = cpu;
    return reg;
  }();
  return *r;
}

// Live bytes of owning CPU storage and their peak (tensor/cpu_memory.h).
std::atomic<size_t> g_cpu_allocated{0};
std::atomic<size_t> g_cpu_peak{0};
thread_local long long t_cpu_net_bytes = 0;

void count_cpu_allocation(size_t nbytes) {
  t_cpu_net_bytes += static_cast<long long>(nbytes);
  const size_t now = g_cpu_allocated.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  size_t peak = g_cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

size_t cpu_memory_allocated() { return g_cpu_allocated.load(std::memory_order_relaxed); }
size_t cpu_max_memory_allocated() { return g_cpu_peak.load(std::memory_order_relaxed); }
long long cpu_memory_allocated_by_this_thread() { return t_cpu_net_bytes; }
void reset_cpu_peak_memory_stats() { g_cpu_peak.store(g_cpu_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed); }

void register_allocator(DeviceType type, Allocator* allocator) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.allocators[static_cast<int>(type)] = allocator;
}

Allocator* allocator_for(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  Allocator* a = r.allocators[static_cast<int>(device.type)];
  if (a == nullptr) {
    fail("no {} device: no allocator for {} in this build of chorus (CUDA tensors need chorus built "
         "with a CUDA toolkit and a machine with a CUDA device)",
         device_type_name(device.type), device.str());
  }
  return a;
}

StorageImpl::StorageImpl(size_t nbytes, Device device)
    : nbytes_(nbytes), device_(device), owned_(true) {
  data_ = allocator_for(device)->allocate(nbytes, device);
  if (device.is_cpu()) count_cpu_allocation(nbytes);
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), owned_(false), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() {
  if (owned_) {
    if (data_ != nullptr) free_owned();
  } else if (deleter_) {
    deleter_(data_);
  }
}

void StorageImpl::free_owned() {
  allocator_for(device_)->deallocate(data_, device_);
  if (device_.is_cpu()) {
    g_cpu_allocated.fetch_sub(nbytes_, std::memory_order_relaxed);
    t_cpu_net_bytes -= static_cast<long long>(nbytes_);
  }
  data_ = nullptr;
}

void StorageImpl::release() {
  if (!owned_) fail("Storage::release: the storage does not own its memory (from_blob); only owning storage can be released");
  if (data_ != nullptr && nbytes_ > 0) free_owned();
}

void StorageImpl::reallocate() {
  if (!owned_) fail("Storage::reallocate: the storage does not own its memory (from_blob)");
  if (data_ != nullptr || nbytes_ == 0) return;
  data_ = allocator_for(device_)->allocate(nbytes_, device_);
  if (device_.is_cpu()) count_cpu_allocation(nbytes_);
}

}  // namespace chorus
