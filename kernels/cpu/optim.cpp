// Optimizer updates as kernels: one fused pass per parameter over contiguous float32/float64
// parameter, gradient and state buffers, so an optimizer step runs on the parameters' device.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace chorus::kernels::cpu {

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double weight_decay,
              double momentum, double dampening, bool nesterov, bool first_step) {
  auto run = [&]<typename T>() {
    T* w = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* v = momentum_buffer.defined() ? momentum_buffer.data_ptr<T>() : nullptr;
    const T tlr = static_cast<T>(lr), twd = static_cast<T>(weight_decay), tm = static_cast<T>(momentum),
            keep = static_cast<T>(1 - dampening);
    const int64_t n = param.numel();
    for (int64_t i = 0; i < n; ++i) {
      T d = g[i] + twd * w[i];
      if (v) {
        v[i] = first_step ? d : tm * v[i] + keep * d;
        d = nesterov ? d + tm * v[i] : v[i];
      }
      w[i] -= tlr * d;
    }
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,
               double step_size, double bias_correction2_sqrt, bool decoupled) {
  auto run = [&]<typename T>() {
    T* w = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* m = exp_avg.data_ptr<T>();
    T* v = exp_avg_sq.data_ptr<T>();
    T* vmax = max_exp_avg_sq.defined() ? max_exp_avg_sq.data_ptr<T>() : nullptr;
    const T tb1 = static_cast<T>(beta1), tb2 = static_cast<T>(beta2), teps = static_cast<T>(eps),
            tstep = static_cast<T>(step_size), tbc2 = static_cast<T>(bias_correction2_sqrt),
            twd = static_cast<T>(weight_decay), decay = static_cast<T>(1 - lr * weight_decay);
    const int64_t n = param.numel();
    for (int64_t i = 0; i < n; ++i) {
      T gi = g[i];
      if (decoupled) w[i] *= decay;
      else gi += twd * w[i];
      m[i] = tb1 * m[i] + (T(1) - tb1) * gi;
      v[i] = tb2 * v[i] + (T(1) - tb2) * gi * gi;
      T denom_v = v[i];
      if (vmax) {
        vmax[i] = std::max(vmax[i], v[i]);
        denom_v = vmax[i];
      }
      w[i] -= tstep * m[i] / (std::sqrt(denom_v) / tbc2 + teps);
    }
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

}  // namespace chorus::kernels::cpu
