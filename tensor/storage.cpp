#include "tensor/storage.h"

#include <cstdlib>
#include <mutex>

#include "tensor/error.h"

namespace chorus {
namespace {

constexpr size_t kCpuAlignment = 64;

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device) override {
    // aligned_alloc wants a multiple of the alignment; a zero-byte tensor still gets a valid pointer.
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    if (ptr == nullptr) fail("CPU allocator: out of memory allocating {} bytes", nbytes);
    return ptr;
  }
  void deallocate(void* ptr, Device) override { std::free(ptr); }
};

struct Registry {
  std::mutex mutex;
  Allocator* allocators[2] = {nullptr, nullptr};
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    static CpuAllocator cpu;
    reg->allocators[static_cast<int>(DeviceType::CPU)] = &cpu;
    return reg;
  }();
  return *r;
}

}  // namespace

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
    fail("no allocator for device {}: this build of chorus has no {} backend (CUDA tensors need "
         "chorus built with a CUDA toolkit and a machine with a CUDA device)",
         device.str(), device.is_cuda() ? "CUDA" : "such");
  }
  return a;
}

StorageImpl::StorageImpl(size_t nbytes, Device device)
    : nbytes_(nbytes), device_(device), owned_(true) {
  data_ = allocator_for(device)->allocate(nbytes, device);
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), owned_(false), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() {
  if (owned_) {
    allocator_for(device_)->deallocate(data_, device_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace chorus
