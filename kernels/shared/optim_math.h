// Per-element optimizer updates (SGD with momentum/dampening/nesterov/weight decay, Adam with
// amsgrad and L2 weight decay, AdamW's decoupled decay) with exactly the arithmetic of the loops in
// optim/optimizer.cpp, so a fused CUDA update kernel and the CPU optimizers step parameters alike.
// The per-step scalars (learning rate, bias corrections) are computed once on the host in double
// by make_sgd_update / make_adam_update, then rounded to T, as optim/ does.
#pragma once

#include <math.h>

#include "kernels/shared/hd.h"

// Each update rounds as written (no a * b + c fused into one multiply-add). g++ decides contraction
// where the code is inlined to (kernels/cpu/optim.cpp turns it off there; nvcc gets --fmad=false);
// clang decides it where the expression is written: here.
#if defined(__clang__)
#pragma float_control(push)
#pragma clang fp contract(off)
#endif

namespace chorus::kernels::shared {

// SGD (PyTorch's formulation): d = g + wd * w; with momentum, v = first ? d : m * v + (1 - damp) * d
// and d = nesterov ? d + m * v : v; then w -= lr * d.
template <typename T>
struct SgdUpdate {
  T lr, weight_decay, momentum, keep;  // keep = 1 - dampening
  bool nesterov;
  bool first;  // the momentum buffer was just created: it takes d as it is

  // Without momentum (momentum == 0: optim/ keeps no buffer).
  CHORUS_HD CHORUS_INLINE void operator()(T& w, T g) const {
    T d = g + weight_decay * w;
    w -= lr * d;
  }
  // With a momentum buffer v.
  CHORUS_HD CHORUS_INLINE void operator()(T& w, T g, T& v) const {
    if (first) {
      if (nesterov) with_momentum<true, true>(w, g, v);
      else with_momentum<true, false>(w, g, v);
    } else {
      if (nesterov) with_momentum<false, true>(w, g, v);
      else with_momentum<false, false>(w, g, v);
    }
  }
  // The same with the flags fixed at compile time: CPU loops call these (choosing once per
  // tensor), since a run-time select between floating-point expressions is not if-converted
  // under -ftrapping-math and keeps the loop from vectorizing.
  template <bool First, bool Nesterov>
  CHORUS_HD CHORUS_INLINE void with_momentum(T& w, T g, T& v) const {
    T d = g + weight_decay * w;
    if constexpr (First) v = d;
    else v = momentum * v + keep * d;
    if constexpr (Nesterov) d = d + momentum * v;
    else d = v;
    w -= lr * d;
  }
};

template <typename T>
CHORUS_HD SgdUpdate<T> make_sgd_update(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                             bool first) {
  return SgdUpdate<T>{static_cast<T>(lr),       static_cast<T>(weight_decay),
                      static_cast<T>(momentum), static_cast<T>(1 - dampening),
                      nesterov,                 first};
}

// Adam / AdamW for one step: m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g;
// w -= step_size * m / (sqrt(v or max(vmax, v)) / sqrt(bias_correction2) + eps), where Adam adds
// wd * w to g first and AdamW multiplies w by (1 - lr * wd) first.
template <typename T>
struct AdamUpdate {
  T beta1, beta2, eps, step_size, bias_correction2_sqrt, weight_decay, decay;  // decay = 1 - lr * wd
  bool decoupled;  // AdamW

  // Without amsgrad.
  CHORUS_HD CHORUS_INLINE void operator()(T& w, T g, T& m, T& v) const {
    if (decoupled) apply<true>(w, g, m, v);
    else apply<false>(w, g, m, v);
  }
  // With amsgrad: vmax keeps the largest v seen, and the denominator uses it.
  CHORUS_HD CHORUS_INLINE void operator()(T& w, T g, T& m, T& v, T& vmax) const {
    if (decoupled) apply<true>(w, g, m, v, vmax);
    else apply<false>(w, g, m, v, vmax);
  }
  // The same with `decoupled` fixed at compile time (see SgdUpdate::with_momentum).
  template <bool Decoupled>
  CHORUS_HD CHORUS_INLINE void apply(T& w, T g, T& m, T& v) const {
    moments<Decoupled>(w, g, m, v);
    w -= step_size * m / (sqrt_(v) / bias_correction2_sqrt + eps);
  }
  template <bool Decoupled>
  CHORUS_HD CHORUS_INLINE void apply(T& w, T g, T& m, T& v, T& vmax) const {
    moments<Decoupled>(w, g, m, v);
    vmax = vmax < v ? v : vmax;  // std::max(vmax, v), NaN in vmax kept as std::max keeps it
    w -= step_size * m / (sqrt_(vmax) / bias_correction2_sqrt + eps);
  }

 private:
  template <bool Decoupled>
  CHORUS_HD CHORUS_INLINE void moments(T& w, T g, T& m, T& v) const {
    T gi = g;
    if constexpr (Decoupled) w *= decay;
    else gi += weight_decay * w;
    m = beta1 * m + (T(1) - beta1) * gi;
    v = beta2 * v + (T(1) - beta2) * gi * gi;
  }
  static CHORUS_HD CHORUS_INLINE float sqrt_(float x) { return ::sqrtf(x); }
  static CHORUS_HD CHORUS_INLINE double sqrt_(double x) { return ::sqrt(x); }
};

// The update of step number `step` (1 for the first step), its scalars computed as optim::Adam does.
template <typename T>
CHORUS_HD AdamUpdate<T> make_adam_update(double lr, double beta1, double beta2, double eps, double weight_decay,
                                         bool decoupled, double step) {
  const double bc1 = 1 - ::pow(beta1, step), bc2 = 1 - ::pow(beta2, step);
  const double step_size = lr / bc1, bc2_sqrt = ::sqrt(bc2);
  return AdamUpdate<T>{static_cast<T>(beta1),     static_cast<T>(beta2),        static_cast<T>(eps),
                       static_cast<T>(step_size), static_cast<T>(bc2_sqrt),     static_cast<T>(weight_decay),
                       static_cast<T>(1 - lr * weight_decay), decoupled};
}

}  // namespace chorus::kernels::shared

#if defined(__clang__)
#pragma float_control(pop)
#endif
