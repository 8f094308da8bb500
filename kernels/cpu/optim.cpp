// Optimizer updates as kernels: one fused pass per parameter over contiguous float32/float64
// parameter, gradient and state buffers, so an optimizer step runs on the parameters' device. The
// per-element update is kernels/shared/optim_math.h's, which the CUDA kernels instantiate too.
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shared/optim_math.h"

// kernels/cpu builds with -mfma; without this the compiler would fuse w -= lr * d into one
// multiply-add and the updates would no longer equal optim's arithmetic (optim_math_test pins it).
#pragma GCC optimize("fp-contract=off")

namespace chorus::kernels::cpu {

namespace sm = ::chorus::kernels::shared;

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double weight_decay,
              double momentum, double dampening, bool nesterov, bool first_step) {
  auto run = [&]<typename T>() {
    const auto update = sm::make_sgd_update<T>(lr, momentum, dampening, weight_decay, nesterov, first_step);
    T* w = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    const int64_t n = param.numel();
    // Elementwise over distinct buffers: vector loops, split across threads for large tensors.
    // Vectorizing changes no result (no contraction; division and sqrt are exact in every lane).
    if (momentum_buffer.defined()) {
      T* v = momentum_buffer.data_ptr<T>();
      // The flags chosen once, outside the loop (a select inside it stops vectorization).
      auto loop = [&]<bool First, bool Nesterov>() {
        parallel_for(0, n, kGrainSize, [&](int64_t lo, int64_t hi) {
          simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT {
            update.template with_momentum<First, Nesterov>(w[i], g[i], v[i]);
          });
        });
      };
      if (update.first) {
        if (update.nesterov) loop.template operator()<true, true>();
        else loop.template operator()<true, false>();
      } else {
        if (update.nesterov) loop.template operator()<false, true>();
        else loop.template operator()<false, false>();
      }
    } else {
      parallel_for(0, n, kGrainSize, [&](int64_t lo, int64_t hi) {
        simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT { update(w[i], g[i]); });
      });
    }
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,
               double step_size, double bias_correction2_sqrt, bool decoupled) {
  auto run = [&]<typename T>() {
    const sm::AdamUpdate<T> update{static_cast<T>(beta1),     static_cast<T>(beta2),
                                   static_cast<T>(eps),       static_cast<T>(step_size),
                                   static_cast<T>(bias_correction2_sqrt), static_cast<T>(weight_decay),
                                   static_cast<T>(1 - lr * weight_decay), decoupled};
    T* w = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* m = exp_avg.data_ptr<T>();
    T* v = exp_avg_sq.data_ptr<T>();
    const int64_t n = param.numel();
    auto loop = [&]<bool Decoupled>() {
      if (max_exp_avg_sq.defined()) {
        T* vmax = max_exp_avg_sq.data_ptr<T>();
        parallel_for(0, n, kGrainSize, [&](int64_t lo, int64_t hi) {
          simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT {
            update.template apply<Decoupled>(w[i], g[i], m[i], v[i], vmax[i]);
          });
        });
      } else {
        parallel_for(0, n, kGrainSize, [&](int64_t lo, int64_t hi) {
          simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT {
            update.template apply<Decoupled>(w[i], g[i], m[i], v[i]);
          });
        });
      }
    };
    if (update.decoupled) loop.template operator()<true>();
    else loop.template operator()<false>();
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

}  // namespace chorus::kernels::cpu
