// The sim device's kernel table: every cpu kernel, enqueued on the current stream of the tensors'
// sim device and run by that stream's worker thread, as a CUDA kernel is launched on the current
// stream. The wrapper is generated once for every entry of CHORUS_KERNEL_LIST (kernels/kernel_table.h).
//
// What a task holds: tensor arguments become aliases over the same memory that do not own it (same
// sizes, strides, dtype), as a CUDA kernel holds raw pointers: freeing a tensor right after the
// launch is safe only through stream order and record_stream, as on CUDA; a tensor list (the multi-tensor
// optimizer steps) becomes a list of such aliases, one task for the whole list. Pointer arguments
// (clamp's bounds) are copied by value. The buffers named to the runtime are the storages' base
// pointers, every list element's included: the sim device opens exactly those segments while the
// task runs, so a kernel that touched memory it was not given would crash, as a host read of device
// memory does.
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/nn_basic.h"
#include "kernels/dispatch.h"
#include "tensor/fault.h"
#include "tensor/runtime.h"
#include "tensor/sim/sim.h"

namespace chorus::kernels::sim {
namespace {

// How an argument of type A is held by the task and handed back to the kernel.
template <typename A>
struct Held {
  using type = std::decay_t<A>;
  static type hold(A a) { return a; }
  static A pass(const type& h) { return h; }
};
template <>
struct Held<const Tensor&> {
  using type = Tensor;
  // Over the same memory without owning it, as a CUDA kernel holds raw pointers: what keeps the
  // memory from reuse until the task has run is stream order and record_stream, as on CUDA.
  static Tensor hold(const Tensor& t) {
    if (!t.defined()) return Tensor();
    const Storage& owner = t.impl_ptr()->storage();
    auto raw = std::make_shared<StorageImpl>(owner->data(), owner->nbytes(), owner->device(), nullptr);
    return Tensor(std::make_shared<TensorImpl>(std::move(raw), t.storage_offset(), t.sizes(), t.strides(), t.dtype()));
  }
  static const Tensor& pass(const Tensor& h) { return h; }
};
template <>
struct Held<const TensorList&> {
  using type = TensorList;
  static TensorList hold(const TensorList& list) {
    TensorList out;
    out.reserve(list.size());
    for (const Tensor& t : list) out.push_back(Held<const Tensor&>::hold(t));
    return out;
  }
  static const TensorList& pass(const TensorList& h) { return h; }
};
template <>
struct Held<const Scalar*> {
  using type = std::optional<Scalar>;
  static type hold(const Scalar* s) { return s ? std::optional<Scalar>(*s) : std::nullopt; }
  static const Scalar* pass(const type& h) { return h ? &*h : nullptr; }
};

template <typename A>
void name_buffer(std::vector<const void*>& buffers, const A& a) {
  if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) {
    if (a.defined() && a.storage()) buffers.push_back(a.storage()->data());
  } else if constexpr (std::is_same_v<std::decay_t<A>, TensorList>) {
    for (const Tensor& t : a) name_buffer(buffers, t);  // a multi-tensor kernel touches every one
  }
}

// Each entry's name for the runtime's errors ("the kernel add ..." when it names memory a GPU would
// fault on).
namespace names {
#define CHORUS_SIM_NAME(name, params, args) constexpr char name[] = "the kernel " #name;
CHORUS_KERNEL_LIST(CHORUS_SIM_NAME)
#undef CHORUS_SIM_NAME
}  // namespace names

// [A library handle is made at a thread's first call] The CUDA kernel table calls cuBLAS for gemm
// and bmm and may call cuDNN for convolutions, batch norm and pooling (max, average, adaptive
// average; kernels/cuda/cudnn_pool.cpp), through a handle made at
// a host thread's first such call on a device and kept for the thread's life (handle_for in
// kernels/cuda/blas.cpp and cudnn_common.h). Making one is not free of synchronization: cublasCreate
// "allocates hardware resources on the host and device" (cuBLAS's documentation), and a profile of
// it shows three cudaMalloc calls and a blocking cudaMemcpy, which on the legacy default stream
// (chorus's default stream on CUDA) waits for everything queued there; cudnnCreate also allocates
// device resources, and sim takes the same, stricter reading for it. So sim does the same at a
// thread's first call of each library on a device: a device allocation (an implicit
// synchronization of the device's streams, tensor/sim/sim.h) that it keeps, as the handle keeps its
// resources, and a blocking copy from pageable memory on the device's default stream, which returns
// once that stream has run what was queued before it. The host blocks there, so it counts in
// host_sync_count, as it does on CUDA. A design in which a thread's first product waits for
// something that only that thread would do later hangs here as on a GPU.
// fault::Point::kSimLibraryHandle removes it (sim_runtime_test's negative control).
enum class Library : size_t { kCublas, kCudnn, kCount };

void make_library_handle(const Device& device, Library library) {
  constexpr int kMaxDevices = 64;
  thread_local std::array<std::array<bool, kMaxDevices>, static_cast<size_t>(Library::kCount)> made{};
  CHORUS_CHECK(device.index >= 0 && device.index < kMaxDevices, "sim: device index {} out of range", device.index);
  bool& done = made[static_cast<size_t>(library)][static_cast<size_t>(device.index)];
  if (done || fault::removed(fault::Point::kSimLibraryHandle)) return;
  DeviceRuntime& rt = ::chorus::sim::device_runtime();
  constexpr size_t kBytes = 256;
  void* resources = rt.malloc(device.index, kBytes);  // kept, as a handle's resources are
  const std::array<unsigned char, kBytes> zeros{};
  rt.memcpy_async(resources, zeros.data(), kBytes, CopyKind::HostToDevice, rt.default_stream(device.index));
  note_host_sync();
  done = true;
}

template <const char* Name>
constexpr std::optional<Library> library_of() {
  constexpr std::string_view n = Name;
  if (n == names::gemm || n == names::bmm) return Library::kCublas;
  if (n == names::conv2d || n == names::conv2d_backward || n == names::batch_norm || n == names::batch_norm_backward ||
      n == names::max_pool2d || n == names::max_pool2d_backward || n == names::avg_pool2d ||
      n == names::avg_pool2d_backward || n == names::adaptive_avg_pool2d || n == names::adaptive_avg_pool2d_backward) {
    return Library::kCudnn;
  }
  return std::nullopt;
}

template <auto Kernel, const char* Name>
struct OnStream;

template <typename... A, void (*Kernel)(A...), const char* Name>
struct OnStream<Kernel, Name> {
  static void run(A... args) {
    const Device device = detail::device_of(args...);
    std::vector<const void*> buffers;
    (name_buffer(buffers, args), ...);
    auto held = std::make_tuple(Held<A>::hold(args)...);
    // The tensors' device is current while the kernel is launched, as CUDA's LaunchContext makes it
    // (a CUDA kernel launch on a stream of another device fails; sim refuses it the same way).
    const DeviceGuard guard(device);
    if constexpr (constexpr std::optional<Library> library = library_of<Name>()) make_library_handle(device, *library);
    const Stream stream = current_stream(device);
    ::chorus::sim::launch_kernel(
        stream.handle(),
        [held = std::move(held)]() { std::apply([](const auto&... h) { Kernel(Held<A>::pass(h)...); }, held); },
        std::move(buffers), Name);
  }
};

// [A copy between overlapping areas] The cuda kernel table copies a tensor into another of the same
// dtype and sizes, both contiguous, with one cudaMemcpyAsync (kernels/cuda/copy.cu), whose areas may
// not overlap (CUDA leaves such a copy undefined); sim's copy is a cpu loop, which would give some
// answer. So sim refuses that case at the launch, as its memcpy_async refuses overlapping areas. One
// and the same memory on both sides is nothing to copy: the cuda kernel returns without a call, and
// so does this (copy_ does not get here then: it skips copying a view onto itself, as PyTorch's).
void copy_checked(const Tensor& dst, const Tensor& src) {
  if (dst.numel() > 0 && dst.dtype() == src.dtype() && dst.sizes() == src.sizes() && dst.is_contiguous() &&
      src.is_contiguous()) {
    const auto d = reinterpret_cast<uintptr_t>(dst.raw_data_ptr()), s = reinterpret_cast<uintptr_t>(src.raw_data_ptr());
    const auto n = static_cast<uintptr_t>(dst.nbytes());
    if (d == s) return;
    if (d < s + n && s < d + n) {
      fail("the kernel copy on {}: the source ({} bytes at {:#x}) and the destination ({:#x}) overlap; on CUDA this copy "
           "is one cudaMemcpyAsync, whose areas may not overlap (undefined there), so sim refuses it; copy through a "
           "temporary (clone) instead",
           dst.device().str(), n, s, d);
    }
  }
  OnStream<&cpu::copy, names::copy>::run(dst, src);
}

const KernelTable& sim_table() {
  static const KernelTable table = [] {
    KernelTable t;
    t.device_name = "sim";
#define CHORUS_SIM_ENTRY(name, params, args) t.name = &OnStream<&cpu::name, names::name>::run;
    CHORUS_KERNEL_LIST(CHORUS_SIM_ENTRY)
#undef CHORUS_SIM_ENTRY
    t.copy = &copy_checked;
    return t;
  }();
  return table;
}

const bool g_registered = [] {
  register_kernel_table(DeviceType::Sim, &sim_table());
  return true;
}();

}  // namespace
}  // namespace chorus::kernels::sim
