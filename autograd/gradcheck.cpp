#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::autograd {
namespace {

// Pointer to element `k` (row-major order over the sizes) of a float64 tensor with any strides.
double* element(const Tensor& t, int64_t k) {
  int64_t offset = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    offset += (k % t.size(d)) * t.stride(d);
    k /= t.size(d);
  }
  return static_cast<double*>(t.raw_data_ptr()) + offset;
}

Tensor flat_output(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs) {
  Tensor y = f(inputs);
  if (!y.defined()) fail("gradcheck: the function returned an undefined tensor");
  // clone(): the output may be a view of an input (view ops, to() to the same dtype), and the
  // perturbed input is restored before the two outputs are compared.
  return y.to(kFloat64).reshape({-1}).cpu().clone();  // (read on the host below: a device output comes back)
}

}  // namespace

bool gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
               const GradcheckOptions& options) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].requires_grad() && inputs[i].dtype() != kFloat64) {
      fail("gradcheck: input {} requires grad but has dtype {}; use float64 inputs for finite differences", i,
           dtype_name(inputs[i].dtype()));
    }
    // The finite differences perturb the inputs through host pointers: a device input would be read
    // and written on the host (a crash on sim, an illegal access on CUDA).
    if (inputs[i].defined() && !inputs[i].device().is_cpu()) {
      fail("gradcheck: input {} is on {}; expected CPU inputs (the function may move them to a device itself)", i,
           inputs[i].device().str());
    }
  }
  // Numerical Jacobian columns: perturb each input element in place (no history involved).
  Tensor y0;
  {
    NoGradGuard guard;
    y0 = flat_output(f, inputs);
  }
  const int64_t m = y0.numel();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    const int64_t n = x.numel();
    // numeric[j][k] and analytic[j][k] for output j, input element k.
    std::vector<double> numeric(static_cast<size_t>(m * n)), analytic(static_cast<size_t>(m * n), 0.0);
    for (int64_t k = 0; k < n; ++k) {
      double* p = element(x, k);
      const double orig = *p;
      Tensor plus, minus;
      {
        NoGradGuard guard;
        *p = orig + options.eps;
        plus = flat_output(f, inputs);
        *p = orig - options.eps;
        minus = flat_output(f, inputs);
        *p = orig;
      }
      const double* pp = plus.data_ptr<double>();
      const double* pm = minus.data_ptr<double>();
      for (int64_t j = 0; j < m; ++j) numeric[j * n + k] = (pp[j] - pm[j]) / (2 * options.eps);
    }
    // Analytic Jacobian rows: one backward per output element with a one-hot gradient.
    Tensor y = f(inputs);
    if (!y.requires_grad()) {
      fail("gradcheck: the output does not require grad although input {} does (no differentiable path)", i);
    }
    for (int64_t j = 0; j < m; ++j) {
      Tensor onehot = zeros({m}, {.dtype = y.dtype(), .device = y.device()});
      {
        NoGradGuard guard;
        onehot.select(0, j).fill_(1);
      }
      TensorList g = grad({y}, {x}, {onehot.reshape(y.sizes())}, /*retain_graph=*/true, /*allow_unused=*/true);
      if (!g[0].defined()) continue;
      Tensor gx = g[0].to(kFloat64).contiguous();
      if (gx.sizes() != x.sizes()) {
        fail("gradcheck: gradient for input {} has shape {} but the input has shape {}", i, shape_str(gx.sizes()),
             shape_str(x.sizes()));
      }
      const double* pg = gx.data_ptr<double>();
      for (int64_t k = 0; k < n; ++k) analytic[j * n + k] = pg[k];
    }
    double worst = 0;
    int64_t wj = -1, wk = -1;
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t k = 0; k < n; ++k) {
        const double a = analytic[j * n + k], nu = numeric[j * n + k];
        const double excess = std::abs(a - nu) - (options.atol + options.rtol * std::abs(nu));
        if (!(excess <= 0) && (wj < 0 || !(excess <= worst))) {
          worst = excess;
          wj = j;
          wk = k;
        }
      }
    }
    if (wj >= 0) {
      fail("gradcheck: Jacobian mismatch for output element {} with respect to element {} of input {} (shape {}): "
           "numerical {:.10g}, analytical {:.10g} (atol {}, rtol {})",
           wj, wk, i, shape_str(x.sizes()), numeric[wj * n + wk], analytic[wj * n + wk], options.atol, options.rtol);
    }
  }
  return true;
}

}  // namespace chorus::autograd
