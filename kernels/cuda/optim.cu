// Fused optimizer steps on CUDA: one pass per parameter over contiguous float32/float64 parameter,
// gradient and state buffers, each element updated by kernels/shared/optim_math.h (the cpu kernels'
// arithmetic; the library builds with --fmad=false so no multiply-add is fused).
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/optim_math.h"

namespace chorus::kernels::cuda_impl {
namespace {

template <typename T>
__global__ void sgd_kernel(T* w, const T* g, T* v, int64_t n, sh::SgdUpdate<T> update) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (v != nullptr) update(w[i], g[i], v[i]);
    else update(w[i], g[i]);
  }
}

template <typename T>
__global__ void adam_kernel(T* w, const T* g, T* m, T* v, T* vmax, int64_t n, sh::AdamUpdate<T> update) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (vmax != nullptr) update(w[i], g[i], m[i], v[i], vmax[i]);
    else update(w[i], g[i], m[i], v[i]);
  }
}

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data_ptr()) : nullptr;
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double weight_decay,
              double momentum, double dampening, bool nesterov, bool first_step) {
  const int64_t n = param.numel();
  if (n == 0) return;
  auto run = [&]<typename T>() {
    const auto update = sh::make_sgd_update<T>(lr, momentum, dampening, weight_decay, nesterov, first_step);
    LaunchContext ctx(param.device());
    sgd_kernel<T><<<grid_for(n, 256, ctx.sms), 256, 0, ctx.stream>>>(
        static_cast<T*>(param.raw_data_ptr()), static_cast<const T*>(grad.raw_data_ptr()),
        ptr_or_null<T>(momentum_buffer), n, update);
    check_launch("sgd_step");
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,
               double step_size, double bias_correction2_sqrt, bool decoupled) {
  const int64_t n = param.numel();
  if (n == 0) return;
  auto run = [&]<typename T>() {
    const sh::AdamUpdate<T> update{static_cast<T>(beta1),     static_cast<T>(beta2),
                                   static_cast<T>(eps),       static_cast<T>(step_size),
                                   static_cast<T>(bias_correction2_sqrt), static_cast<T>(weight_decay),
                                   static_cast<T>(1 - lr * weight_decay), decoupled};
    LaunchContext ctx(param.device());
    adam_kernel<T><<<grid_for(n, 256, ctx.sms), 256, 0, ctx.stream>>>(
        static_cast<T*>(param.raw_data_ptr()), static_cast<const T*>(grad.raw_data_ptr()),
        static_cast<T*>(exp_avg.raw_data_ptr()), static_cast<T*>(exp_avg_sq.raw_data_ptr()),
        ptr_or_null<T>(max_exp_avg_sq), n, update);
    check_launch("adam_step");
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

}  // namespace chorus::kernels::cuda_impl
