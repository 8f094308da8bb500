#include "nn/init.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::nn::init {
namespace {

void check_floating(const Tensor& t, const char* what) {
  if (!t.defined()) fail("init::{}: the tensor is undefined", what);
  if (!t.is_floating_point()) fail("init::{}: expected a floating-point tensor, got {}", what, dtype_name(t.dtype()));
}

// Writes `values` (computed in float64 on the CPU) into t, keeping t's identity.
void assign(Tensor& t, const Tensor& values) {
  NoGradGuard no_grad;
  t.copy_(values);
}

}  // namespace

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& t) {
  if (t.dim() < 2) {
    fail("init: fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (shape {})",
         shape_str(t.sizes()));
  }
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" || nonlinearity == "conv2d" || nonlinearity == "sigmoid")
    return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  fail("init::calculate_gain: unsupported nonlinearity '{}'", nonlinearity);
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  check_floating(t, "uniform_");
  NoGradGuard no_grad;
  return chorus::uniform_(t, low, high, gen);
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_floating(t, "normal_");
  NoGradGuard no_grad;
  return chorus::normal_(t, mean, std, gen);
}

Tensor& trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator* gen) {
  check_floating(t, "trunc_normal_");
  if (!(a < b)) fail("init::trunc_normal_: expected a < b, got a={} b={}", a, b);
  Generator& g = gen ? *gen : default_generator();
  // Inverse-CDF sampling of the truncated normal (as PyTorch): uniform in [cdf(a), cdf(b)], then
  // the normal quantile. Exact and without rejection loops.
  auto cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  const double lo = cdf((a - mean) / std), hi = cdf((b - mean) / std);
  Tensor u = rand(t.sizes(), {.dtype = kFloat64}, &g).mul((2 * hi - 1) - (2 * lo - 1)).add(2 * lo - 1);
  double* p = u.data_ptr<double>();
  for (int64_t i = 0; i < u.numel(); ++i) {
    // erfinv via Newton steps on erf (a few iterations suffice in double).
    double y = std::clamp(p[i], -1.0 + 1e-15, 1.0 - 1e-15);
    double x = 0.0;
    for (int k = 0; k < 60; ++k) {
      double err = std::erf(x) - y;
      x -= err / (2.0 / std::sqrt(M_PI) * std::exp(-x * x));
      if (std::abs(err) < 1e-15) break;
    }
    p[i] = std::clamp(mean + std * std::sqrt(2.0) * x, a, b);
  }
  assign(t, u);
  return t;
}

Tensor& constant_(Tensor& t, double value) {
  check_floating(t, "constant_");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0.0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1.0); }

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  return init::normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

namespace {
double kaiming_std(const Tensor& t, double a, const std::string& mode, const std::string& nonlinearity) {
  auto [fan_in, fan_out] = fan_in_and_fan_out(t);
  if (mode != "fan_in" && mode != "fan_out") fail("init::kaiming: mode must be 'fan_in' or 'fan_out', got '{}'", mode);
  const int64_t fan = mode == "fan_in" ? fan_in : fan_out;
  if (fan == 0) fail("init::kaiming: cannot initialize a tensor with zero elements (shape {})", shape_str(t.sizes()));
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace

Tensor& kaiming_uniform_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity, Generator* gen) {
  const double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nonlinearity);
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity, Generator* gen) {
  return init::normal_(t, 0.0, kaiming_std(t, a, mode, nonlinearity), gen);
}

}  // namespace chorus::nn::init
