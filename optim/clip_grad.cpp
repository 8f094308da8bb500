#include "optim/clip_grad.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  NoGradGuard no_grad;
  double total = 0;
  if (std::isinf(norm_type)) {
    // A NaN anywhere makes the norm NaN, as PyTorch's (std::max would drop it: max(a, NaN) is a).
    for (const Tensor& g : grads) {
      const double m = g.abs().max().to(kFloat64).item<double>();
      total = std::isnan(m) || std::isnan(total) ? m + total : std::max(total, m);
    }
  } else {
    for (const Tensor& g : grads) total += std::pow(norm(g.to(kFloat64), norm_type).item<double>(), norm_type);
    total = std::pow(total, 1.0 / norm_type);
  }
  if (error_if_nonfinite && !std::isfinite(total)) {
    fail("clip_grad_norm_: the total norm of order {} of the gradients is non-finite ({}), so it cannot be clipped",
         norm_type, total);
  }
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (const Tensor& p : params) {
      if (!p.grad().defined()) continue;
      Tensor g = p.grad();
      g.mul_(coef);
    }
  }
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  if (clip_value < 0) fail("clip_grad_value_: clip_value must be >= 0, got {}", clip_value);
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    if (!p.grad().defined()) continue;
    Tensor g = p.grad();
    g.clamp_(Scalar(-clip_value), Scalar(clip_value));
  }
}

}  // namespace chorus::optim
