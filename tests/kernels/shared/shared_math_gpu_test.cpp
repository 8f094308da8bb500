// Runs only on a machine with a GPU (tag "gpu"): the kernels/shared functors evaluated by CUDA
// kernels against the same functors on the CPU, on the same random inputs. Philox words, casts,
// comparisons and exact ops must match bit for bit; transcendental ops within CUDA's documented
// ulp errors, and formulas within a few ulps more (nvcc fuses multiply-adds).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/shared/optim_math.h"
#include "kernels/shared/philox.h"
#include "kernels/shared/pointwise_math.h"
#include "tensor/dtype.h"
#include "tests/kernels/shared/shared_math_device.h"

namespace {

using namespace chorus::kernels::shared;
using testing::DeviceOp;

template <typename T>
T on_cpu(DeviceOp op, T x, T y) {
  switch (op) {
    case DeviceOp::Neg: return Neg{}(x);
    case DeviceOp::Abs: return Abs{}(x);
    case DeviceOp::Exp: return Exp{}(x);
    case DeviceOp::Log: return Log{}(x);
    case DeviceOp::Log1p: return Log1p{}(x);
    case DeviceOp::Sqrt: return Sqrt{}(x);
    case DeviceOp::Rsqrt: return Rsqrt{}(x);
    case DeviceOp::Tanh: return Tanh{}(x);
    case DeviceOp::Sigmoid: return Sigmoid{}(x);
    case DeviceOp::Relu: return Relu{}(x);
    case DeviceOp::GeluErf: return GeluErf{}(x);
    case DeviceOp::GeluTanh: return GeluTanh{}(x);
    case DeviceOp::Sin: return Sin{}(x);
    case DeviceOp::Cos: return Cos{}(x);
    case DeviceOp::Sign: return Sign{}(x);
    case DeviceOp::Reciprocal: return Reciprocal{}(x);
    case DeviceOp::Floor: return Floor{}(x);
    case DeviceOp::Ceil: return Ceil{}(x);
    case DeviceOp::Round: return Round{}(x);
    case DeviceOp::Trunc: return Trunc{}(x);
    case DeviceOp::Erf: return Erf{}(x);
    case DeviceOp::Erfinv: return Erfinv{}(x);
    case DeviceOp::Expm1: return Expm1{}(x);
    case DeviceOp::Log2: return Log2{}(x);
    case DeviceOp::Log10: return Log10{}(x);
    case DeviceOp::Add: return Add{}(x, y);
    case DeviceOp::Sub: return SubAlpha<T>{T(0.5)}(x, y);
    case DeviceOp::Mul: return Mul{}(x, y);
    case DeviceOp::Div: return Div{}(x, y);
    case DeviceOp::Max: return Max{}(x, y);
    case DeviceOp::Min: return Min{}(x, y);
    case DeviceOp::Pow: return Pow{}(x, y);
    case DeviceOp::ReluBackward: return ReluBackward{}(x, y);
    case DeviceOp::TanhBackward: return TanhBackward{}(x, y);
    case DeviceOp::SigmoidBackward: return SigmoidBackward{}(x, y);
    case DeviceOp::GeluErfBackward: return GeluErfBackward{}(x, y);
    case DeviceOp::GeluTanhBackward: return GeluTanhBackward{}(x, y);
    case DeviceOp::Lt: return Lt{}(x, y) ? T(1) : T(0);
    case DeviceOp::Eq: return Eq{}(x, y) ? T(1) : T(0);
    case DeviceOp::kCount: break;
  }
  return T(0);
}

// Ops whose device result must equal the CPU's bit for bit (IEEE-exact on both sides, no fusable
// multiply-add): everything else differs by the libraries' ulp errors or an FMA.
bool exact(DeviceOp op) {
  switch (op) {
    case DeviceOp::Neg: case DeviceOp::Abs: case DeviceOp::Sqrt: case DeviceOp::Relu: case DeviceOp::Sign:
    case DeviceOp::Reciprocal: case DeviceOp::Floor: case DeviceOp::Ceil: case DeviceOp::Round:
    case DeviceOp::Trunc: case DeviceOp::Add: case DeviceOp::Mul: case DeviceOp::Div: case DeviceOp::Max:
    case DeviceOp::Min: case DeviceOp::ReluBackward: case DeviceOp::Lt: case DeviceOp::Eq:
      return true;
    default:
      return false;
  }
}

// How much the op magnifies a relative error of its input (at least 1): erfinv near +-1 magnifies one
// ulp of x by |x f'(x) / f(x)| = |x| sqrt(pi)/2 exp(f^2) / |f| (about 1000 at x = 0.99994), so two
// correct float implementations differ there by that many ulps of the result.
template <typename T>
double condition(DeviceOp op, T x, T want) {
  if (op != DeviceOp::Erfinv || want == T(0)) return 1.0;
  const double w = static_cast<double>(want);
  return std::max(1.0, std::abs(static_cast<double>(x)) * 0.886226925452758 * std::exp(w * w) / std::abs(w));
}

template <typename T>
void check_ops(double rtol) {
  REQUIRE(chorus::cuda::device_count() > 0);
  std::mt19937 rng(1);
  std::uniform_real_distribution<T> dist(T(-8), T(8));
  const size_t n = 1 << 16;
  std::vector<T> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = dist(rng);
    y[i] = i % 17 == 0 ? x[i] : dist(rng);  // some equal pairs for Eq
  }
  x[0] = std::numeric_limits<T>::quiet_NaN();
  x[1] = std::numeric_limits<T>::infinity();
  x[2] = -T(0);
  for (int o = 0; o < static_cast<int>(DeviceOp::kCount); ++o) {
    const auto op = static_cast<DeviceOp>(o);
    // Positive inputs where the op needs them (log, sqrt, pow's base).
    std::vector<T> in = x;
    if (op == DeviceOp::Log || op == DeviceOp::Log1p || op == DeviceOp::Sqrt || op == DeviceOp::Rsqrt ||
        op == DeviceOp::Pow) {
      for (T& v : in) v = std::abs(v);
    }
    const std::vector<T> got = testing::ops_on_device<T>(op, in, y);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const T want = on_cpu(op, in[i], y[i]);
      bool ok;
      if (std::isnan(want)) ok = std::isnan(got[i]);
      else if (std::isinf(want)) ok = got[i] == want;
      else if (exact(op)) ok = std::memcmp(&want, &got[i], sizeof(T)) == 0;
      else ok = std::abs(got[i] - want) <= rtol * (std::abs(want) + 1) * condition(op, in[i], want);
      if (!ok && bad++ < 5) UNSCOPED_INFO("op " << o << " of (" << in[i] << ", " << y[i] << "): gpu " << got[i] << ", cpu " << want);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("shared pointwise functors agree on the GPU and the CPU", "[shared][gpu]") {
  check_ops<float>(4e-6);
  check_ops<double>(1e-14);
}

TEST_CASE("Philox words are bit-identical on the GPU", "[shared][gpu]") {
  REQUIRE(chorus::cuda::device_count() > 0);
  const uint64_t seed = 0xabcdef0123456789ull, first = (uint64_t{1} << 32) - 100;  // crosses the counter's word
  const int64_t blocks = 100000;
  const std::vector<uint32_t> got = testing::philox_on_device(seed, first, blocks);
  for (int64_t i = 0; i < blocks; ++i) {
    const PhiloxBlock b = philox4x32_10(seed, first + static_cast<uint64_t>(i));
    for (int j = 0; j < 4; ++j) {
      if (got[static_cast<size_t>(4 * i + j)] != b.w[j]) FAIL("block " << i << " word " << j);
    }
  }
  // Uniform draws are one multiply-add of exact values: equal, or one fused rounding apart.
  const std::vector<float> u = testing::uniform_on_device(seed, 7, 40001);
  const std::vector<float> z = testing::normal_on_device(seed, 7, 40001);
  for (size_t i = 0; i < u.size(); ++i) {
    const float want_u = philox_element(UniformFloatDraw{0.0f, 1.0f}, seed, 7, i);
    REQUIRE(u[i] == want_u);  // lo = 0, span = 1: no rounding at all
    const float want_z = philox_element(NormalFloatDraw{0.0f, 1.0f}, seed, 7, i);
    REQUIRE(std::abs(z[i] - want_z) <= 2e-6f * (1 + std::abs(want_z)));
  }
}

TEST_CASE("float16 and bfloat16 casts are bit-identical on the GPU", "[shared][gpu]") {
  REQUIRE(chorus::cuda::device_count() > 0);
  std::vector<float> x;
  std::mt19937 rng(3);
  for (int i = 0; i < (1 << 20); ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  const std::vector<uint16_t> h = testing::to_half_on_device(x), bf = testing::to_bfloat16_on_device(x);
  for (size_t i = 0; i < x.size(); ++i) {
    REQUIRE(h[i] == float_to_half_bits(x[i]));
    REQUIRE(bf[i] == float_to_bfloat16_bits(x[i]));
  }
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  const std::vector<float> back = testing::from_half_on_device(all);
  for (uint32_t b = 0; b < 65536; ++b) {
    const float want = half_bits_to_float(static_cast<uint16_t>(b));
    REQUIRE(std::memcmp(&back[b], &want, 4) == 0);
  }
}

TEST_CASE("the AdamW update on the GPU tracks the CPU's within fused-multiply-add rounding", "[shared][gpu]") {
  REQUIRE(chorus::cuda::device_count() > 0);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  const size_t n = 10000;
  std::vector<float> w(n), g(n), m(n, 0.0f), v(n, 0.0f), vmax(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    w[i] = dist(rng);
    g[i] = dist(rng);
  }
  std::vector<float> w_cpu = w, m_cpu = m, v_cpu = v, vmax_cpu = vmax;
  testing::adamw_on_device(w, g, m, v, vmax, 1e-3, 0.01, 1);
  const AdamUpdate<float> update = make_adam_update<float>(1e-3, 0.9, 0.999, 1e-8, 0.01, true, 1);
  for (size_t i = 0; i < n; ++i) {
    update(w_cpu[i], g[i], m_cpu[i], v_cpu[i], vmax_cpu[i]);
    REQUIRE(std::abs(w[i] - w_cpu[i]) <= 1e-6f * (1 + std::abs(w_cpu[i])));
    REQUIRE(std::abs(m[i] - m_cpu[i]) <= 1e-6f * std::abs(m_cpu[i]) + 1e-12f);
  }
}

}  // namespace
