// Storage: a refcounted block of memory on one device, shared by a tensor and all its views.
// CPU blocks are 64-byte aligned (a cache line, and AVX-512's natural alignment). Devices other than
// the CPU allocate through an Allocator registered by their backend (CUDA registers one).
// The version counter lives here because every view of the memory must see in-place writes.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "tensor/device.h"

namespace chorus {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, Device device) = 0;
};

// Backends register their allocator at static-initialization time.
void register_allocator(DeviceType type, Allocator* allocator);
// The allocator for `device`; throws a chorus::Error naming the device when none is registered.
Allocator* allocator_for(Device device);

class StorageImpl {
 public:
  // Owning storage: allocates nbytes on device.
  StorageImpl(size_t nbytes, Device device);
  // Non-owning (from_blob) or custom-owned memory: `deleter` (may be empty) runs on destruction.
  StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // [Releasable storage] Frees the memory of owning storage and keeps the object (and so every
  // tensor and saved tensor on it, and its version): data() is null until reallocate() gives it
  // memory of the same size again, with unspecified contents. What FullyShardedDataParallel does
  // with a unit's gathered parameters between uses (PyTorch's storage resize to 0); any other use
  // of a tensor while its storage is released is a bug of its owner. On a device the memory goes
  // back to the caching allocator as a destructor's would (stream-ordered). Both refuse
  // non-owning storage; releasing twice or reallocating held memory does nothing.
  void release();
  void reallocate();
  bool is_released() const { return owned_ && data_ == nullptr && nbytes_ > 0; }

  // Incremented by every in-place write; saved tensors compare it at backward time.
  uint32_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void free_owned();
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool owned_ = false;
  std::function<void(void*)> deleter_;
  std::atomic<uint32_t> version_{0};
};

using Storage = std::shared_ptr<StorageImpl>;

}  // namespace chorus
