// The device seam: one kernel table per device type, and one dispatching function per kernel.
// The op layer (autograd/ops) checks arguments, then calls kernels::unary(...) & co.; those look at
// the tensors' device and call that device's table entry. A backend is added by filling a table
// (kernels/cpu/table.cpp, kernels/sim/, kernels/cuda/), never by editing ops.
// Kernels check nothing a user can get wrong; every tensor argument of one call is on one device.
#pragma once

#include <type_traits>

#include "kernels/kernel_table.h"

namespace chorus::kernels {

// Backends register their table at static initialization (the cpu table is always there).
void register_kernel_table(DeviceType type, const KernelTable* table);
// The table of `device`'s type; throws naming `kernel` and the device when there is none.
const KernelTable& kernel_table(Device device, const char* kernel);
// Whether `device` has kernels in this build (false: e.g. CUDA without a toolkit).
bool has_kernels(DeviceType type);

namespace detail {
inline void collect_device(Device&, bool&) {}
template <typename T, typename... Rest>
void collect_device(Device& device, bool& found, const T& first, const Rest&... rest) {
  if constexpr (std::is_same_v<T, Tensor>) {
    if (first.defined()) {
      if (!found) {
        device = first.device();
        found = true;
      } else if (first.device() != device) {
        fail("internal error: a kernel got tensors on {} and {}", device.str(), first.device().str());
      }
    }
  } else if constexpr (std::is_same_v<T, TensorList>) {
    for (const Tensor& t : first) collect_device(device, found, t);
  }
  collect_device(device, found, rest...);
}
template <typename... A>
Device device_of(const A&... args) {
  Device device = Device::cpu();
  bool found = false;
  collect_device(device, found, args...);
  return device;
}
[[noreturn]] void missing_kernel(const char* kernel, Device device);
}  // namespace detail

// kernels::unary(op, out, in) etc.: run the kernel of the tensors' device.
#define CHORUS_DISPATCH_ENTRY(name, params, args)                                   \
  inline void name params {                                                         \
    const Device device_ = detail::device_of args;                                  \
    const KernelTable& table_ = kernel_table(device_, #name);                       \
    if (table_.name == nullptr) detail::missing_kernel(#name, device_);             \
    table_.name args;                                                               \
  }
CHORUS_KERNEL_LIST(CHORUS_DISPATCH_ENTRY)
#undef CHORUS_DISPATCH_ENTRY

inline void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) { binary(op, out, a, b, 1); }

}  // namespace chorus::kernels
