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
#include <optional>
#include <tuple>
#include <type_traits>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/nn_basic.h"
#include "kernels/dispatch.h"
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
    const Stream stream = current_stream(device);
    ::chorus::sim::launch_kernel(
        stream.handle(),
        [held = std::move(held)]() { std::apply([](const auto&... h) { Kernel(Held<A>::pass(h)...); }, held); },
        std::move(buffers), Name);
  }
};

const KernelTable& sim_table() {
  static const KernelTable table = [] {
    KernelTable t;
    t.device_name = "sim";
#define CHORUS_SIM_ENTRY(name, params, args) t.name = &OnStream<&cpu::name, names::name>::run;
    CHORUS_KERNEL_LIST(CHORUS_SIM_ENTRY)
#undef CHORUS_SIM_ENTRY
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
