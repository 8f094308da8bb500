// The device seam: one kernel table per device type, and one dispatching function per kernel.
// The op layer (autograd/ops) checks arguments, then calls kernels::unary(...) & co.; those look at
// the tensors' device and call that device's table entry. A backend is added by filling a table
// (kernels/cpu/table.cpp, kernels/sim/, kernels/cuda/), never by editing ops.
// Kernels check nothing a user can get wrong; every tensor argument of one call is on one device.
#pragma once

#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/kernel_table.h"
#include "kernels/layout_conversions.h"
#include "tensor/runtime.h"
#include "tensor/stream_sanitizer.h"

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

// Which tensor arguments (Tensor or TensorList, counted from 0 in order) a kernel writes, for the
// stream-order sanitizer (tensor/stream_sanitizer.h); every other tensor argument is read. A written
// argument that is also read (gemm's c with beta, scatter's self) needs only the write's checks.
constexpr uint32_t write_mask(std::string_view kernel) {
  if (kernel == "arg_reduce" || kernel == "max_pool2d") return 0b11;
  if (kernel == "layer_norm" || kernel == "layer_norm_backward" || kernel == "cross_entropy" ||
      kernel == "conv2d_backward" || kernel == "batch_norm_backward") {
    return 0b111;
  }
  if (kernel == "batch_norm") return 0b11000111;  // out, save_mean, save_rstd; running_mean, running_var
  if (kernel == "sgd_step" || kernel == "sgd_step_multi") return 0b101;      // param, momentum buffer
  if (kernel == "adam_step" || kernel == "adam_step_multi") return 0b11101;  // param, exp_avg(_sq), max
  return 0b1;
}

inline void add_accesses(std::vector<stream_sanitizer::Access>& out, int& index, uint32_t mask, const Tensor& t) {
  out.push_back(stream_sanitizer::access_of(t, ((mask >> index) & 1) != 0));
  ++index;
}
inline void add_accesses(std::vector<stream_sanitizer::Access>& out, int& index, uint32_t mask, const TensorList& l) {
  for (const Tensor& t : l) out.push_back(stream_sanitizer::access_of(t, ((mask >> index) & 1) != 0));
  ++index;
}
template <typename T>
void add_accesses(std::vector<stream_sanitizer::Access>&, int&, uint32_t, const T&) {}

// Tells the sanitizer what the kernel about to be launched on the device's current stream touches.
template <typename... A>
void sanitize_launch(const char* kernel, uint32_t mask, Device device, const A&... args) {
  std::vector<stream_sanitizer::Access> accesses;
  int index = 0;
  (add_accesses(accesses, index, mask, args), ...);
  stream_sanitizer::on_launch(kernel, device, current_stream(device).handle(), accesses);
}
// kernels::copy's arguments go to the layout-conversion counter (kernels/layout_conversions.h).
template <typename... A>
void count_layout_conversion(const A&... args) {
  if constexpr (sizeof...(A) == 2 && (std::is_same_v<A, Tensor> && ...)) layout_conversions::detail::note_copy(args...);
}
}  // namespace detail

// kernels::unary(op, out, in) etc.: run the kernel of the tensors' device.
#define CHORUS_UNPAREN(...) __VA_ARGS__
#define CHORUS_DISPATCH_ENTRY(name, params, args)                                   \
  inline void name params {                                                         \
    const Device device_ = detail::device_of args;                                  \
    const KernelTable& table_ = kernel_table(device_, #name);                       \
    if (table_.name == nullptr) detail::missing_kernel(#name, device_);             \
    if (!device_.is_cpu() && stream_sanitizer::active(device_.type)) {              \
      constexpr uint32_t mask_ = detail::write_mask(#name);                         \
      detail::sanitize_launch(#name, mask_, device_, CHORUS_UNPAREN args);          \
    }                                                                               \
    if constexpr (std::string_view(#name) == "copy") {                              \
      detail::count_layout_conversion(CHORUS_UNPAREN args);                         \
    }                                                                               \
    table_.name args;                                                               \
  }
CHORUS_KERNEL_LIST(CHORUS_DISPATCH_ENTRY)
#undef CHORUS_DISPATCH_ENTRY

inline void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) { binary(op, out, a, b, 1); }

}  // namespace chorus::kernels
