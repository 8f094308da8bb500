// Binary arithmetic (add/sub with alpha, mul, div, maximum, minimum) against a double reference
// loop: every dtype, broadcasting ([4,1,3] with [2,3], 0-d with N-d), non-contiguous operands
// (transposed, step-sliced, expanded), PyTorch's type promotion between tensors (0-d tensors only
// lift the category) and with Scalars, and the scalar overloads and operators.
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
using testing::random_layout;
using testing::random_tensor;
using testing::reference_binary;
using testing::reference_unary;
using testing::rtol_for;
using testing::values;

// The value a double reference result takes once stored in `dtype` (integer wrap-around, bool).
double stored_as(DType dtype, double v) {
  switch (dtype) {
    case kBool: return v != 0 ? 1 : 0;
    case kUInt8: return static_cast<uint8_t>(static_cast<int64_t>(v));
    case kInt32: return static_cast<int32_t>(static_cast<int64_t>(v));
    case kFloat32: return static_cast<float>(v);
    case kFloat16: return static_cast<float>(Half(static_cast<float>(v)));
    case kBFloat16: return static_cast<float>(BFloat16(static_cast<float>(v)));
    default: return v;
  }
}

std::vector<double> stored_as(DType dtype, std::vector<double> v) {
  for (double& x : v) x = stored_as(dtype, x);
  return v;
}

bool close_in(const Tensor& out, const Shape& shape, DType dtype, const std::vector<double>& expected) {
  return matches(out, shape, stored_as(dtype, expected), rtol_for(dtype), atol_for(dtype));
}

struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> reference;
  bool bool_ok = true;        // defined for bool tensors
  bool true_division = false;  // integer inputs give float32
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double x, double y) { return x + y; }},
      {"add alpha=3", [](const Tensor& a, const Tensor& b) { return add(a, b, 3); },
       [](double x, double y) { return x + 3 * y; }, false},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double x, double y) { return x - y; },
       false},
      {"sub alpha=2", [](const Tensor& a, const Tensor& b) { return sub(a, b, 2); },
       [](double x, double y) { return x - 2 * y; }, false},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double x, double y) { return x * y; }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double x, double y) { return x / y; },
       true, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double x, double y) { return std::max(x, y); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double x, double y) { return std::min(x, y); }},
  };
  return cases;
}

struct ShapePair {
  Shape a, b;
};
const std::vector<ShapePair> kShapePairs = {
    {{2, 3}, {2, 3}}, {{4, 1, 3}, {2, 3}}, {{2, 3}, {4, 1, 3}}, {{}, {3, 4}}, {{3, 4}, {}}, {{}, {}}, {{3, 1}, {1, 5}},
};

}  // namespace

TEST_CASE("binary ops broadcast and match a double loop in every dtype", "[tensor][elementwise]") {
  Generator gen(100);
  for (const BinaryCase& c : binary_cases()) {
    for (DType dt : testing::kMainDTypes) {
      if (dt == kBool && !c.bool_ok) continue;
      const DType out_dt = c.true_division && !is_floating(dt) ? kFloat32 : dt;
      for (const ShapePair& shapes : kShapePairs) {
        INFO(c.name << " " << dtype_name(dt) << " " << shape_str(shapes.a) << " with " << shape_str(shapes.b));
        Tensor a = random_tensor(shapes.a, dt, gen);
        Tensor b = random_tensor(shapes.b, dt, gen);
        Tensor out = c.op(a, b);
        CHECK(out.dtype() == out_dt);
        CHECK(out.is_contiguous());
        CHECK(close_in(out, testing::broadcast(shapes.a, shapes.b), out_dt, reference_binary(a, b, c.reference)));
      }
    }
  }
}

TEST_CASE("binary ops read non-contiguous operands: transposed, step-sliced, expanded", "[tensor][elementwise]") {
  Generator gen(101);
  for (const BinaryCase& c : binary_cases()) {
    for (DType dt : {kFloat32, kFloat64, kInt64, kUInt8}) {
      const DType out_dt = c.true_division && !is_floating(dt) ? kFloat32 : dt;
      for (Layout la : testing::kAllLayouts) {
        for (Layout lb : {Layout::Contiguous, Layout::Transposed, Layout::StepSliced}) {
          INFO(c.name << " " << dtype_name(dt) << " " << testing::layout_name(la) << " with "
                      << testing::layout_name(lb));
          Tensor a = random_layout({3, 4, 5}, dt, la, gen);
          Tensor b = random_layout({4, 5}, dt, lb, gen);
          Tensor out = c.op(a, b);
          CHECK(close_in(out, {3, 4, 5}, out_dt, reference_binary(a, b, c.reference)));
          // And with the operands swapped, so the strided one is also the broadcast one.
          Tensor swapped = c.op(b, a);
          CHECK(close_in(swapped, {3, 4, 5}, out_dt,
                         reference_binary(b, a, c.reference)));
        }
      }
    }
  }
}

TEST_CASE("large non-contiguous binary ops split across threads agree with the reference",
          "[tensor][elementwise]") {
  // 96 x 700 = 67200 elements: above the parallel grain, so runs start mid-row on each thread.
  Generator gen(102);
  Tensor a = random_layout({96, 700}, kFloat32, Layout::Transposed, gen);
  Tensor b = random_layout({96, 700}, kFloat32, Layout::StepSliced, gen);
  CHECK(close_in(mul(a, b), {96, 700}, kFloat32, reference_binary(a, b, [](double x, double y) { return x * y; })));
  Tensor row = random_tensor({700}, kFloat32, gen);
  CHECK(close_in(add(a, row, 0.5), {96, 700}, kFloat32,
                 reference_binary(a, row, [](double x, double y) { return x + 0.5 * y; })));
}

TEST_CASE("integer and bool arithmetic is exact, wraps like the C type, and bool add/mul are or/and",
          "[tensor][elementwise]") {
  Tensor u = tensor<uint8_t>({200, 10, 255});
  Tensor v = tensor<uint8_t>({100, 20, 1});
  CHECK(testing::matches_exactly(add(u, v), {3}, {44, 30, 0}));
  CHECK(testing::matches_exactly(sub(v, u), {3}, {156, 10, 2}));
  Tensor big = tensor<int64_t>({int64_t{1} << 53, -(int64_t{1} << 40)});
  Tensor one = tensor<int64_t>({1, 3});
  Tensor sum = add(big, one);
  CHECK(sum.data_ptr<int64_t>()[0] == (int64_t{1} << 53) + 1);  // beyond float64's exact integers
  CHECK(mul(big, one).data_ptr<int64_t>()[1] == -3 * (int64_t{1} << 40));
  Tensor t = tensor<bool>({true, true, false, false});
  Tensor f = tensor<bool>({true, false, true, false});
  CHECK(add(t, f).dtype() == kBool);
  CHECK(testing::matches_exactly(add(t, f), {4}, {1, 1, 1, 0}));
  CHECK(testing::matches_exactly(mul(t, f), {4}, {1, 0, 0, 0}));
}

// A float (or double, float16, bfloat16) to uint8 goes through int64, as PyTorch's cast does on every
// device: -1 is 255 and 300 is 44 (300 mod 256). A direct cast of a negative float to an unsigned
// type is undefined in C++ (x86 gives 255, a GPU's saturating conversion 0).
TEST_CASE("a float cast to uint8 wraps through int64, as PyTorch's", "[tensor][elementwise]") {
  const std::vector<double> v{-1.0, -1.5, -200.7, 300.0, 255.9, 0.5, -0.5};
  const std::vector<double> expected{255, 255, 56, 44, 255, 0, 0};
  for (DType from : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    INFO(dtype_name(from));
    const Tensor x = tensor(v).to(from);
    std::vector<double> want = expected;
    if (from == kFloat16 || from == kBFloat16) {  // the 16-bit value first, then the cast
      const Tensor stored = x.to(kFloat64);
      for (size_t i = 0; i < v.size(); ++i)
        want[i] = static_cast<uint8_t>(static_cast<int64_t>(stored.data_ptr<double>()[i]));
    }
    CHECK(testing::matches_exactly(x.to(kUInt8), {static_cast<int64_t>(v.size())}, want));
    CHECK(testing::matches_exactly(x.to(Device::sim(0)).to(kUInt8).cpu(), {static_cast<int64_t>(v.size())}, want));
  }
}

TEST_CASE("type promotion between tensors follows PyTorch, 0-d tensors lifting only the category",
          "[tensor][elementwise][promotion]") {
  struct Promotion {
    DType a;
    Shape sa;
    DType b;
    Shape sb;
    DType expected;
  };
  const std::vector<Promotion> table = {
      {kInt64, {3}, kFloat32, {3}, kFloat32},    {kInt32, {3}, kInt64, {3}, kInt64},
      {kUInt8, {3}, kInt32, {3}, kInt32},        {kBool, {3}, kUInt8, {3}, kUInt8},
      {kBool, {3}, kBool, {3}, kBool},           {kFloat32, {3}, kFloat64, {3}, kFloat64},
      {kInt64, {3}, kFloat64, {}, kFloat64},     // 0-d float64 lifts an int tensor to float64
      {kInt32, {3}, kInt64, {}, kInt32},         // same category: the dimensioned tensor decides
      {kFloat32, {3}, kFloat64, {}, kFloat32},   {kFloat16, {3}, kFloat32, {}, kFloat16},
      {kUInt8, {3}, kInt64, {}, kUInt8},         {kBool, {3}, kInt32, {}, kInt32},
      {kFloat16, {3}, kFloat32, {3}, kFloat32},  {kFloat16, {3}, kBFloat16, {3}, kFloat32},
      {kBFloat16, {3}, kInt64, {3}, kBFloat16},  {kFloat64, {}, kFloat32, {}, kFloat64},  // both 0-d: full rules
      {kInt64, {}, kFloat32, {2, 3}, kFloat32},  {kFloat32, {2, 3}, kFloat64, {1}, kFloat64},  // [1] is not 0-d
  };
  Generator gen(103);
  for (const Promotion& p : table) {
    for (bool swap : {false, true}) {
      Tensor a = random_tensor(p.sa, p.a, gen), b = random_tensor(p.sb, p.b, gen);
      if (swap) std::swap(a, b);
      INFO(dtype_name(a.dtype()) << shape_str(a.sizes()) << " with " << dtype_name(b.dtype()) << shape_str(b.sizes()));
      const Shape shape = testing::broadcast(a.sizes(), b.sizes());
      Tensor s = add(a, b);
      CHECK(s.dtype() == p.expected);
      CHECK(close_in(s, shape, p.expected, reference_binary(a, b, [](double x, double y) { return x + y; })));
      CHECK(mul(a, b).dtype() == p.expected);
      CHECK(close_in(mul(a, b), shape, p.expected, reference_binary(a, b, [](double x, double y) { return x * y; })));
      CHECK(maximum(a, b).dtype() == p.expected);
      CHECK(div(a, b).dtype() == (is_floating(p.expected) ? p.expected : kFloat32));
      CHECK(close_in(div(a, b), shape, is_floating(p.expected) ? p.expected : kFloat32,
                     reference_binary(a, b, [](double x, double y) { return x / y; })));
    }
  }
}

TEST_CASE("a Scalar lifts only the category: int * 2.5 is float32, float16 + 2.0 stays float16",
          "[tensor][elementwise][promotion]") {
  Generator gen(104);
  Tensor i64 = random_tensor({5}, kInt64, gen);
  Tensor i32 = random_tensor({5}, kInt32, gen);
  Tensor u8 = random_tensor({5}, kUInt8, gen);
  Tensor b = random_tensor({5}, kBool, gen);
  Tensor h = random_tensor({5}, kFloat16, gen);
  Tensor bf = random_tensor({5}, kBFloat16, gen);
  Tensor f64 = random_tensor({5}, kFloat64, gen);
  struct Case {
    const char* name;
    Tensor out;
    DType expected;
    std::vector<double> reference;
  };
  auto ref = [](const Tensor& t, double (*f)(double)) { return reference_unary(t, f); };
  const std::vector<Case> cases = {
      {"int64 * 2.5", mul(i64, 2.5), kFloat32, ref(i64, [](double x) { return x * 2.5; })},
      {"int32 + 5", add(i32, 5), kInt32, ref(i32, [](double x) { return x + 5; })},
      {"int32 * 2.5", i32 * 2.5, kFloat32, ref(i32, [](double x) { return x * 2.5; })},
      {"uint8 + 7", u8 + 7, kUInt8, ref(u8, [](double x) { return x + 7; })},
      {"bool + 1", add(b, 1), kInt64, ref(b, [](double x) { return x + 1; })},
      {"bool * 1.5", mul(b, 1.5), kFloat32, ref(b, [](double x) { return x * 1.5; })},
      {"float16 + 2.0", add(h, 2.0), kFloat16, ref(h, [](double x) { return x + 2.0; })},
      {"float16 * 3", h * 3, kFloat16, ref(h, [](double x) { return x * 3; })},
      {"bfloat16 - 0.5", bf - 0.5, kBFloat16, ref(bf, [](double x) { return x - 0.5; })},
      {"float64 + 1", f64 + 1, kFloat64, ref(f64, [](double x) { return x + 1; })},
      {"int32 / 4", div(i32, 4), kFloat32, ref(i32, [](double x) { return x / 4; })},
      {"int64 / 0-d int64", div(i64, scalar_tensor(4, {.dtype = kInt64})), kFloat32,
       ref(i64, [](double x) { return x / 4; })},
      {"int64 / int64", div(i64, i64), kFloat32, reference_binary(i64, i64, [](double x, double y) { return x / y; })},
      {"float64 / 2", f64 / 2, kFloat64, ref(f64, [](double x) { return x / 2; })},
      {"int64 - 3", sub(i64, 3), kInt64, ref(i64, [](double x) { return x - 3; })},
      {"int64 - 0.5", sub(i64, 0.5), kFloat32, ref(i64, [](double x) { return x - 0.5; })},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    CHECK(c.out.dtype() == c.expected);
    CHECK(close_in(c.out, {5}, c.expected, c.reference));
  }
}

TEST_CASE("scalar overloads and operators: add, sub, mul, div, rsub, rdiv, unary minus", "[tensor][elementwise]") {
  Generator gen(105);
  Tensor a = random_layout({3, 4}, kFloat64, Layout::Transposed, gen);
  Tensor b = random_tensor({4}, kFloat64, gen);
  auto r = [&](double (*f)(double)) { return reference_unary(a, f); };
  const double tol = 1e-12;
  CHECK(matches(a + 2.5, {3, 4}, r([](double x) { return x + 2.5; }), tol, tol));
  CHECK(matches(a - 1.5, {3, 4}, r([](double x) { return x - 1.5; }), tol, tol));
  CHECK(matches(a * -3, {3, 4}, r([](double x) { return x * -3; }), tol, tol));
  CHECK(matches(a / 4, {3, 4}, r([](double x) { return x / 4; }), tol, tol));
  CHECK(matches(2.0 + a, {3, 4}, r([](double x) { return 2.0 + x; }), tol, tol));
  CHECK(matches(2.0 - a, {3, 4}, r([](double x) { return 2.0 - x; }), tol, tol));
  CHECK(matches(rsub(a, 2), {3, 4}, r([](double x) { return 2 - x; }), tol, tol));
  CHECK(matches(3 * a, {3, 4}, r([](double x) { return 3 * x; }), tol, tol));
  CHECK(matches(1.0 / a, {3, 4}, r([](double x) { return 1.0 / x; }), tol, tol));
  CHECK(matches(rdiv(a, 3), {3, 4}, r([](double x) { return 3 / x; }), tol, tol));
  CHECK(matches(-a, {3, 4}, r([](double x) { return -x; }), 0, 0));
  CHECK(matches(a + b, {3, 4}, reference_binary(a, b, [](double x, double y) { return x + y; }), tol, tol));
  CHECK(matches(a - b, {3, 4}, reference_binary(a, b, [](double x, double y) { return x - y; }), tol, tol));
  CHECK(matches(a * b, {3, 4}, reference_binary(a, b, [](double x, double y) { return x * y; }), tol, tol));
  CHECK(matches(a / b, {3, 4}, reference_binary(a, b, [](double x, double y) { return x / y; }), tol, tol));
  CHECK(matches(a.add(b, -0.5), {3, 4}, reference_binary(a, b, [](double x, double y) { return x - 0.5 * y; }), tol,
                tol));
  CHECK(matches(a.sub(b, 0.25), {3, 4}, reference_binary(a, b, [](double x, double y) { return x - 0.25 * y; }), tol,
                tol));

  // Integer tensors: 2 - a stays integer, 3 / a is true division.
  Tensor i = tensor<int32_t>({1, -2, 4, 8});
  CHECK((2 - i).dtype() == kInt32);
  CHECK(testing::matches_exactly(2 - i, {4}, {1, 4, -2, -6}));
  CHECK((3 / i).dtype() == kFloat32);
  CHECK(matches(3 / i, {4}, {3.0, -1.5, 0.75, 0.375}, 0, 0));
  CHECK(testing::matches_exactly(-i, {4}, {-1, 2, -4, -8}));
}

TEST_CASE("division by zero gives inf and nan as IEEE floats, also for integers", "[tensor][elementwise]") {
  Tensor n = tensor<int64_t>({1, -1, 0});
  Tensor z = zeros({3}, {.dtype = kInt64});
  Tensor q = div(n, z);
  CHECK(q.dtype() == kFloat32);
  CHECK(matches(q, {3}, {INFINITY, -INFINITY, NAN}));
}

}  // namespace chorus
