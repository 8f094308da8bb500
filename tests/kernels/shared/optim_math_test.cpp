// kernels/shared/optim_math.h: each update functor against a plain restatement of optim/'s loop on
// random inputs, bit for bit, and the functors applied over whole tensors reproducing
// optim::SGD/Adam/AdamW steps bit for bit (momentum's first step, nesterov, dampening, weight
// decay, amsgrad; float32 and float64; several steps with changing gradients).
// Built with the default flags, as optim/ is: no FMA contraction on either side.
#include "kernels/shared/optim_math.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/ops.h"

namespace {

using namespace chorus;
namespace sm = chorus::kernels::shared;

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// optim/optimizer.cpp's SGD loop body for one element, restated.
template <typename T>
void sgd_reference(T& w, T g, T* v, double lr, double mom, double damp, double wd, bool nesterov, bool first) {
  const T tlr = static_cast<T>(lr), twd = static_cast<T>(wd), tm = static_cast<T>(mom),
          keep = static_cast<T>(1 - damp);
  T d = g + twd * w;
  if (v) {
    *v = first ? d : tm * *v + keep * d;
    d = nesterov ? d + tm * *v : *v;
  }
  w -= tlr * d;
}

// optim/optimizer.cpp's Adam loop body for one element (step counted from 1), restated.
template <typename T>
void adam_reference(T& w, T g, T& m, T& v, T* vmax, double lr, double b1, double b2, double eps, double wd,
                    bool decoupled, double step) {
  const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
  const double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2), teps = static_cast<T>(eps),
          tstep = static_cast<T>(step_size), tbc2 = static_cast<T>(bc2_sqrt), twd = static_cast<T>(wd),
          decay = static_cast<T>(1 - lr * wd);
  T gi = g;
  if (decoupled) w *= decay;
  else gi += twd * w;
  m = tb1 * m + (T(1) - tb1) * gi;
  v = tb2 * v + (T(1) - tb2) * gi * gi;
  T denom_v = v;
  if (vmax) {
    *vmax = std::max(*vmax, v);
    denom_v = *vmax;
  }
  w -= tstep * m / (std::sqrt(denom_v) / tbc2 + teps);
}

TEMPLATE_TEST_CASE("SgdUpdate is optim's SGD arithmetic for random elements", "[shared][optim]", float, double) {
  using T = TestType;
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> val(-3, 3), frac(0, 1);
  for (int i = 0; i < 20000; ++i) {
    const double lr = frac(rng) * 0.5, mom = i % 4 == 0 ? 0.0 : frac(rng), wd = i % 3 == 0 ? 0.0 : frac(rng) * 0.1;
    const bool nesterov = i % 2 == 0 && mom > 0;
    const double damp = nesterov ? 0.0 : frac(rng) * 0.5;
    const bool first = i % 5 == 0;
    T w0 = static_cast<T>(val(rng)), g = static_cast<T>(val(rng)), v0 = static_cast<T>(val(rng));
    T w_ref = w0, v_ref = v0, w = w0, v = v0;
    const auto update = sm::make_sgd_update<T>(lr, mom, damp, wd, nesterov, first);
    if (mom == 0) {
      sgd_reference<T>(w_ref, g, nullptr, lr, mom, damp, wd, nesterov, first);
      update(w, g);
    } else {
      sgd_reference<T>(w_ref, g, &v_ref, lr, mom, damp, wd, nesterov, first);
      update(w, g, v);
    }
    REQUIRE(same_bits(w, w_ref));
    REQUIRE(same_bits(v, v_ref));
    REQUIRE(w != w0);  // the update did something (lr, g random and nonzero)
  }
}

TEMPLATE_TEST_CASE("AdamUpdate is optim's Adam/AdamW arithmetic for random elements", "[shared][optim]", float,
                   double) {
  using T = TestType;
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> val(-3, 3), frac(0, 1);
  for (int i = 0; i < 20000; ++i) {
    const double lr = frac(rng) * 0.1, b1 = 0.5 + 0.49 * frac(rng), b2 = 0.9 + 0.0999 * frac(rng);
    const double eps = i % 2 ? 1e-8 : 1e-3 * frac(rng), wd = i % 3 == 0 ? 0.0 : frac(rng) * 0.1;
    const bool decoupled = i % 2 == 0, amsgrad = i % 4 < 2;
    const double step = 1 + static_cast<int>(frac(rng) * 50);
    const T w0 = static_cast<T>(val(rng)), g = static_cast<T>(val(rng));
    const T m0 = static_cast<T>(val(rng) * 0.1), v0 = static_cast<T>(frac(rng)), vmax0 = static_cast<T>(frac(rng));
    T w_ref = w0, m_ref = m0, v_ref = v0, vmax_ref = vmax0;
    T w = w0, m = m0, v = v0, vmax = vmax0;
    adam_reference<T>(w_ref, g, m_ref, v_ref, amsgrad ? &vmax_ref : nullptr, lr, b1, b2, eps, wd, decoupled, step);
    const auto update = sm::make_adam_update<T>(lr, b1, b2, eps, wd, decoupled, step);
    if (amsgrad) update(w, g, m, v, vmax);
    else update(w, g, m, v);
    REQUIRE(same_bits(w, w_ref));
    REQUIRE(same_bits(m, m_ref));
    REQUIRE(same_bits(v, v_ref));
    REQUIRE(same_bits(vmax, vmax_ref));
  }
}

// Parameters of a few shapes, random values; gradients are set fresh before each step.
std::vector<Tensor> make_params(DType dtype, uint64_t seed) {
  Generator g(seed);
  std::vector<Tensor> ps;
  for (const Shape& s : std::vector<Shape>{{17, 5}, {33}, {2, 3, 4}}) {
    Tensor p = randn(s, TensorOptions{.dtype = dtype}, &g);
    p.requires_grad_(true);
    ps.push_back(p);
  }
  return ps;
}

std::vector<Tensor> copies(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.detach().clone());
  return out;
}

// Applies f(T* w, const T* g, int64_t n, size_t param_index) on contiguous float/double data.
template <typename F>
void for_each_param(std::vector<Tensor>& ws, const std::vector<Tensor>& gs, const F& f) {
  for (size_t i = 0; i < ws.size(); ++i) {
    if (ws[i].dtype() == kFloat32) f(ws[i].data_ptr<float>(), gs[i].data_ptr<float>(), ws[i].numel(), i);
    else f(ws[i].data_ptr<double>(), gs[i].data_ptr<double>(), ws[i].numel(), i);
  }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  return ca.sizes() == cb.sizes() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.raw_data_ptr(), cb.raw_data_ptr(), ca.nbytes()) == 0;
}

TEST_CASE("SgdUpdate over tensors reproduces optim::SGD steps bit for bit", "[shared][optim]") {
  struct Config {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (DType dt : {kFloat32, kFloat64}) {
    for (Config c : {Config{0, 0, 0, false}, Config{0, 0, 1e-2, false}, Config{0.9, 0.1, 5e-3, false},
                     Config{0.8, 0, 1e-2, true}}) {
      const double lr = 0.05;
      std::vector<Tensor> params = make_params(dt, 3);
      std::vector<Tensor> mine = copies(params), bufs;
      for (const Tensor& p : params) bufs.push_back(zeros(p.sizes(), TensorOptions{.dtype = dt}));
      optim::SGD opt(params, optim::SGDOptions{.lr = lr, .momentum = c.momentum, .dampening = c.dampening,
                                               .weight_decay = c.weight_decay, .nesterov = c.nesterov});
      Generator g(10);
      for (int step = 0; step < 4; ++step) {
        std::vector<Tensor> grads;
        for (Tensor& p : params) {
          grads.push_back(randn(p.sizes(), TensorOptions{.dtype = dt}, &g));
          p.set_grad(grads.back().clone());
        }
        opt.step();
        for_each_param(mine, grads, [&]<typename T>(T* w, const T* gr, int64_t n, size_t i) {
          const auto update = sm::make_sgd_update<T>(lr, c.momentum, c.dampening, c.weight_decay, c.nesterov, step == 0);
          T* v = bufs[i].data_ptr<T>();
          for (int64_t j = 0; j < n; ++j) {
            if (c.momentum != 0) update(w[j], gr[j], v[j]);
            else update(w[j], gr[j]);
          }
        });
        for (size_t i = 0; i < params.size(); ++i) {
          INFO(dtype_name(dt) << " momentum " << c.momentum << " nesterov " << c.nesterov << " step " << step);
          REQUIRE(bitwise_equal(params[i], mine[i]));
        }
      }
      // The parameters moved: a no-op on both sides would also be "equal".
      CHECK_FALSE(bitwise_equal(params[0], make_params(dt, 3)[0]));
    }
  }
}

TEST_CASE("AdamUpdate over tensors reproduces optim::Adam and AdamW steps bit for bit", "[shared][optim]") {
  for (DType dt : {kFloat32, kFloat64}) {
    for (bool decoupled : {false, true}) {
      for (bool amsgrad : {false, true}) {
        const optim::AdamOptions o{.lr = 0.01, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.02,
                                   .amsgrad = amsgrad};
        std::vector<Tensor> params = make_params(dt, 4);
        std::vector<Tensor> mine = copies(params), m, v, vmax;
        for (const Tensor& p : params) {
          m.push_back(zeros(p.sizes(), TensorOptions{.dtype = dt}));
          v.push_back(zeros(p.sizes(), TensorOptions{.dtype = dt}));
          vmax.push_back(zeros(p.sizes(), TensorOptions{.dtype = dt}));
        }
        std::unique_ptr<optim::Optimizer> opt;
        if (decoupled) opt = std::make_unique<optim::AdamW>(params, o);
        else opt = std::make_unique<optim::Adam>(params, o);
        Generator g(11);
        for (int step = 1; step <= 5; ++step) {
          std::vector<Tensor> grads;
          for (Tensor& p : params) {
            // Shrinking gradients make v fall, so amsgrad's max differs from v.
            grads.push_back(randn(p.sizes(), TensorOptions{.dtype = dt}, &g).mul(1.0 / step));
            p.set_grad(grads.back().clone());
          }
          opt->step();
          for_each_param(mine, grads, [&]<typename T>(T* w, const T* gr, int64_t n, size_t i) {
            const auto update = sm::make_adam_update<T>(o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, decoupled, step);
            T* pm = m[i].data_ptr<T>();
            T* pv = v[i].data_ptr<T>();
            T* pvmax = vmax[i].data_ptr<T>();
            for (int64_t j = 0; j < n; ++j) {
              if (amsgrad) update(w[j], gr[j], pm[j], pv[j], pvmax[j]);
              else update(w[j], gr[j], pm[j], pv[j]);
            }
          });
          for (size_t i = 0; i < params.size(); ++i) {
            INFO(dtype_name(dt) << (decoupled ? " AdamW" : " Adam") << " amsgrad " << amsgrad << " step " << step);
            REQUIRE(bitwise_equal(params[i], mine[i]));
          }
        }
        if (amsgrad) CHECK_FALSE(bitwise_equal(vmax[0], v[0]));
      }
    }
  }
}

}  // namespace
