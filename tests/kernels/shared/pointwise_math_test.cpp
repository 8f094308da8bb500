// kernels/shared/pointwise_math.h: the 16-bit float conversions against tensor/dtype's Half and
// BFloat16 bit for bit, each functor's semantics (NaN, signed zero, integer pow, comparisons) and
// math (activations and their fused backward helpers against double formulas and finite
// differences), and the CPU kernels computing exactly these functors, bit for bit, on random inputs.
// Compiled with kernels/cpu's flags (BUILD), so a functor inlined here rounds as inside a CPU kernel.
#include "kernels/shared/pointwise_math.h"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "tensor/ops.h"

namespace {

using namespace chorus;
namespace sm = chorus::kernels::shared;
namespace K = chorus::kernels::cpu;

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// A kernel's result against its functor's: the same bits. Under clang (the sanitizer builds), a NaN
// matches any NaN: which NaN an arithmetic operation returns (sign, payload) IEEE 754 leaves open,
// and in the clang-14 ASan build TanhBackward of (-5.9, NaN) gave NaN in the kernel (library, -O1)
// and -NaN in the functor (test file, -O0). g++ gives the same NaN in both, and is held to it.
// Whether the result is a NaN has to agree everywhere. The conversions' tests keep same_bits.
template <typename T>
bool same_value(T a, T b) {
#if defined(__clang__)
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) && std::isnan(b)) return true;
  }
#endif
  return same_bits(a, b);
}

// Every float with each upper half (sign, exponent, 7 mantissa bits) combined with the lower
// halves where rounding to float16 (round bit 12, sticky bits, odd bit 13) and to bfloat16 (round
// bit 15) changes, plus random lower halves.
std::vector<uint32_t> float_patterns() {
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2fff, 0x3000, 0x3001,
                                0x5000, 0x7fff, 0x8000, 0x8001, 0x9000, 0xbfff, 0xc000, 0xefff, 0xf000, 0xffff};
  std::mt19937 rng(11);
  for (int i = 0; i < 12; ++i) lows.push_back(rng() & 0xffffu);
  std::vector<uint32_t> out;
  out.reserve(65536 * lows.size());
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : lows) out.push_back(hi << 16 | lo);
  return out;
}

TEST_CASE("float16 <-> float32 conversions give tensor/dtype's Half bits", "[shared][cast]") {
  for (uint32_t bits = 0; bits < 65536; ++bits) {  // every half, NaN payloads and subnormals included
    Half h;
    h.bits = static_cast<uint16_t>(bits);
    const float expected = static_cast<float>(h);
    const float got = sm::half_bits_to_float(static_cast<uint16_t>(bits));
    INFO("half bits " << bits);
    REQUIRE(same_bits(got, expected));
  }
  size_t subnormal = 0, overflow = 0;
  for (uint32_t u : float_patterns()) {
    float f;
    std::memcpy(&f, &u, 4);
    const uint16_t got = sm::float_to_half_bits(f);
    const uint16_t expected = Half(f).bits;
    if (got != expected) FAIL("float bits " << u << ": got half " << got << ", Half gives " << expected);
    subnormal += (got & 0x7c00u) == 0 && (got & 0x3ffu) != 0;
    overflow += (got & 0x7fffu) == 0x7c00u && (u & 0x7fffffffu) < 0x7f800000u;
  }
  // The sweep reached the special paths, not only normal numbers.
  CHECK(subnormal > 1000);
  CHECK(overflow > 1000);
}

TEST_CASE("bfloat16 <-> float32 conversions give tensor/dtype's BFloat16 bits", "[shared][cast]") {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    BFloat16 b;
    b.bits = static_cast<uint16_t>(bits);
    REQUIRE(same_bits(sm::bfloat16_bits_to_float(static_cast<uint16_t>(bits)), static_cast<float>(b)));
  }
  for (uint32_t u : float_patterns()) {
    float f;
    std::memcpy(&f, &u, 4);
    if (sm::float_to_bfloat16_bits(f) != BFloat16(f).bits) FAIL("float bits " << u);
  }
  // Ties round to even, a NaN stays a NaN (not an infinity) even when only low bits carry it.
  CHECK(sm::float_to_bfloat16_bits(1.0f + 0x1p-8f) == 0x3f80);           // tie, even below
  CHECK(sm::float_to_bfloat16_bits(1.0f + 3 * 0x1p-8f) == 0x3f82);       // tie, even above
  CHECK(sm::float_to_bfloat16_bits(std::bit_cast<float>(0x7f800001u)) == 0x7fc0);
}

TEST_CASE("Cast converts every dtype pair as static_cast, 16-bit floats through float32", "[shared][cast]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> dist(-300.0, 300.0);
  for (int i = 0; i < 2000; ++i) {
    const double v = i % 7 == 0 ? std::round(dist(rng)) : dist(rng);
    const float vf = static_cast<float>(v);
    CHECK(sm::Cast<Half>{}(v).bits == Half(vf).bits);  // double -> float -> half
    CHECK(sm::Cast<BFloat16>{}(v).bits == BFloat16(vf).bits);
    CHECK(sm::Cast<int32_t>{}(v) == static_cast<int32_t>(v));
    CHECK(sm::Cast<uint8_t>{}(static_cast<int64_t>(v)) == static_cast<uint8_t>(static_cast<int64_t>(v)));
    CHECK(sm::Cast<bool>{}(v) == (v != 0));
    const Half h(vf);
    CHECK(same_bits(sm::Cast<double>{}(h), static_cast<double>(static_cast<float>(h))));
    CHECK(sm::Cast<int64_t>{}(h) == static_cast<int64_t>(static_cast<float>(h)));
    CHECK(sm::Cast<BFloat16>{}(h).bits == BFloat16(static_cast<float>(h)).bits);
    CHECK(sm::Cast<Half>{}(h).bits == h.bits);
  }
  CHECK(sm::Cast<bool>{}(Half(0.0f)) == false);
  CHECK(sm::Cast<bool>{}(Half(-0.0f)) == false);
  CHECK(sm::Cast<bool>{}(BFloat16(0.001f)) == true);
  CHECK(sm::Cast<Half>{}(true).bits == Half(1.0f).bits);
}

TEST_CASE("float functors call the float C functions, double ones the double functions", "[shared][math]") {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-20.0f, 20.0f);
  for (int i = 0; i < 5000; ++i) {
    const float x = dist(rng), ax = std::abs(x);
    CHECK(same_bits(sm::Exp{}(x), std::exp(x)));
    CHECK(same_bits(sm::Log{}(ax), std::log(ax)));
    CHECK(same_bits(sm::Log1p{}(ax), std::log1p(ax)));
    CHECK(same_bits(sm::Sqrt{}(ax), std::sqrt(ax)));
    CHECK(same_bits(sm::Tanh{}(x), std::tanh(x)));
    CHECK(same_bits(sm::Sin{}(x), std::sin(x)));
    CHECK(same_bits(sm::Cos{}(x), std::cos(x)));
    CHECK(same_bits(sm::Pow{}(ax, x / 4), std::pow(ax, x / 4)));
    const double d = static_cast<double>(x) * 1.37;
    CHECK(same_bits(sm::Exp{}(d), std::exp(d)));
    CHECK(same_bits(sm::Tanh{}(d), std::tanh(d)));
    CHECK(same_bits(sm::Pow{}(std::abs(d), d / 3), std::pow(std::abs(d), d / 3)));
  }
}

TEST_CASE("activations and their fused backward helpers match their formulas", "[shared][math]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-6.0, 6.0);
  const double pi = 3.14159265358979323846;
  auto gelu_erf = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  auto gelu_tanh = [&](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
  };
  auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  auto slope = [](auto f, double x) { return (f(x + 1e-6) - f(x - 1e-6)) / 2e-6; };
  for (int i = 0; i < 2000; ++i) {
    const double x = dist(rng), g = dist(rng);
    CHECK(sm::GeluErf{}(x) == Approx(gelu_erf(x)).epsilon(1e-12).margin(1e-14));
    CHECK(sm::GeluTanh{}(x) == Approx(gelu_tanh(x)).epsilon(1e-12).margin(1e-14));
    CHECK(sm::Sigmoid{}(x) == Approx(sigmoid(x)).epsilon(1e-14));
    CHECK(sm::GeluErf{}(static_cast<float>(x)) == Approx(gelu_erf(x)).epsilon(2e-6).margin(1e-6));
    // Backward helpers: g times the derivative, from the saved input (gelu) or output (tanh, sigmoid).
    CHECK(sm::GeluErfBackward{}(g, x) == Approx(g * slope(gelu_erf, x)).epsilon(1e-7).margin(1e-7));
    CHECK(sm::GeluTanhBackward{}(g, x) == Approx(g * slope(gelu_tanh, x)).epsilon(1e-7).margin(1e-7));
    CHECK(sm::TanhBackward{}(g, std::tanh(x)) == Approx(g * slope([](double v) { return std::tanh(v); }, x))
                                                    .epsilon(1e-7).margin(1e-7));
    CHECK(sm::SigmoidBackward{}(g, sigmoid(x)) == Approx(g * slope(sigmoid, x)).epsilon(1e-7).margin(1e-7));
    CHECK(sm::ReluBackward{}(g, x) == (x > 0 ? g : 0.0));
    CHECK(sm::Rsqrt{}(std::abs(x)) == Approx(1 / std::sqrt(std::abs(x))).epsilon(1e-15));
  }
}

TEST_CASE("NaN, signed zero and infinity behave as in PyTorch", "[shared][math]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  CHECK(std::isnan(sm::Relu{}(nan)));  // relu propagates NaN
  CHECK(sm::Relu{}(-inf) == 0.0f);
  CHECK(sm::Relu{}(-2.5f) == 0.0f);
  CHECK(sm::Relu{}(2.5f) == 2.5f);
  CHECK(std::isnan(sm::Max{}(nan, 1.0f)));  // NaN wins on either side
  CHECK(std::isnan(sm::Max{}(1.0f, nan)));
  CHECK(std::isnan(sm::Min{}(nan, 1.0f)));
  CHECK(std::isnan(sm::Min{}(1.0f, nan)));
  CHECK(sm::Max{}(-inf, 3.0f) == 3.0f);
  CHECK(sm::Min{}(int64_t{-4}, int64_t{9}) == -4);
  CHECK(std::signbit(sm::Abs{}(-0.0f)));  // only values below zero are negated
  CHECK(sm::Abs{}(-3.5) == 3.5);
  CHECK(sm::Abs{}(int32_t{-7}) == 7);
  CHECK(sm::Abs{}(uint8_t{200}) == 200);
  CHECK(sm::Sign{}(-2.0f) == -1.0f);
  CHECK(sm::Sign{}(0.0f) == 0.0f);
  CHECK(sm::Sign{}(int64_t{42}) == 1);
  CHECK(std::isnan(sm::Clamp<float>{-1.0f, 1.0f, true, true}(nan)));
  CHECK(sm::Clamp<float>{-1.0f, 1.0f, true, true}(5.0f) == 1.0f);
  CHECK(sm::Clamp<float>{-1.0f, 1.0f, true, false}(5.0f) == 5.0f);
  CHECK(sm::Clamp<int32_t>{-1, 1, true, true}(-9) == -1);
  CHECK(sm::ReluBackward{}(2.0f, nan) == 0.0f);
  CHECK(sm::Sigmoid{}(-inf) == 0.0f);
  CHECK(sm::Sigmoid{}(inf) == 1.0f);
  CHECK(sm::LogicalNot{}(0.0f) == true);
  CHECK(sm::LogicalNot{}(nan) == false);  // NaN is nonzero
  CHECK(sm::Neg{}(uint8_t{3}) == 253);
  CHECK(sm::Where{}(true, 1.5f, 2.5f) == 1.5f);
  CHECK(sm::Where{}(false, int64_t{1}, int64_t{2}) == 2);
}

TEST_CASE("integer pow is exact, wraps like PyTorch and handles negative exponents", "[shared][math]") {
  std::mt19937 rng(17);
  auto by_multiplying = [](auto base, auto exp) {
    using T = decltype(base);
    using U = std::make_unsigned_t<T>;
    U r = 1;
    for (T e = 0; e < exp; ++e) r = static_cast<U>(r * static_cast<U>(base));
    return static_cast<T>(r);
  };
  for (int i = 0; i < 3000; ++i) {
    const auto b64 = static_cast<int64_t>(rng() % 2001) - 1000;
    const auto e64 = static_cast<int64_t>(rng() % 70);
    CHECK(sm::Pow{}(b64, e64) == by_multiplying(b64, e64));
    CHECK(sm::PowScalar<int64_t>{e64}(b64) == by_multiplying(b64, e64));
    const auto b32 = static_cast<int32_t>(b64), e32 = static_cast<int32_t>(e64);
    CHECK(sm::Pow{}(b32, e32) == by_multiplying(b32, e32));
    const auto b8 = static_cast<uint8_t>(rng()), e8 = static_cast<uint8_t>(rng() % 20);
    CHECK(sm::Pow{}(b8, e8) == by_multiplying(b8, e8));
  }
  CHECK(sm::Pow{}(int64_t{1}, int64_t{-5}) == 1);
  CHECK(sm::Pow{}(int64_t{-1}, int64_t{-5}) == -1);
  CHECK(sm::Pow{}(int64_t{-1}, int64_t{-4}) == 1);
  CHECK(sm::Pow{}(int64_t{7}, int64_t{-1}) == 0);
  CHECK(sm::Pow{}(int32_t{3}, int32_t{20}) == 3486784401ll - 4294967296ll);  // wrapped to int32
  CHECK(sm::Pow{}(true, false) == true);
  CHECK(sm::Pow{}(false, true) == false);
}

TEST_CASE("comparisons and logical ops agree with C++ operators, NaN included", "[shared][math]") {
  std::mt19937 rng(23);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 3000; ++i) {
    float x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    float y = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    if (i % 11 == 0) x = nan;
    CHECK(sm::Eq{}(x, y) == (x == y));
    CHECK(sm::Ne{}(x, y) == (x != y));
    CHECK(sm::Lt{}(x, y) == (x < y));
    CHECK(sm::Le{}(x, y) == (x <= y));
    CHECK(sm::Gt{}(x, y) == (x > y));
    CHECK(sm::Ge{}(x, y) == (x >= y));
    CHECK(sm::LogicalAnd{}(x, y) == (x != 0 && y != 0));
    CHECK(sm::LogicalOr{}(x, y) == (x != 0 || y != 0));
    CHECK(sm::LogicalXor{}(x, y) == ((x != 0) != (y != 0)));
  }
}

// ------------------------------------------------------------------ the CPU kernels use them
// Random values with NaN, infinities, signed zeros, large and tiny magnitudes sprinkled in.
Tensor special_values(const Shape& shape, DType dtype, uint64_t seed) {
  Generator g(seed);
  Tensor t = randn(shape, TensorOptions{.dtype = kFloat64}, &g).mul(4.0);
  double* p = t.data_ptr<double>();
  const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e30, -1e30, 1e-30, 90.0, -90.0, 0.5, 1.0};
  for (int64_t i = 0; i < t.numel(); i += 13) p[i] = specials[(i / 13) % 12];
  return t.to(dtype);
}

// The kernel's result and the functor applied elementwise, compared bit for bit.
template <typename T, typename F>
void check_unary(K::UnaryOp op, F f, const Tensor& in) {
  Tensor out = empty(in.sizes(), TensorOptions{.dtype = in.dtype()});
  K::unary(op, out, in);
  Tensor dense = in.contiguous();
  const T* x = dense.data_ptr<T>();
  const T* o = out.data_ptr<T>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const T expected = f(x[i]);
    if (!same_value(o[i], expected)) {
      FAIL(fmt::format("unary op {} element {} of {}: kernel {}, functor {}", static_cast<int>(op), i, x[i], o[i],
                       expected));
    }
  }
}

template <typename Out, typename T, typename F>
void check_binary(K::BinaryOp op, F f, const Tensor& a, const Tensor& b, const Scalar& alpha = 1) {
  Tensor out = empty(a.sizes(), TensorOptions{.dtype = dtype_of<Out>::value});
  K::binary(op, out, a, b, alpha);
  Tensor da = a.contiguous(), db = b.expand(a.sizes()).contiguous();
  const T* x = da.data_ptr<T>();
  const T* y = db.data_ptr<T>();
  const Out* o = out.data_ptr<Out>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const Out expected = f(x[i], y[i]);
    if (!same_value(o[i], expected)) {
      FAIL(fmt::format("binary op {} element {} of ({}, {}): kernel {}, functor {}", static_cast<int>(op), i, x[i],
                       y[i], o[i], expected));
    }
  }
}

TEMPLATE_TEST_CASE("CPU pointwise kernels compute the shared functors bit for bit", "[shared][cpu]", float, double) {
  using T = TestType;
  const DType dt = dtype_of<T>::value;
  // A transposed view and a broadcast row: the kernels' strided and scalar-broadcast paths too.
  const Tensor a = special_values({64, 45}, dt, 1).t();
  const Tensor b = special_values({64}, dt, 2);
  const Tensor c = special_values({45, 64}, dt, 3);
  using U = K::UnaryOp;
  check_unary<T>(U::Neg, sm::Neg{}, a);
  check_unary<T>(U::Abs, sm::Abs{}, a);
  check_unary<T>(U::Exp, sm::Exp{}, a);
  check_unary<T>(U::Log, sm::Log{}, a);
  check_unary<T>(U::Log1p, sm::Log1p{}, a);
  check_unary<T>(U::Sqrt, sm::Sqrt{}, a);
  check_unary<T>(U::Rsqrt, sm::Rsqrt{}, a);
  check_unary<T>(U::Tanh, sm::Tanh{}, a);
  check_unary<T>(U::Sigmoid, sm::Sigmoid{}, a);
  check_unary<T>(U::Relu, sm::Relu{}, a);
  check_unary<T>(U::GeluErf, sm::GeluErf{}, a);
  check_unary<T>(U::GeluTanh, sm::GeluTanh{}, a);
  check_unary<T>(U::Sin, sm::Sin{}, a);
  check_unary<T>(U::Cos, sm::Cos{}, a);
  check_unary<T>(U::Sign, sm::Sign{}, a);
  check_unary<T>(U::Reciprocal, sm::Reciprocal{}, a);
  using B = K::BinaryOp;
  for (const Tensor* y : {&b, &c}) {
    check_binary<T, T>(B::Add, sm::Add{}, a, *y);
    check_binary<T, T>(B::Add, sm::AddAlpha<T>{T(0.37)}, a, *y, 0.37);
    check_binary<T, T>(B::Sub, sm::SubAlpha<T>{T(-2.5)}, a, *y, -2.5);
    check_binary<T, T>(B::Mul, sm::Mul{}, a, *y);
    check_binary<T, T>(B::Div, sm::Div{}, a, *y);
    check_binary<T, T>(B::Max, sm::Max{}, a, *y);
    check_binary<T, T>(B::Min, sm::Min{}, a, *y);
    check_binary<T, T>(B::Pow, sm::Pow{}, a, *y);
    check_binary<bool, T>(B::Lt, sm::Lt{}, a, *y);
    check_binary<bool, T>(B::Ge, sm::Ge{}, a, *y);
    check_binary<bool, T>(B::LogicalXor, sm::LogicalXor{}, a, *y);
    check_binary<T, T>(B::ReluBackward, sm::ReluBackward{}, a, *y);
    check_binary<T, T>(B::TanhBackward, sm::TanhBackward{}, a, *y);
    check_binary<T, T>(B::SigmoidBackward, sm::SigmoidBackward{}, a, *y);
    check_binary<T, T>(B::GeluErfBackward, sm::GeluErfBackward{}, a, *y);
    check_binary<T, T>(B::GeluTanhBackward, sm::GeluTanhBackward{}, a, *y);
  }
  // pow with a scalar exponent and clamp.
  for (double e : {3.0, -1.5, 2.0, 0.5}) {
    Tensor out = empty(a.sizes(), TensorOptions{.dtype = dt});
    K::pow_scalar(out, a, e);
    Tensor d = a.contiguous();
    for (int64_t i = 0; i < a.numel(); ++i) {
      const T x = d.data_ptr<T>()[i];
      const T want = e == 2.0 ? sm::Square{}(x) : e == 0.5 ? sm::Sqrt{}(x) : sm::PowScalar<T>{T(e)}(x);
      if (!same_bits(out.data_ptr<T>()[i], want)) FAIL("pow " << e << " of " << x);
    }
  }
  const Scalar lo(-1.25), hi(3.5);
  Tensor clamped = empty(a.sizes(), TensorOptions{.dtype = dt});
  K::clamp(clamped, a, &lo, &hi);
  Tensor d = a.contiguous();
  for (int64_t i = 0; i < a.numel(); ++i) {
    const T want = sm::Clamp<T>{T(-1.25), T(3.5), true, true}(d.data_ptr<T>()[i]);
    if (!same_bits(clamped.data_ptr<T>()[i], want)) FAIL("clamp of " << d.data_ptr<T>()[i]);
  }
}

TEST_CASE("CPU copy kernel casts with the shared Cast functor", "[shared][cpu]") {
  const Tensor x = special_values({300, 7}, kFloat32, 4).mul(1000.0);
  const Tensor h = x.to(kFloat16), bf = x.to(kBFloat16);
  const float* px = x.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    REQUIRE(h.data_ptr<Half>()[i].bits == sm::float_to_half_bits(px[i]));
    REQUIRE(bf.data_ptr<BFloat16>()[i].bits == sm::float_to_bfloat16_bits(px[i]));
  }
  const Tensor back = h.to(kFloat64), ints = clamp(x, -1e9, 1e9).to(kInt32), bools = x.to(kBool);
  const Tensor xc = clamp(x, -1e9, 1e9);
  for (int64_t i = 0; i < x.numel(); ++i) {
    REQUIRE(same_bits(back.data_ptr<double>()[i], sm::Cast<double>{}(h.data_ptr<Half>()[i])));
    if (!std::isnan(xc.data_ptr<float>()[i])) REQUIRE(ints.data_ptr<int32_t>()[i] == sm::Cast<int32_t>{}(xc.data_ptr<float>()[i]));
    REQUIRE(bools.data_ptr<bool>()[i] == sm::Cast<bool>{}(px[i]));
  }
}

}  // namespace
