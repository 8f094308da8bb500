// Optimizer updates as kernels over contiguous float32/float64 parameter, gradient and state
// buffers, so an optimizer step runs on the parameters' device: one fused pass per parameter
// (sgd_step, adam_step) or one pass over a whole list of parameters (sgd_step_multi,
// adam_step_multi, the "foreach" path). The per-element update is kernels/shared/optim_math.h's,
// which the CUDA kernels instantiate too; both forms run the same loop below.
#include <algorithm>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shared/optim_math.h"

// kernels/cpu builds with -mfma; without this the compiler would fuse w -= lr * d into one
// multiply-add and the updates would no longer equal optim's arithmetic (optim_math_test pins it).
// (clang decides contraction where an expression is written, so optim_math.h says it too.)
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace chorus::kernels::cpu {
namespace {

namespace sm = ::chorus::kernels::shared;

// Every element of every tensor as one index space [0, total), split evenly across threads:
// `piece(t, lo, hi)` runs elements [lo, hi) of tensor t. A list of many small tensors (biases, norm
// weights) then costs one thread team instead of one inline loop each, and one large tensor among
// small ones is shared between threads instead of landing on one.
template <typename Piece>
void over_elements(const std::vector<int64_t>& numels, const Piece& piece) {
  std::vector<int64_t> start(numels.size() + 1, 0);  // start[t]: elements before tensor t
  for (size_t t = 0; t < numels.size(); ++t) start[t + 1] = start[t] + numels[t];
  parallel_for(0, start.back(), kGrainSize, [&](int64_t lo, int64_t hi) {
    // The last tensor starting at or before lo holds lo (empty tensors share their start with the
    // next one, so they are never picked).
    size_t t = std::upper_bound(start.begin(), start.end(), lo) - start.begin() - 1;
    while (lo < hi) {
      const int64_t end = std::min(hi, start[t + 1]);
      if (end > lo) piece(t, lo - start[t], end - start[t]);
      lo = end;
      ++t;
    }
  });
}

template <typename T>
std::vector<T*> pointers(const TensorList& list) {
  std::vector<T*> out;
  out.reserve(list.size());
  for (const Tensor& t : list) out.push_back(t.data_ptr<T>());
  return out;
}

template <typename T>
void sgd_lists(const TensorList& params, const TensorList& grads, const TensorList& momentum_buffers,
               const sm::SgdUpdate<T>& update) {
  const std::vector<T*> w = pointers<T>(params), g = pointers<T>(grads);
  std::vector<int64_t> numels;
  for (const Tensor& p : params) numels.push_back(p.numel());
  // Elementwise over distinct buffers: vector loops. Vectorizing changes no result (no contraction;
  // division and sqrt are exact in every lane), nor does where a thread's range starts.
  if (!momentum_buffers.empty()) {
    const std::vector<T*> v = pointers<T>(momentum_buffers);
    // The flags chosen once, outside the loop (a select inside it stops vectorization).
    auto loop = [&]<bool First, bool Nesterov>() {
      over_elements(numels, [&](size_t t, int64_t lo, int64_t hi) {
        T* wt = w[t];
        const T* gt = g[t];
        T* vt = v[t];
        simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT {
          update.template with_momentum<First, Nesterov>(wt[i], gt[i], vt[i]);
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
    over_elements(numels, [&](size_t t, int64_t lo, int64_t hi) {
      T* wt = w[t];
      const T* gt = g[t];
      simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT { update(wt[i], gt[i]); });
    });
  }
}

template <typename T>
void adam_lists(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs, const sm::AdamUpdate<T>& update) {
  const std::vector<T*> w = pointers<T>(params), g = pointers<T>(grads), m = pointers<T>(exp_avgs),
                        v = pointers<T>(exp_avg_sqs);
  std::vector<int64_t> numels;
  for (const Tensor& p : params) numels.push_back(p.numel());
  auto loop = [&]<bool Decoupled>() {
    if (!max_exp_avg_sqs.empty()) {
      const std::vector<T*> vmax = pointers<T>(max_exp_avg_sqs);
      over_elements(numels, [&](size_t t, int64_t lo, int64_t hi) {
        T *wt = w[t], *mt = m[t], *vt = v[t], *xt = vmax[t];
        const T* gt = g[t];
        simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT {
          update.template apply<Decoupled>(wt[i], gt[i], mt[i], vt[i], xt[i]);
        });
      });
    } else {
      over_elements(numels, [&](size_t t, int64_t lo, int64_t hi) {
        T *wt = w[t], *mt = m[t], *vt = v[t];
        const T* gt = g[t];
        simd_for_uncontracted(lo, hi, [&](int64_t i) CHORUS_ELEMENT {
          update.template apply<Decoupled>(wt[i], gt[i], mt[i], vt[i]);
        });
      });
    }
  };
  if (update.decoupled) loop.template operator()<true>();
  else loop.template operator()<false>();
}

template <typename T>
sm::AdamUpdate<T> adam_update(double lr, double beta1, double beta2, double eps, double weight_decay,
                              double step_size, double bias_correction2_sqrt, bool decoupled) {
  return sm::AdamUpdate<T>{static_cast<T>(beta1),     static_cast<T>(beta2),
                           static_cast<T>(eps),       static_cast<T>(step_size),
                           static_cast<T>(bias_correction2_sqrt), static_cast<T>(weight_decay),
                           static_cast<T>(1 - lr * weight_decay), decoupled};
}

TensorList one_or_none(const Tensor& t) { return t.defined() ? TensorList{t} : TensorList{}; }

}  // namespace

void sgd_step_multi(const TensorList& params, const TensorList& grads, const TensorList& momentum_buffers, double lr,
                    double weight_decay, double momentum, double dampening, bool nesterov, bool first_step) {
  if (params.empty()) return;
  auto run = [&]<typename T>() {
    sgd_lists<T>(params, grads, momentum_buffers,
                 sm::make_sgd_update<T>(lr, momentum, dampening, weight_decay, nesterov, first_step));
  };
  if (params.front().dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void adam_step_multi(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                     const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs, double lr, double beta1,
                     double beta2, double eps, double weight_decay, double step_size, double bias_correction2_sqrt,
                     bool decoupled) {
  if (params.empty()) return;
  auto run = [&]<typename T>() {
    adam_lists<T>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                  adam_update<T>(lr, beta1, beta2, eps, weight_decay, step_size, bias_correction2_sqrt, decoupled));
  };
  if (params.front().dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double weight_decay,
              double momentum, double dampening, bool nesterov, bool first_step) {
  sgd_step_multi({param}, {grad}, one_or_none(momentum_buffer), lr, weight_decay, momentum, dampening, nesterov,
                 first_step);
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,
               double step_size, double bias_correction2_sqrt, bool decoupled) {
  adam_step_multi({param}, {grad}, {exp_avg}, {exp_avg_sq}, one_or_none(max_exp_avg_sq), lr, beta1, beta2, eps,
                  weight_decay, step_size, bias_correction2_sqrt, decoupled);
}

}  // namespace chorus::kernels::cpu
