// The cuda DeviceRuntime: a thin layer over cudart (tensor/runtime.h says what each call means).
// Everything above it — Stream, Event, current streams, the pool, the caching allocator — is the
// same code the sim device runs in CI. Registered with the caching allocator at static
// initialization; with no GPU (or no driver) device_count() is 0 and every entry point raises
// "no CUDA device: <the runtime's reason>" through runtime_for().
#include <cuda.h>  // types and flags of the stream memory operations (no libcuda link: see MemOps)
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "tensor/caching_allocator.h"
#include "tensor/error.h"
#include "tensor/runtime.h"

namespace chorus::cuda {
namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so it does not resurface from an unrelated call
    if (status == cudaErrorCudartUnloading) {
      throw DeviceUnloading(fmt::format("CUDA error in {}: {} ({}): the process is exiting", call,
                                        cudaGetErrorString(status), cudaGetErrorName(status)));
    }
    fail("CUDA error in {}: {} ({})", call, cudaGetErrorString(status), cudaGetErrorName(status));
  }
}

#define CHORUS_CUDA(call) check((call), #call)

void check_driver(CUresult status, const char* call) {
  if (status != CUDA_SUCCESS) fail("CUDA driver error in {}: CUresult {}", call, static_cast<int>(status));
}

// cuStreamWriteValue32 / cuStreamWaitValue32 (the v2 stream memory operations, on by default since
// CUDA 11.7), taken from the driver through cudart so that chorus links no libcuda.
struct MemOps {
  using Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  Fn write = nullptr, wait = nullptr;
};
const MemOps& mem_ops() {
  static const MemOps ops = [] {
    MemOps m;
    auto lookup = [](const char* symbol) {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      check(cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found), symbol);
      if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
        fail("CUDA: the driver has no {} (stream memory operations; needs a CUDA 12 driver)", symbol);
      }
      return reinterpret_cast<MemOps::Fn>(fn);
    };
    m.write = lookup("cuStreamWriteValue32");
    m.wait = lookup("cuStreamWaitValue32");
    return m;
  }();
  return ops;
}

// The device address of page-locked host memory (host_malloc maps it).
CUdeviceptr device_pointer(const void* host) {
  void* d = nullptr;
  check(cudaHostGetDevicePointer(&d, const_cast<void*>(host), 0), "cudaHostGetDevicePointer");
  return reinterpret_cast<CUdeviceptr>(d);
}

// Makes `device` current for one call that works on the current device (cudaMalloc, cudaFree,
// cudaStreamCreate, cudaEventCreate, cudaDeviceSynchronize, cudaMemGetInfo) and gives the previous
// one back: these calls name their device explicitly, and leaving it current would part CUDA's
// current device from chorus's (tensor/runtime.cpp's per-thread record), so that a later call on a
// default stream, the null stream, would go to this device's (as sim checks: [The default stream
// is the current device's], tensor/sim/sim.cpp).
class OnDevice {
 public:
  explicit OnDevice(int device) {
    CHORUS_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) CHORUS_CUDA(cudaSetDevice(device));
    else previous_ = -1;
  }
  ~OnDevice() {
    // Not thrown (a destructor); a failure (a sticky error) is cleared from the last-error slot so that
    // no later launch check blames its own kernel, and the next call that returns it reports it.
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = -1;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }

  int device_count() override {
    std::call_once(count_once_, [&] {
      count_status_ = cudaGetDeviceCount(&count_);
      if (count_status_ != cudaSuccess) {
        count_ = 0;
        cudaGetLastError();
      }
    });
    return count_;
  }

  std::string unavailable_reason() override {
    device_count();
    if (count_status_ == cudaSuccess) return "the CUDA driver reports 0 devices";
    return fmt::format("{} ({})", cudaGetErrorString(count_status_), cudaGetErrorName(count_status_));
  }

  // As PyTorch's c10::cuda::SetDevice: cudaSetDevice only when another device is current (a guard around
  // every event record, wait and copy would otherwise make two calls for nothing).
  void set_device(int device) override {
    int current = -1;
    CHORUS_CUDA(cudaGetDevice(&current));
    if (current != device) CHORUS_CUDA(cudaSetDevice(device));
  }

  void* malloc(int device, size_t nbytes) override {
    const OnDevice on_device(device);
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, nbytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;  // the caching allocator frees its cache and retries, then reports
    }
    check(status, "cudaMalloc");
    return p;
  }
  void free(int device, void* ptr) override {
    const OnDevice on_device(device);
    CHORUS_CUDA(cudaFree(ptr));
  }
  size_t total_memory(int device) override {
    const OnDevice on_device(device);
    size_t free_bytes = 0, total = 0;
    CHORUS_CUDA(cudaMemGetInfo(&free_bytes, &total));
    return total;
  }
  void* host_malloc(size_t nbytes) override {
    void* p = nullptr;
    // Mapped: stream memory operations (stream_write_value) address it from the device.
    CHORUS_CUDA(cudaHostAlloc(&p, nbytes, cudaHostAllocPortable | cudaHostAllocMapped));
    return p;
  }
  void host_free(void* ptr) override { CHORUS_CUDA(cudaFreeHost(ptr)); }
  bool is_page_locked(const void* ptr) override {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
      (void)cudaGetLastError();  // not a pointer CUDA knows (before CUDA 11 this was an error): pageable
      return false;
    }
    return attributes.type == cudaMemoryTypeHost;
  }

  StreamHandle create_stream(int device, bool high_priority) override {
    const OnDevice on_device(device);
    int least = 0, greatest = 0;
    CHORUS_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    CHORUS_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least));
    return s;
  }
  // The legacy default stream (handle 0), as PyTorch's default stream: it orders against every
  // blocking stream of the device.
  StreamHandle default_stream(int) override { return nullptr; }
  bool query_stream(StreamHandle s) override {
    const cudaError_t status = cudaStreamQuery(static_cast<cudaStream_t>(s));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(status, "cudaStreamQuery");
    return true;
  }
  void synchronize_stream(StreamHandle s) override { CHORUS_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(s))); }
  void synchronize_device(int device) override {
    const OnDevice on_device(device);
    CHORUS_CUDA(cudaDeviceSynchronize());
  }

  void memcpy_async(void* dst, const void* src, size_t nbytes, CopyKind kind, StreamHandle s) override {
    const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
    CHORUS_CUDA(cudaMemcpyAsync(dst, src, nbytes, k, static_cast<cudaStream_t>(s)));
  }

  void launch_host_task(StreamHandle s, std::function<void()> fn, std::vector<const void*>) override {
    // cudaLaunchHostFunc: the function runs on a driver thread once the stream reaches it; it must
    // not call CUDA (so CUDA kernels never come this way).
    auto* heap = new std::function<void()>(std::move(fn));
    CHORUS_CUDA(cudaLaunchHostFunc(
        static_cast<cudaStream_t>(s),
        [](void* p) {
          auto* f = static_cast<std::function<void()>*>(p);
          (*f)();
          delete f;
        },
        heap));
  }

  void stream_write_value(StreamHandle s, uint32_t* word, uint32_t value) override {
    const MemOps& ops = mem_ops();
    check_driver(ops.write(static_cast<CUstream>(s), device_pointer(word), value, CU_STREAM_WRITE_VALUE_DEFAULT),
                 "cuStreamWriteValue32");
  }
  void stream_wait_value(StreamHandle s, const uint32_t* word, uint32_t value) override {
    const MemOps& ops = mem_ops();
    check_driver(ops.wait(static_cast<CUstream>(s), device_pointer(word), value, CU_STREAM_WAIT_VALUE_GEQ),
                 "cuStreamWaitValue32");
  }

  EventHandle create_event(int device, bool enable_timing) override {
    const OnDevice on_device(device);
    cudaEvent_t e = nullptr;
    CHORUS_CUDA(cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void destroy_event(EventHandle e) override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  void record_event(EventHandle e, StreamHandle s) override {
    CHORUS_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
  }
  void stream_wait_event(StreamHandle s, EventHandle e) override {
    CHORUS_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
  }
  bool query_event(EventHandle e) override {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(status, "cudaEventQuery");
    return true;
  }
  void synchronize_event(EventHandle e) override { CHORUS_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); }
  double elapsed_ms(EventHandle start, EventHandle end) override {
    float ms = 0;
    CHORUS_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return ms;
  }

 private:
  std::once_flag count_once_;
  int count_ = 0;
  cudaError_t count_status_ = cudaSuccess;
};

CudaRuntime& runtime() {
  static CudaRuntime* rt = [] {
    auto* r = new CudaRuntime();  // leaked: streams and the allocator outlive static destruction
    register_runtime(DeviceType::CUDA, r);
    install_caching_allocator(*r);
    return r;
  }();
  return *rt;
}

const bool g_registered = (runtime(), true);

}  // namespace
}  // namespace chorus::cuda
