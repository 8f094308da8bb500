// The cuda kernel table, filled from the kernels the .cu files of this folder define (kernels.h) and
// registered for DeviceType::CUDA at static initialization (the library is alwayslink). Every entry
// of CHORUS_KERNEL_LIST is filled (tests/kernels/cuda:kernel_table_test checks it).
#include "kernels/cuda/kernels.h"
#include "kernels/dispatch.h"

namespace chorus::kernels::cuda_impl {
namespace {

// The kernels implemented on CUDA so far (the rest of CHORUS_KERNEL_LIST stays null).
#define CHORUS_CUDA_IMPLEMENTED(X) \
  X(copy)                          \
  X(fill)                          \
  X(unary)                         \
  X(pow_scalar)                    \
  X(clamp)                         \
  X(binary)                        \
  X(where)                         \
  X(arange)                        \
  X(uniform_at)                    \
  X(normal_at)                     \
  X(random_int_at)                  \
  X(sgd_step)                      \
  X(adam_step)                     \
  X(sgd_step_multi)                \
  X(adam_step_multi)               \
  X(reduce)                        \
  X(arg_reduce)                    \
  X(softmax)                       \
  X(softmax_backward)              \
  X(gemm)                          \
  X(bmm)                           \
  X(index_select)                  \
  X(gather)                        \
  X(scatter)                       \
  X(index_add)                     \
  X(layer_norm)                    \
  X(layer_norm_backward)           \
  X(cross_entropy)                 \
  X(cross_entropy_backward)        \
  X(max_pool2d)                    \
  X(max_pool2d_backward)           \
  X(avg_pool2d)                    \
  X(avg_pool2d_backward)           \
  X(adaptive_avg_pool2d)           \
  X(adaptive_avg_pool2d_backward)  \
  X(batch_norm)                    \
  X(batch_norm_backward)           \
  X(conv2d)                        \
  X(conv2d_backward)

const KernelTable& cuda_table() {
  static const KernelTable table = [] {
    KernelTable t;
    t.device_name = "cuda";
#define CHORUS_CUDA_ENTRY(name) t.name = &cuda_impl::name;
    CHORUS_CUDA_IMPLEMENTED(CHORUS_CUDA_ENTRY)
#undef CHORUS_CUDA_ENTRY
    return t;
  }();
  return table;
}

const bool g_registered = (register_kernel_table(DeviceType::CUDA, &cuda_table()), true);

}  // namespace
}  // namespace chorus::kernels::cuda_impl
