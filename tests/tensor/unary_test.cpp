// Unary math (neg, abs, exp, log, log1p, sqrt, rsqrt, tanh, sigmoid, relu, gelu in both forms,
// sin, cos), pow with scalar, tensor and scalar-base exponents, and clamp, against std:: functions
// in double on seeded inputs in each op's domain, contiguous and not; integer inputs of float-only
// ops give float32; float16/bfloat16 compute in float32 and round once to the storage type.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/tensor/tensor_testing.h"

namespace chorus {
namespace {

using testing::atol_for;
using testing::Layout;
using testing::matches;
using testing::matches_exactly;
using testing::random_in;
using testing::random_layout;
using testing::reference_binary;
using testing::reference_unary;
using testing::rtol_for;
using testing::values;

double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  double (*reference)(double);
  double low, high;  // input domain
  bool float_only;   // integer input -> float32 output
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& t) { return neg(t); }, [](double x) { return -x; }, -3, 3, false},
      {"abs", [](const Tensor& t) { return abs(t); }, [](double x) { return std::abs(x); }, -3, 3, false},
      {"relu", [](const Tensor& t) { return relu(t); }, [](double x) { return x > 0 ? x : 0.0; }, -3, 3, false},
      {"exp", [](const Tensor& t) { return exp(t); }, [](double x) { return std::exp(x); }, -5, 5, true},
      {"log", [](const Tensor& t) { return log(t); }, [](double x) { return std::log(x); }, 0.01, 20, true},
      {"log1p", [](const Tensor& t) { return log1p(t); }, [](double x) { return std::log1p(x); }, -0.99, 10, true},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }, [](double x) { return std::sqrt(x); }, 0, 20, true},
      {"rsqrt", [](const Tensor& t) { return rsqrt(t); }, [](double x) { return 1 / std::sqrt(x); }, 0.05, 20, true},
      {"tanh", [](const Tensor& t) { return tanh(t); }, [](double x) { return std::tanh(x); }, -4, 4, true},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }, [](double x) { return 1 / (1 + std::exp(-x)); }, -8, 8,
       true},
      {"gelu", [](const Tensor& t) { return gelu(t); }, gelu_erf, -4, 4, true},
      {"gelu tanh", [](const Tensor& t) { return gelu(t, "tanh"); }, gelu_tanh, -4, 4, true},
      {"sin", [](const Tensor& t) { return sin(t); }, [](double x) { return std::sin(x); }, -6, 6, true},
      {"cos", [](const Tensor& t) { return cos(t); }, [](double x) { return std::cos(x); }, -6, 6, true},
      {"expm1", [](const Tensor& t) { return expm1(t); }, [](double x) { return std::expm1(x); }, -3, 3, true},
      {"erf", [](const Tensor& t) { return erf(t); }, [](double x) { return std::erf(x); }, -3, 3, true},
      {"log2", [](const Tensor& t) { return log2(t); }, [](double x) { return std::log2(x); }, 0.01, 20, true},
      {"log10", [](const Tensor& t) { return log10(t); }, [](double x) { return std::log10(x); }, 0.01, 20, true},
      {"floor", [](const Tensor& t) { return floor(t); }, [](double x) { return std::floor(x); }, -5, 5, false},
      {"ceil", [](const Tensor& t) { return ceil(t); }, [](double x) { return std::ceil(x); }, -5, 5, false},
      {"round", [](const Tensor& t) { return round(t); }, [](double x) { return std::nearbyint(x); }, -5, 5, false},
      {"trunc", [](const Tensor& t) { return trunc(t); }, [](double x) { return std::trunc(x); }, -5, 5, false},
      {"sign", [](const Tensor& t) { return sign(t); }, [](double x) { return double((0 < x) - (x < 0)); }, -5, 5,
       false},
  };
  return cases;
}

}  // namespace

TEST_CASE("unary ops match std:: functions in float32 and float64, contiguous or not", "[tensor][unary]") {
  Generator gen(200);
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : {kFloat32, kFloat64}) {
      for (Layout layout : testing::kAllLayouts) {
        INFO(c.name << " " << dtype_name(dt) << " " << testing::layout_name(layout));
        Tensor x = testing::make_in_layout({4, 6}, layout,
                                           [&](const Shape& s) { return random_in(s, c.low, c.high, dt, gen); });
        Tensor out = c.op(x);
        CHECK(out.dtype() == dt);
        CHECK(out.is_contiguous());
        CHECK(matches(out, {4, 6}, reference_unary(x, c.reference), rtol_for(dt) * 2, atol_for(dt)));
      }
    }
  }
  // 0-d input: a 0-d result.
  Tensor s = scalar_tensor(0.5, {.dtype = kFloat64});
  CHECK(exp(s).dim() == 0);
  CHECK(exp(s).item<double>() == Approx(std::exp(0.5)).epsilon(1e-15));
}

TEST_CASE("float-only unary ops on integer tensors give float32; neg, abs and relu keep the dtype",
          "[tensor][unary][promotion]") {
  Tensor i = tensor<int64_t>({-3, 0, 2, 7});
  for (const UnaryCase& c : unary_cases()) {
    INFO(c.name);
    Tensor in = c.low >= 0 || c.name == "log1p" ? abs(i) : i;
    Tensor out = c.op(in);
    CHECK(out.dtype() == (c.float_only ? kFloat32 : kInt64));
    CHECK(matches(out, {4}, reference_unary(in, c.reference), 2e-6, 1e-6));
  }
  Tensor u = tensor<uint8_t>({0, 5, 255});
  CHECK(matches_exactly(abs(u), {3}, {0, 5, 255}));
  CHECK(matches_exactly(neg(u), {3}, {0, 251, 1}));  // wraps like uint8 in PyTorch
  CHECK(matches_exactly(relu(tensor<int32_t>({-4, 4})), {2}, {0, 4}));
  CHECK(exp(tensor<bool>({true, false})).dtype() == kFloat32);
}

TEST_CASE("unary ops on special values: inf, nan, zero, large magnitudes", "[tensor][unary]") {
  Tensor x = tensor(std::vector<double>{-INFINITY, -1000.0, -0.0, 0.0, 1000.0, INFINITY, NAN});
  CHECK(matches(exp(x), {7}, {0, 0, 1, 1, INFINITY, INFINITY, NAN}));
  CHECK(matches(sigmoid(x), {7}, {0, 0, 0.5, 0.5, 1, 1, NAN}));
  CHECK(matches(tanh(x), {7}, {-1, -1, -0.0, 0, 1, 1, NAN}));
  CHECK(matches(relu(x), {7}, {0, 0, 0, 0, 1000, INFINITY, NAN}));
  CHECK(matches(abs(x), {7}, {INFINITY, 1000, 0, 0, 1000, INFINITY, NAN}));
  CHECK(matches(gelu(x.narrow(0, 1, 5)), {5}, {-0.0, -0.0, 0, 1000, INFINITY}));
  Tensor pos = tensor(std::vector<double>{0.0, 1.0, INFINITY});
  CHECK(matches(log(pos), {3}, {-INFINITY, 0, INFINITY}));
  CHECK(matches(rsqrt(pos), {3}, {INFINITY, 1, 0}));
  CHECK(matches(log(tensor(std::vector<double>{-1.0})), {1}, {NAN}));
  CHECK(matches(log1p(tensor(std::vector<double>{-1.0, 1e-20})), {2}, {-INFINITY, 1e-20}, 1e-15, 0));
}

TEST_CASE("erfinv inverts erf; round halves to even; the step functions on special values", "[tensor][unary]") {
  Generator gen(202);
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    Tensor y = random_in({200}, -0.999, 0.999, dt, gen);
    const double tol = dt == kFloat64 ? 1e-14 : 2e-6;
    CHECK(sub(erf(erfinv(y)), y).abs().max().to(kFloat64).item<double>() < tol);
    // mpmath.erfinv (30 digits) of 0.5, -0.9, 1e-3 and 0.999999 as this dtype holds them.
    Tensor known = tensor(std::vector<double>{0.5, -0.9, 1e-3, 0.999999}).to(dt);
    const std::vector<double> expected =
        dt == kFloat64 ? std::vector<double>{0.4769362762044699, -1.1630871536766743, 0.0008862271574665521, 3.458910737275499}
                       : std::vector<double>{0.4769362762044699, -1.1630870719457722, 0.0008862271995601054, 3.45707472603595};
    // Near +-1 erfinv amplifies the last bit of erf by 1/erf'(x) (~1e5 at 0.999999): 1e-11, not 1e-15.
    CHECK(matches(erfinv(known), {4}, expected, dt == kFloat64 ? 1e-11 : 3e-6, 0));
  }
  CHECK(matches(erfinv(tensor(std::vector<double>{1.0, -1.0, 1.5, NAN, 0.0})), {5}, {INFINITY, -INFINITY, NAN, NAN, 0.0}));
  CHECK(matches_exactly(round(tensor(std::vector<double>{0.5, 1.5, 2.5, -0.5, -2.5, 2.4999})), {6}, {0, 2, 2, -0.0, -2, 2}));
  Tensor x = tensor(std::vector<double>{-INFINITY, -1.5, -0.0, 0.0, 1.5, INFINITY, NAN});
  CHECK(matches(floor(x), {7}, {-INFINITY, -2, -0.0, 0, 1, INFINITY, NAN}));
  CHECK(matches(ceil(x), {7}, {-INFINITY, -1, -0.0, 0, 2, INFINITY, NAN}));
  CHECK(matches(trunc(x), {7}, {-INFINITY, -1, -0.0, 0, 1, INFINITY, NAN}));
  CHECK(matches(sign(x.narrow(0, 0, 6)), {6}, {-1, -1, 0, 0, 1, 1}));
  CHECK(matches(expm1(tensor(std::vector<double>{1e-20, -INFINITY})), {2}, {1e-20, -1}, 1e-15, 0));
  CHECK(matches(log2(tensor(std::vector<double>{8.0, 0.0})), {2}, {3, -INFINITY}));
  CHECK(matches(log10(tensor(std::vector<double>{1000.0})), {1}, {3}, 1e-15, 0));
  // The step functions' gradient is zero, as PyTorch's.
  Tensor v = tensor(std::vector<double>{-1.7, 0.2, 2.5}).requires_grad_();
  sum(add(add(floor(v), ceil(v)), add(round(v), add(trunc(v), sign(v))))).backward();
  CHECK(matches_exactly(v.grad(), {3}, {0, 0, 0}));
}

TEST_CASE("pow with a scalar exponent, a tensor exponent and a scalar base", "[tensor][unary][pow]") {
  Generator gen(201);
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    const double rtol = rtol_for(dt) * 4, atol = atol_for(dt);
    Tensor x = random_layout({3, 5}, dt, Layout::Transposed, gen);
    Tensor pos = random_in({3, 5}, 0.1, 3.0, dt, gen);
    for (double e : {2.0, 3.0, 1.0, 0.0, -1.0, -2.0}) {
      INFO("exponent " << e);
      std::vector<double> r;
      for (double v : values(x)) r.push_back(std::pow(v, e));
      Tensor out = pow(x, e);
      CHECK(out.dtype() == dt);
      CHECK(matches(out, {3, 5}, r, rtol, atol));
    }
    for (double e : {0.5, -1.5, 2.7}) {
      INFO("exponent " << e);
      std::vector<double> r;
      for (double v : values(pos)) r.push_back(std::pow(v, e));
      CHECK(matches(pos.pow(e), {3, 5}, r, rtol, atol));
    }
    Tensor ex = random_in({5}, -2.0, 2.0, dt, gen);
    CHECK(matches(pow(pos, ex), {3, 5}, reference_binary(pos, ex, [](double a, double b) { return std::pow(a, b); }),
                  rtol, atol));
    Tensor base2 = pow(2.0, ex);
    CHECK(base2.dtype() == dt);
    CHECK(matches(base2, {5}, reference_unary(ex, [](double b) { return std::pow(2.0, b); }), rtol, atol));
  }
  // Negative bases with fractional exponents are nan, as std::pow.
  CHECK(matches(pow(tensor(std::vector<double>{-8.0}), 1.0 / 3), {1}, {NAN}));
}

TEST_CASE("integer pow is exact integer arithmetic; a float exponent gives float32", "[tensor][unary][pow]") {
  Tensor i = tensor<int64_t>({-3, -1, 0, 2, 5});
  CHECK(pow(i, 2).dtype() == kInt64);
  CHECK(matches_exactly(pow(i, 2), {5}, {9, 1, 0, 4, 25}));
  CHECK(matches_exactly(pow(i, 3), {5}, {-27, -1, 0, 8, 125}));
  CHECK(matches_exactly(pow(i, 0), {5}, {1, 1, 1, 1, 1}));
  Tensor i32 = tensor<int32_t>({2, 3});
  CHECK(pow(i32, 2).dtype() == kInt32);
  CHECK(pow(i32, 0.5).dtype() == kFloat32);
  CHECK(matches(pow(i32, 0.5), {2}, {std::sqrt(2.0), std::sqrt(3.0)}));
  // 3^39 needs all 62 bits: exact, not rounded through a double.
  Tensor three = tensor<int64_t>({3});
  CHECK(pow(three, 39).data_ptr<int64_t>()[0] == 4052555153018976267LL);
  CHECK(pow(three, tensor<int64_t>({39})).data_ptr<int64_t>()[0] == 4052555153018976267LL);
  // Tensor exponents may be negative: integer results as PyTorch (1 -> 1, -1 -> +-1, others -> 0).
  Tensor bases = tensor<int64_t>({2, -2, 3, 1, -1, -1});
  Tensor exps = tensor<int64_t>({-1, -1, -2, -5, -3, -2});
  CHECK(matches_exactly(pow(bases, exps), {6}, {0, 0, 0, 1, -1, 1}));
  CHECK(matches_exactly(pow(tensor<int64_t>({2, 3, 4}), tensor<int64_t>({10, 0, 3})), {3}, {1024, 1, 64}));
}

TEST_CASE("clamp limits from below, above or both, keeps NaN, and promotes like PyTorch", "[tensor][unary][clamp]") {
  Generator gen(202);
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    Tensor x = random_layout({4, 5}, dt, Layout::StepSliced, gen);
    CHECK(matches(clamp(x, -0.5, 0.75), {4, 5},
                  reference_unary(x, [](double v) { return std::min(std::max(v, -0.5), 0.75); }), 0, 0));
    CHECK(matches(clamp(x, 0.1, std::nullopt), {4, 5}, reference_unary(x, [](double v) { return std::max(v, 0.1); }),
                  1e-7, 0));
    CHECK(matches(x.clamp(std::nullopt, -0.2), {4, 5}, reference_unary(x, [](double v) { return std::min(v, -0.2); }),
                  1e-7, 0));
    // min > max: every element becomes max, as in PyTorch.
    CHECK(matches(clamp(x, 1.0, -1.0), {4, 5}, std::vector<double>(20, -1.0)));
  }
  Tensor n = tensor(std::vector<double>{NAN, -5.0, 5.0});
  CHECK(matches(clamp(n, -1.0, 1.0), {3}, {NAN, -1.0, 1.0}));
  Tensor i = tensor<int32_t>({-7, 0, 3, 9});
  CHECK(clamp(i, 0, 5).dtype() == kInt32);
  CHECK(matches_exactly(clamp(i, 0, 5), {4}, {0, 0, 3, 5}));
  Tensor f = clamp(i, -0.5, 2.5);  // a float bound lifts an int tensor to float32
  CHECK(f.dtype() == kFloat32);
  CHECK(matches_exactly(f, {4}, {-0.5, 0, 2.5, 2.5}));
}

TEST_CASE("float16 and bfloat16 ops compute in float32 and round once to the storage type", "[tensor][unary][half]") {
  Generator gen(203);
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    Tensor a = random_in({40}, -4.0, 4.0, dt, gen);
    Tensor b = random_in({40}, 0.25, 4.0, dt, gen);
    auto round_to = [dt](float v) {
      return dt == kFloat16 ? static_cast<double>(static_cast<float>(Half(v)))
                            : static_cast<double>(static_cast<float>(BFloat16(v)));
    };
    auto expect = [&](const std::function<float(float, float)>& f) {
      std::vector<double> r;
      const std::vector<double> va = values(a), vb = values(b);
      for (size_t k = 0; k < va.size(); ++k) r.push_back(round_to(f(static_cast<float>(va[k]), static_cast<float>(vb[k]))));
      return r;
    };
    // Basic arithmetic is exactly float32 arithmetic rounded to the storage type.
    CHECK(add(a, b).dtype() == dt);
    CHECK(matches_exactly(add(a, b), {40}, expect([](float x, float y) { return x + y; })));
    CHECK(matches_exactly(sub(a, b), {40}, expect([](float x, float y) { return x - y; })));
    CHECK(matches_exactly(mul(a, b), {40}, expect([](float x, float y) { return x * y; })));
    CHECK(matches_exactly(div(a, b), {40}, expect([](float x, float y) { return x / y; })));
    CHECK(matches_exactly(maximum(a, b), {40}, expect([](float x, float y) { return std::max(x, y); })));
    CHECK(matches_exactly(add(a, 2.0), {40}, expect([](float x, float) { return x + 2.0f; })));
    // Transcendental ops: float32 math rounded to the storage type (within one storage ulp).
    Tensor e = exp(a);
    CHECK(e.dtype() == dt);
    CHECK(matches(e, {40}, expect([](float x, float) { return std::exp(x); }), rtol_for(dt), 0));
    CHECK(matches(sqrt(b), {40}, expect([](float, float y) { return std::sqrt(y); }), rtol_for(dt), 0));
    CHECK(matches(sigmoid(a), {40}, expect([](float x, float) { return 1 / (1 + std::exp(-x)); }), rtol_for(dt), 0));
    CHECK(matches(pow(b, 2.0), {40}, expect([](float, float y) { return y * y; }), 0, 0));
  }
  // Values beyond float16's range overflow to inf after float32 math; bfloat16 holds them.
  Tensor big = full({2}, 300.0, {.dtype = kFloat16});
  CHECK(matches(mul(big, big), {2}, {INFINITY, INFINITY}));
  Tensor bbig = full({2}, 300.0, {.dtype = kBFloat16});
  CHECK(matches(mul(bbig, bbig), {2}, {90112.0, 90112.0}, 0, 0));  // 90000 rounded to 8 bits of mantissa
}

}  // namespace chorus
