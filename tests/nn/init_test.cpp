// nn::init against torch.nn.init's formulas: fan in/out of Linear- and conv-shaped weights, gains,
// the bounds and standard deviations of kaiming/xavier draws on big tensors, trunc_normal_ bounds
// and mean, the constant fills, and seeded reproducibility.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "nn/nn.h"
#include "tensor/ops.h"
#include "tests/nn/reference.h"

namespace chorus {
namespace {

namespace init = nn::init;
using nn_test::check_close;
using nn_test::doubles;
using nn_test::error_message;

struct Stats {
  double min, max, mean, std;
};
Stats stats_of(const Tensor& t) {
  std::vector<double> v = doubles(t);
  Stats s{INFINITY, -INFINITY, 0, 0};
  for (double e : v) s.min = std::min(s.min, e), s.max = std::max(s.max, e), s.mean += e;
  s.mean /= v.size();
  for (double e : v) s.std += (e - s.mean) * (e - s.mean);
  s.std = std::sqrt(s.std / (v.size() - 1));
  return s;
}

TEST_CASE("fan_in and fan_out of Linear and conv-shaped weights", "[nn][init]") {
  CHECK(init::fan_in_and_fan_out(empty({48, 64})) == std::pair<int64_t, int64_t>{64, 48});
  CHECK(init::fan_in_and_fan_out(empty({16, 8, 3, 3})) == std::pair<int64_t, int64_t>{72, 144});
  CHECK(init::fan_in_and_fan_out(empty({6, 4, 5})) == std::pair<int64_t, int64_t>{20, 30});  // conv1d
  CHECK(init::fan_in_and_fan_out(nn::Linear(7, 3).weight) == std::pair<int64_t, int64_t>{7, 3});
  CHECK_THAT(error_message([] { init::fan_in_and_fan_out(empty({5})); }),
             Catch::Contains("fewer than 2 dimensions") && Catch::Contains("[5]"));
}

TEST_CASE("calculate_gain returns PyTorch's recommended gains", "[nn][init]") {
  CHECK(init::calculate_gain("linear") == 1.0);
  CHECK(init::calculate_gain("conv2d") == 1.0);
  CHECK(init::calculate_gain("sigmoid") == 1.0);
  CHECK(init::calculate_gain("tanh") == Approx(5.0 / 3.0));
  CHECK(init::calculate_gain("relu") == Approx(std::sqrt(2.0)));
  CHECK(init::calculate_gain("leaky_relu") == Approx(std::sqrt(2.0 / (1.0 + 0.01 * 0.01))));
  CHECK(init::calculate_gain("leaky_relu", 0.2) == Approx(std::sqrt(2.0 / 1.04)));
  CHECK(init::calculate_gain("leaky_relu", std::sqrt(5.0)) == Approx(std::sqrt(1.0 / 3.0)));
  CHECK(init::calculate_gain("selu") == Approx(0.75));
  CHECK_THAT(error_message([] { init::calculate_gain("swish"); }), Catch::Contains("unsupported nonlinearity 'swish'"));
}

TEST_CASE("kaiming_uniform_ draws from U(+-gain * sqrt(3 / fan)) for fan_in and fan_out", "[nn][init]") {
  Generator gen(301);
  Tensor w = empty({256, 128, 3});  // fan_in 384, fan_out 768
  for (const char* mode : {"fan_in", "fan_out"}) {
    for (double a : {0.0, std::sqrt(5.0)}) {
      INFO("mode " << mode << " a " << a);
      init::kaiming_uniform_(w, a, mode, "leaky_relu", &gen);
      const double fan = std::string(mode) == "fan_in" ? 384 : 768;
      const double bound = std::sqrt(2.0 / (1 + a * a)) * std::sqrt(3.0 / fan);
      Stats s = stats_of(w);
      CHECK(s.min >= -bound);
      CHECK(s.max <= bound);
      CHECK(s.max > 0.999 * bound);
      CHECK(s.min < -0.999 * bound);
      CHECK(std::abs(s.mean) < 0.01 * bound);
      CHECK(s.std == Approx(bound / std::sqrt(3.0)).epsilon(0.01));
    }
  }
  init::kaiming_uniform_(w, 0.0, "fan_in", "relu", &gen);
  CHECK(stats_of(w).max <= std::sqrt(2.0) * std::sqrt(3.0 / 384));
  CHECK_THAT(error_message([&] { init::kaiming_uniform_(w, 0.0, "fan_avg"); }), Catch::Contains("'fan_in' or 'fan_out'"));
}

TEST_CASE("kaiming_normal_ has std gain / sqrt(fan) and mean 0", "[nn][init]") {
  Generator gen(302);
  Tensor w = empty({300, 400});
  init::kaiming_normal_(w, 0.0, "fan_out", "relu", &gen);
  Stats s = stats_of(w);
  const double std = std::sqrt(2.0) / std::sqrt(300.0);
  CHECK(s.std == Approx(std).epsilon(0.01));
  CHECK(std::abs(s.mean) < 0.01 * std);
  init::kaiming_normal_(w, 0.0, "fan_in", "relu", &gen);
  CHECK(stats_of(w).std == Approx(std::sqrt(2.0) / 20.0).epsilon(0.01));
}

TEST_CASE("xavier_uniform_ and xavier_normal_ use gain * sqrt(6 or 2 / (fan_in + fan_out))", "[nn][init]") {
  Generator gen(303);
  Tensor w = empty({64, 32, 3, 3});  // fan_in 288, fan_out 576
  const double gain = 5.0 / 3.0;
  init::xavier_uniform_(w, gain, &gen);
  const double bound = gain * std::sqrt(6.0 / (288 + 576));
  Stats s = stats_of(w);
  CHECK(s.min >= -bound);
  CHECK(s.max <= bound);
  CHECK(s.max - s.min > 1.998 * bound);
  // 18432 draws: the sample std is within ~0.5% (normal) / ~0.3% (uniform) of the true one, and
  // the sample mean within ~0.7% of a std; the tolerances are about 4 of those.
  CHECK(s.std == Approx(bound / std::sqrt(3.0)).epsilon(0.015));
  init::xavier_normal_(w, gain, &gen);
  s = stats_of(w);
  CHECK(s.std == Approx(gain * std::sqrt(2.0 / (288 + 576))).epsilon(0.02));
  CHECK(std::abs(s.mean) < 0.03 * s.std);
}

TEST_CASE("trunc_normal_ stays inside [a, b] and has the truncated normal's mean", "[nn][init]") {
  Generator gen(304);
  auto phi = [](double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); };
  auto cdf = [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))); };
  struct Case {
    double mean, std, a, b;
  };
  for (const Case& c : std::vector<Case>{{0, 1, -2, 2}, {0.5, 2.0, -1.0, 1.5}, {0, 1, 2.5, 4.0}, {0, 0.02, -0.04, 0.04}}) {
    INFO("mean " << c.mean << " std " << c.std << " [" << c.a << ", " << c.b << "]");
    Tensor t = empty({200, 500});
    init::trunc_normal_(t, c.mean, c.std, c.a, c.b, &gen);
    Stats s = stats_of(t);
    CHECK(s.min >= c.a);
    CHECK(s.max <= c.b);
    const double al = (c.a - c.mean) / c.std, be = (c.b - c.mean) / c.std, z = cdf(be) - cdf(al);
    const double mean = c.mean + c.std * (phi(al) - phi(be)) / z;
    const double var = c.std * c.std * (1 + (al * phi(al) - be * phi(be)) / z - std::pow((phi(al) - phi(be)) / z, 2));
    CHECK(s.mean == Approx(mean).margin(0.015 * std::sqrt(var)));
    CHECK(s.std == Approx(std::sqrt(var)).epsilon(0.01));
  }
  Tensor t = empty({3});
  CHECK_THAT(error_message([&] { init::trunc_normal_(t, 0, 1, 1.0, -1.0); }), Catch::Contains("expected a < b"));
}

TEST_CASE("zeros_, ones_ and constant_ fill in place without recording history", "[nn][init]") {
  nn::Linear fc(3, 4);
  Tensor w = fc.weight;
  init::constant_(fc.weight, 0.25);
  CHECK(fc.weight.is_same(w));
  CHECK(fc.weight.is_leaf());
  CHECK(fc.weight.requires_grad());
  check_close(fc.weight, std::vector<double>(12, 0.25), 0);
  init::ones_(fc.bias);
  check_close(fc.bias, {1, 1, 1, 1}, 0);
  init::zeros_(fc.bias);
  check_close(fc.bias, {0, 0, 0, 0}, 0);
  Tensor d = empty({2, 2}, {.dtype = kFloat64});
  init::normal_(d, 3.0, 0.0);
  check_close(d, {3, 3, 3, 3}, 0);
  Tensor i = zeros({2}, {.dtype = kInt64});
  CHECK_THAT(error_message([&] { init::ones_(i); }), Catch::Contains("floating-point tensor, got int64"));
  CHECK_THAT(error_message([&] { init::normal_(d, 0.0, -1.0); }), Catch::Contains("std must be non-negative"));
}

TEST_CASE("init is reproducible: the same seed gives the same values, another seed others", "[nn][init]") {
  auto draw = [](auto&& fn) {
    Tensor t = empty({20, 30});
    fn(t);
    return t;
  };
  auto all = [&](Generator* g) {
    return std::vector<Tensor>{
        draw([&](Tensor& t) { init::kaiming_uniform_(t, 0.0, "fan_in", "relu", g); }),
        draw([&](Tensor& t) { init::kaiming_normal_(t, 0.0, "fan_in", "relu", g); }),
        draw([&](Tensor& t) { init::xavier_uniform_(t, 1.0, g); }),
        draw([&](Tensor& t) { init::xavier_normal_(t, 1.0, g); }),
        draw([&](Tensor& t) { init::trunc_normal_(t, 0.0, 1.0, -2.0, 2.0, g); }),
        draw([&](Tensor& t) { init::uniform_(t, -1.0, 1.0, g); }),
    };
  };
  Generator g1(42), g2(42), g3(43);
  auto a = all(&g1), b = all(&g2), c = all(&g3);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("initializer " << i);
    CHECK(equal(a[i], b[i]));
    CHECK_FALSE(equal(a[i], c[i]));
  }
  // Through the default generator: manual_seed reproduces a whole model.
  manual_seed(11);
  nn::Linear m1(8, 8);
  manual_seed(11);
  nn::Linear m2(8, 8);
  CHECK(equal(m1.weight.detach(), m2.weight.detach()));
  CHECK(equal(m1.bias.detach(), m2.bias.detach()));
  // float32 and float64 tensors drawn from the same seed agree to float32 precision.
  Generator h1(7), h2(7);
  Tensor f32 = empty({100}), f64 = empty({100}, {.dtype = kFloat64});
  init::normal_(f32, 0, 1, &h1);
  init::normal_(f64, 0, 1, &h2);
  check_close(f32, doubles(f64), 1e-7);
}

TEST_CASE("large tensors are filled a chunk at a time with the values of a whole-tensor draw", "[nn][init]") {
  // normal_ and uniform_ draw float64 in chunks of 65,536 (so the float64 temporary stays small);
  // the result must equal the whole-tensor formula bit for bit, for sizes that do not divide into
  // chunks (an odd count: uniform_ takes two values per Philox block), and leave the generator
  // where the whole draw would.
  for (const Shape& shape : {Shape{333, 777}, Shape{512, 256, 3}, Shape{65537}}) {
    INFO("shape " << shape_str(shape));
    Generator g1(7), g2(7);
    Tensor t = empty(shape);
    init::normal_(t, 0.5, 2.0, &g1);
    Tensor want = randn(shape, {.dtype = kFloat64}, &g2).mul(2.0).add(0.5).to(kFloat32);
    CHECK(equal(t, want));
    init::uniform_(t, -0.25, 0.75, &g1);
    want = rand(shape, {.dtype = kFloat64}, &g2).mul(1.0).add(-0.25).to(kFloat32);
    CHECK(equal(t, want));
    CHECK(g1.offset() == g2.offset());
    // Float64 parameters too.
    Tensor d = empty(shape, {.dtype = kFloat64});
    init::normal_(d, -1.0, 0.1, &g1);
    CHECK(equal(d, randn(shape, {.dtype = kFloat64}, &g2).mul(0.1).add(-1.0)));
  }
}

}  // namespace
}  // namespace chorus
