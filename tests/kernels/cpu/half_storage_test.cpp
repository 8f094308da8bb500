// The elementwise kernels on float16/bfloat16 storage ([Half storage], kernels/shared/pointwise_math.h)
// give exactly the bits of widening: the same kernel run on float32 copies of the inputs, the result
// rounded to 16 bits once. Every op family (unary, binary arithmetic with and without alpha, a float32
// Scalar operand, comparisons, fused backward helpers, pow, clamp, where, logical_not), for both 16-bit
// dtypes, on the cpu and on sim:0 (which runs the cpu kernels on its streams), with broadcast and
// transposed operands. Also batch_norm with a 16-bit input and float32 statistics, and the row kernels
// (softmax, log_softmax, layer_norm, cross_entropy, each with its backward) on 16-bit rows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

const std::vector<Device> kDevices = {Device::cpu(), Device::sim(0)};
const std::vector<DType> kHalves = {kFloat16, kBFloat16};

// A [rows, cols] tensor uniform in [lo, hi), made on the cpu in float64 and rounded to dtype.
Tensor uniform(const Shape& shape, double lo, double hi, DType dtype, Device device, Generator& gen) {
  Tensor t = add(mul(rand(shape, {.dtype = kFloat64}, &gen), hi - lo), lo);
  return t.to(dtype).to(device);
}

// The raw 16-bit (or 1-byte bool) patterns of t, in row-major order.
std::vector<uint16_t> bits_of(const Tensor& t) {
  Tensor c = t.to(Device::cpu()).contiguous();
  std::vector<uint16_t> out(static_cast<size_t>(c.numel()));
  const char* p = static_cast<const char*>(c.raw_data_ptr());
  for (size_t i = 0; i < out.size(); ++i) {
    if (c.element_size() == 2) std::memcpy(&out[i], p + 2 * i, 2);
    else out[i] = static_cast<uint8_t>(p[i]);
  }
  return out;
}

std::vector<float> values_of(const Tensor& t) {
  Tensor c = t.to(Device::cpu()).to(kFloat32).contiguous();
  const float* p = c.data_ptr<float>();
  return std::vector<float>(p, p + c.numel());
}

// Sign-magnitude 16-bit patterns as a monotone integer scale, where adjacent values differ by 1.
int ordered(uint16_t bits) { return bits & 0x8000 ? -(bits & 0x7fff) : bits; }

// Bit for bit (max_ulps = 0), or within max_ulps 16-bit steps.
void check_same_bits(const Tensor& direct, const Tensor& widened, const std::string& what, int max_ulps = 0) {
  INFO(what);
  REQUIRE(direct.dtype() == widened.dtype());
  const std::vector<uint16_t> a = bits_of(direct), b = bits_of(widened);
  REQUIRE(a.size() == b.size());
  size_t mismatches = 0, first = 0;
  const std::vector<float> va = values_of(direct), vb = values_of(widened);
  for (size_t i = 0; i < a.size(); ++i) {
    const int ulps = std::abs(ordered(a[i]) - ordered(b[i]));
    // Where a formula cancels (gelu far below 0 is 0.5 x (1 + tanh(...)) with tanh near -1), a float
    // ulp of the math function (times the factors around it, up to ~10 here) is many 16-bit steps of
    // the tiny result: 1e-5 absolute covers that.
    const bool near = max_ulps > 0 && std::abs(va[i] - vb[i]) <= 1e-5f;
    if (ulps > max_ulps && !near && mismatches++ == 0) first = i;
  }
  INFO("first mismatch at " << first << ": " << (mismatches ? a[first] : 0) << " vs " << (mismatches ? b[first] : 0));
  CHECK(mismatches == 0);
}

// Runs `kernel(out, inputs)` twice: on the 16-bit inputs into a 16-bit (or bool) output, and on their
// float32 copies into a float32 output rounded after; the two must agree bit for bit. Inputs of
// dtype float32 (a Scalar operand) go to both as they are.
// A float32 copy (`to`) is contiguous: for a transposed input the widened kernel runs the vector loop
// where the direct one runs the strided loop, and on the cpu the vector loop calls libmvec's erf and
// tanh (kernels/cpu/vector_math.h), a float ulp away from libm's at times. Those cases pass
// max_ulps = 1: the float results agree to the math library's accuracy, so the 16-bit ones to one
// rounding (or 1e-5 absolute where the formula cancels). The float32 kernel itself differs the same
// way between a strided and a contiguous input; on CUDA there is one erf and one tanh.
void expect_widening_bits(const std::string& what, const Shape& out_shape, DType out_dtype,
                          const std::vector<Tensor>& inputs,
                          const std::function<void(const Tensor&, const std::vector<Tensor>&)>& kernel,
                          int max_ulps = 0) {
  const Device device = inputs[0].device();
  Tensor direct = empty(out_shape, {.dtype = out_dtype, .device = device});
  kernel(direct, inputs);
  std::vector<Tensor> wide;
  for (const Tensor& t : inputs) wide.push_back(t.dtype() == kBool ? t : t.to(kFloat32));
  const DType wide_out = out_dtype == kBool ? kBool : kFloat32;
  Tensor widened = empty(out_shape, {.dtype = wide_out, .device = device});
  kernel(widened, wide);
  if (out_dtype == kBool) CHECK(equal(direct, widened));
  else check_same_bits(direct, widened.to(out_dtype), what, max_ulps);
}

std::string label(const char* op, DType dtype, Device device) {
  return std::string(op) + " on " + dtype_name(dtype) + " at " + device.str();
}

TEST_CASE("unary kernels on float16/bfloat16 storage equal widen-compute-round bit for bit", "[kernels][half]") {
  struct Case {
    UnaryOp op;
    const char* name;
    double lo, hi;
  };
  const std::vector<Case> cases = {
      {UnaryOp::Neg, "neg", -3, 3},         {UnaryOp::Abs, "abs", -3, 3},          {UnaryOp::Sign, "sign", -3, 3},
      {UnaryOp::Relu, "relu", -3, 3},       {UnaryOp::Exp, "exp", -5, 5},          {UnaryOp::Log, "log", 0.01, 8},
      {UnaryOp::Log1p, "log1p", -0.9, 8},   {UnaryOp::Sqrt, "sqrt", 0, 8},         {UnaryOp::Rsqrt, "rsqrt", 0.01, 8},
      {UnaryOp::Tanh, "tanh", -4, 4},       {UnaryOp::Sigmoid, "sigmoid", -8, 8},  {UnaryOp::GeluErf, "gelu", -4, 4},
      {UnaryOp::GeluTanh, "gelu_tanh", -4, 4}, {UnaryOp::Sin, "sin", -6, 6},       {UnaryOp::Cos, "cos", -6, 6},
      {UnaryOp::Reciprocal, "reciprocal", 0.1, 4}, {UnaryOp::Floor, "floor", -9, 9}, {UnaryOp::Ceil, "ceil", -9, 9},
      {UnaryOp::Round, "round", -9, 9},     {UnaryOp::Trunc, "trunc", -9, 9},      {UnaryOp::Erf, "erf", -3, 3},
      {UnaryOp::Erfinv, "erfinv", -0.99, 0.99}, {UnaryOp::Expm1, "expm1", -3, 3}, {UnaryOp::Log2, "log2", 0.01, 8},
      {UnaryOp::Log10, "log10", 0.01, 8},
  };
  Generator gen(101);
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      for (const Case& c : cases) {
        // Transposed: the strided (non-vector) loop as well as the contiguous one.
        Tensor x = uniform({37, 29}, c.lo, c.hi, dtype, device, gen);
        auto run = [&](const Tensor& out, const std::vector<Tensor>& i) { kernels::unary(c.op, out, i[0]); };
        expect_widening_bits(label(c.name, dtype, device), x.sizes(), dtype, {x}, run);
        expect_widening_bits(label(c.name, dtype, device) + " transposed", x.t().sizes(), dtype, {x.t()}, run, 1);
      }
      Tensor x = uniform({41, 7}, -2, 2, dtype, device, gen);
      expect_widening_bits(label("logical_not", dtype, device), x.sizes(), kBool, {mul(x, 0.0).to(dtype), x},
                           [](const Tensor& out, const std::vector<Tensor>& i) {
                             kernels::unary(UnaryOp::LogicalNot, out, i[0]);
                           });
      expect_widening_bits(label("logical_not", dtype, device), x.sizes(), kBool, {x},
                           [](const Tensor& out, const std::vector<Tensor>& i) {
                             kernels::unary(UnaryOp::LogicalNot, out, i[0]);
                           });
    }
  }
}

TEST_CASE("binary kernels on float16/bfloat16 storage equal widen-compute-round bit for bit", "[kernels][half]") {
  struct Case {
    BinaryOp op;
    const char* name;
    double lo, hi;  // both operands
    double alpha;
  };
  // alpha 0.3 is not a float16/bfloat16 value: it must be used in float, not rounded first.
  const std::vector<Case> cases = {
      {BinaryOp::Add, "add", -3, 3, 1.0},
      {BinaryOp::Add, "add alpha", -3, 3, 0.3},
      {BinaryOp::Sub, "sub", -3, 3, 1.0},
      {BinaryOp::Sub, "sub alpha", -3, 3, 0.3},
      {BinaryOp::Mul, "mul", -3, 3, 1.0},
      {BinaryOp::Div, "div", 0.2, 3, 1.0},
      {BinaryOp::Max, "maximum", -3, 3, 1.0},
      {BinaryOp::Min, "minimum", -3, 3, 1.0},
      {BinaryOp::Pow, "pow", 0.1, 2.5, 1.0},
      {BinaryOp::ReluBackward, "relu_backward", -3, 3, 1.0},
      {BinaryOp::TanhBackward, "tanh_backward", -1, 1, 1.0},
      {BinaryOp::SigmoidBackward, "sigmoid_backward", 0, 1, 1.0},
      {BinaryOp::GeluErfBackward, "gelu_backward", -4, 4, 1.0},
      {BinaryOp::GeluTanhBackward, "gelu_tanh_backward", -4, 4, 1.0},
  };
  Generator gen(202);
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      for (const Case& c : cases) {
        const Scalar alpha(c.alpha);
        auto run = [&](const Tensor& out, const std::vector<Tensor>& i) {
          kernels::binary(c.op, out, i[0], i[1], alpha);
        };
        // Same shape; broadcast [6, 1, 19] x [5, 19]; a transposed operand.
        Tensor a = uniform({6, 5, 19}, c.lo, c.hi, dtype, device, gen), b = uniform({6, 5, 19}, c.lo, c.hi, dtype, device, gen);
        expect_widening_bits(label(c.name, dtype, device), a.sizes(), dtype, {a, b}, run);
        Tensor a1 = uniform({6, 1, 19}, c.lo, c.hi, dtype, device, gen), b1 = uniform({5, 19}, c.lo, c.hi, dtype, device, gen);
        expect_widening_bits(label(c.name, dtype, device) + " broadcast", {6, 5, 19}, dtype, {a1, b1}, run);
        Tensor at = uniform({19, 23}, c.lo, c.hi, dtype, device, gen).t(), bt = uniform({23, 19}, c.lo, c.hi, dtype, device, gen);
        expect_widening_bits(label(c.name, dtype, device) + " transposed", {23, 19}, dtype, {at, bt}, run, 1);
        // A float32 0-d other (how a Scalar reaches the kernel: kept in float, never rounded to 16 bits).
        Tensor s = full({}, c.lo + 0.37 * (c.hi - c.lo) + 1e-3, {.dtype = kFloat32, .device = device});
        expect_widening_bits(label(c.name, dtype, device) + " float32 scalar", a.sizes(), dtype, {a, s}, run);
      }
    }
  }
}

TEST_CASE("comparison and logical kernels on float16/bfloat16 storage equal the widened ones", "[kernels][half]") {
  const std::vector<std::pair<BinaryOp, const char*>> ops = {
      {BinaryOp::Eq, "eq"}, {BinaryOp::Ne, "ne"}, {BinaryOp::Lt, "lt"}, {BinaryOp::Le, "le"},
      {BinaryOp::Gt, "gt"}, {BinaryOp::Ge, "ge"}, {BinaryOp::LogicalAnd, "logical_and"},
      {BinaryOp::LogicalOr, "logical_or"}, {BinaryOp::LogicalXor, "logical_xor"}};
  Generator gen(303);
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      // Coarse values (multiples of 0.5, zeros among them), so that ties and zeros occur often.
      auto coarse = [&](const Shape& shape) {
        return div(round(mul(uniform(shape, -2, 2, kFloat32, Device::cpu(), gen), 2.0)), 2.0).to(dtype).to(device);
      };
      Tensor a = coarse({8, 33}), b = coarse({8, 33}), b_row = coarse({33});
      for (const auto& [op, name] : ops) {
        auto run = [op = op](const Tensor& out, const std::vector<Tensor>& i) { kernels::binary(op, out, i[0], i[1], 1); };
        expect_widening_bits(label(name, dtype, device), a.sizes(), kBool, {a, b}, run);
        expect_widening_bits(label(name, dtype, device) + " broadcast", a.sizes(), kBool, {a, b_row}, run);
      }
    }
  }
}

TEST_CASE("pow, clamp and where kernels on float16/bfloat16 storage equal the widened ones", "[kernels][half]") {
  Generator gen(404);
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      Tensor x = uniform({13, 31}, 0.05, 3, dtype, device, gen);
      for (double e : {2.0, 0.5, 1.0, 3.3, -1.7}) {
        expect_widening_bits(label("pow", dtype, device) + " exponent " + std::to_string(e), x.sizes(), dtype, {x},
                             [e](const Tensor& out, const std::vector<Tensor>& i) { kernels::pow_scalar(out, i[0], e); });
      }
      Tensor y = uniform({13, 31}, -3, 3, dtype, device, gen);
      // Bounds that no 16-bit float holds: the kernel must compare against their float values.
      const Scalar lo(-0.7001), hi(1.3001);
      expect_widening_bits(label("clamp", dtype, device), y.sizes(), dtype, {y},
                           [&](const Tensor& out, const std::vector<Tensor>& i) { kernels::clamp(out, i[0], &lo, &hi); });
      expect_widening_bits(label("clamp min", dtype, device), y.t().sizes(), dtype, {y.t()},
                           [&](const Tensor& out, const std::vector<Tensor>& i) { kernels::clamp(out, i[0], &lo, nullptr); },
                           0);  // no math function: exact for any layout
      Tensor cond = lt(uniform({13, 31}, 0, 1, kFloat32, device, gen), 0.5);
      Tensor z = uniform({31}, -3, 3, dtype, device, gen);
      expect_widening_bits(label("where", dtype, device), y.sizes(), dtype, {cond, y, z},
                           [](const Tensor& out, const std::vector<Tensor>& i) { kernels::where(out, i[0], i[1], i[2]); });
    }
  }
}

// batch_norm with a 16-bit input and float32 weight, bias and statistics: the statistics and the
// parameter gradients stay float32 and agree with the float32 kernel's on the same (rounded) input.
TEST_CASE("batch_norm kernels take float16/bfloat16 input with float32 statistics", "[kernels][half]") {
  Generator gen(505);
  const int64_t n = 4, c = 3, s = 50;
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      INFO(label("batch_norm", dtype, device));
      const TensorOptions f32{.dtype = kFloat32, .device = device};
      Tensor x = uniform({n, c, s}, -2, 3, dtype, device, gen), g = uniform({n, c, s}, -1, 1, dtype, device, gen);
      Tensor w = uniform({c}, 0.5, 1.5, kFloat32, device, gen), b = uniform({c}, -0.5, 0.5, kFloat32, device, gen);
      for (bool training : {true, false}) {
        Tensor rm = uniform({c}, -0.1, 0.1, kFloat32, device, gen), rv = uniform({c}, 0.9, 1.1, kFloat32, device, gen);
        Tensor rm32 = rm.clone(), rv32 = rv.clone();
        Tensor out = empty({n, c, s}, {.dtype = dtype, .device = device});
        Tensor mean = empty({c}, f32), rstd = empty({c}, f32);
        kernels::batch_norm(out, mean, rstd, x, w, b, rm, rv, training, 0.1, 1e-5, n, c, s);
        Tensor out32 = empty({n, c, s}, f32), mean32 = empty({c}, f32), rstd32 = empty({c}, f32);
        Tensor x32 = x.to(kFloat32), g32 = g.to(kFloat32);
        kernels::batch_norm(out32, mean32, rstd32, x32, w, b, rm32, rv32, training, 0.1, 1e-5, n, c, s);
        CHECK(allclose(out.to(kFloat32), out32, 1e-2, 1e-2));
        CHECK(allclose(mean, mean32, 1e-5, 1e-6));
        CHECK(allclose(rstd, rstd32, 1e-5, 1e-6));
        CHECK(allclose(rm, rm32, 1e-5, 1e-6));
        CHECK(allclose(rv, rv32, 1e-5, 1e-6));
        Tensor gx = empty({n, c, s}, {.dtype = dtype, .device = device}), gw = empty({c}, f32), gb = empty({c}, f32);
        kernels::batch_norm_backward(gx, gw, gb, g, x, mean, rstd, w, training, n, c, s);
        Tensor gx32 = empty({n, c, s}, f32), gw32 = empty({c}, f32), gb32 = empty({c}, f32);
        kernels::batch_norm_backward(gx32, gw32, gb32, g32, x32, mean32, rstd32, w, training, n, c, s);
        CHECK(allclose(gx.to(kFloat32), gx32, 1e-2, 1e-2));
        CHECK(allclose(gw, gw32, 1e-4, 1e-4));
        CHECK(allclose(gb, gb32, 1e-4, 1e-4));
      }
      if (device.is_cpu()) {  // (on sim the kernel runs on a stream worker)
        // A 16-bit weight beside a 16-bit input is not what the kernel takes: a clear error.
        Tensor out = empty({n, c, s}, {.dtype = dtype, .device = device});
        Tensor mean = empty({c}, f32), rstd = empty({c}, f32);
        CHECK_THROWS_WITH(kernels::batch_norm(out, mean, rstd, x, w.to(dtype), b, Tensor(), Tensor(), true, 0.1, 1e-5,
                                              n, c, s),
                          Catch::Contains("float32 weight, bias and statistics"));
      }
    }
  }
}

// The row kernels widen each 16-bit row to float, run the float32 kernel's row math on it and round
// the row once: the result is the float32 kernel's on the widened inputs, rounded, bit for bit; the
// float32 statistics, losses and parameter gradients equal the float32 kernel's exactly.
TEST_CASE("softmax, layer_norm and cross_entropy kernels on 16-bit rows equal widen-compute-round", "[kernels][half]") {
  Generator gen(606);
  const int64_t rows = 37, cols = 300;  // cols beyond one vector chunk, not a multiple of 16
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      const TensorOptions f32{.dtype = kFloat32, .device = device};
      const TensorOptions low{.dtype = dtype, .device = device};
      Tensor x = uniform({rows, cols}, -4, 4, dtype, device, gen), g = uniform({rows, cols}, -1, 1, dtype, device, gen);
      Tensor x32 = x.to(kFloat32), g32 = g.to(kFloat32);
      for (bool log : {false, true}) {
        for (int64_t dim : {int64_t(1), int64_t(0)}) {  // dim 0: rows gathered through a strided view
          INFO(label(log ? "log_softmax" : "softmax", dtype, device) << " dim " << dim);
          Tensor y = empty({rows, cols}, low), y32 = empty({rows, cols}, f32);
          kernels::softmax(y, x, dim, log);
          kernels::softmax(y32, x32, dim, log);
          check_same_bits(y, y32.to(dtype), "forward");
          Tensor gi = empty({rows, cols}, low), gi32 = empty({rows, cols}, f32);
          kernels::softmax_backward(gi, g, y, dim, log);
          kernels::softmax_backward(gi32, g32, y.to(kFloat32), dim, log);
          check_same_bits(gi, gi32.to(dtype), "backward");
        }
      }
      {
        INFO(label("layer_norm", dtype, device));
        Tensor w = uniform({cols}, 0.5, 1.5, kFloat32, device, gen), b = uniform({cols}, -0.5, 0.5, kFloat32, device, gen);
        Tensor out = empty({rows, cols}, low), mean = empty({rows}, f32), rstd = empty({rows}, f32);
        Tensor out32 = empty({rows, cols}, f32), mean32 = empty({rows}, f32), rstd32 = empty({rows}, f32);
        kernels::layer_norm(out, mean, rstd, x, w, b, rows, cols, 1e-5);
        kernels::layer_norm(out32, mean32, rstd32, x32, w, b, rows, cols, 1e-5);
        check_same_bits(out, out32.to(dtype), "forward");
        CHECK(equal(mean, mean32));
        CHECK(equal(rstd, rstd32));
        Tensor gx = empty({rows, cols}, low), gw = empty({cols}, f32), gb = empty({cols}, f32);
        Tensor gx32 = empty({rows, cols}, f32), gw32 = empty({cols}, f32), gb32 = empty({cols}, f32);
        kernels::layer_norm_backward(gx, gw, gb, g, x, mean, rstd, w, rows, cols);
        kernels::layer_norm_backward(gx32, gw32, gb32, g32, x32, mean32, rstd32, w, rows, cols);
        check_same_bits(gx, gx32.to(dtype), "backward");
        CHECK(equal(gw, gw32));
        CHECK(equal(gb, gb32));
        if (device.is_cpu()) {  // (on sim the kernel runs on a stream worker)
          CHECK_THROWS_WITH(kernels::layer_norm(out, mean, rstd, x, w.to(dtype), b, rows, cols, 1e-5),
                            Catch::Contains("float32 weight, bias and statistics"));
        }
      }
      for (double smoothing : {0.0, 0.1}) {
        INFO(label("cross_entropy", dtype, device) << " label_smoothing " << smoothing);
        Tensor target = randint(0, cols, {rows}, {.dtype = kInt64}, &gen).to(device);
        target = where(lt(rand({rows}, {}, &gen), 0.2).to(device), full({rows}, -100, {.dtype = kInt64, .device = device}), target);
        Tensor cw = uniform({cols}, 0.5, 2, kFloat32, device, gen);
        Tensor losses = empty({rows}, f32), rw = empty({rows}, f32), probs = empty({rows, cols}, low);
        Tensor losses32 = empty({rows}, f32), rw32 = empty({rows}, f32), probs32 = empty({rows, cols}, f32);
        kernels::cross_entropy(losses, rw, probs, x, target, cw, -100, smoothing);
        kernels::cross_entropy(losses32, rw32, probs32, x32, target, cw, -100, smoothing);
        check_same_bits(probs, probs32.to(dtype), "probabilities");
        CHECK(equal(losses, losses32));
        CHECK(equal(rw, rw32));
        Tensor scale = uniform({rows}, 0.5, 1.5, kFloat32, device, gen);
        Tensor grad = empty({rows, cols}, low), grad32 = empty({rows, cols}, f32);
        kernels::cross_entropy_backward(grad, scale, probs, target, cw, -100, smoothing);
        kernels::cross_entropy_backward(grad32, scale, probs.to(kFloat32), target, cw, -100, smoothing);
        check_same_bits(grad, grad32.to(dtype), "gradient");
      }
    }
  }
}

// Reductions read 16-bit storage and round once: the float32 kernel's result on the widened input,
// rounded, bit for bit, for every layout the kernel has (rows, columns, a strided copy, a full
// reduction split across threads) and every op.
TEST_CASE("reduction kernels on float16/bfloat16 storage equal widen-compute-round bit for bit", "[kernels][half]") {
  Generator gen(707);
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      Tensor x = uniform({40, 30, 50}, -2, 2, dtype, device, gen);
      Tensor big = uniform({1 << 18}, -1, 1, dtype, device, gen);
      Tensor x32 = x.to(kFloat32), big32 = big.to(kFloat32);
      const std::vector<std::pair<const char*, std::vector<int64_t>>> cases = {
          {"rows (dim 2)", {2}}, {"columns (dim 0)", {0}}, {"dims 0 and 2 (copied)", {0, 2}}, {"all", {0, 1, 2}}};
      for (kernels::ReduceOp op : {kernels::ReduceOp::Sum, kernels::ReduceOp::Prod, kernels::ReduceOp::Max,
                                   kernels::ReduceOp::Min}) {
        for (const auto& [what, dims] : cases) {
          INFO(label("reduce", dtype, device) << " op " << static_cast<int>(op) << " over " << what);
          Shape out_shape;
          for (int64_t d = 0; d < 3; ++d) {
            if (std::find(dims.begin(), dims.end(), d) == dims.end()) out_shape.push_back(x.size(d));
          }
          // (a product of many values leaves float range: the small-magnitude case checks it on dim 2)
          const Tensor in = op == kernels::ReduceOp::Prod ? add(mul(x, 0.05), 1.0) : x;
          Tensor out = empty(out_shape, {.dtype = dtype, .device = device});
          Tensor out32 = empty(out_shape, {.dtype = kFloat32, .device = device});
          kernels::reduce(op, out, in, dims);
          kernels::reduce(op, out32, in.to(kFloat32), dims);
          check_same_bits(out, out32.to(dtype), what);
        }
      }
      INFO(label("sum of 2^18 values", dtype, device));
      Tensor out = empty({}, {.dtype = dtype, .device = device}), out32 = empty({}, {.dtype = kFloat32, .device = device});
      kernels::reduce(kernels::ReduceOp::Sum, out, big, {0});
      kernels::reduce(kernels::ReduceOp::Sum, out32, big32, {0});
      check_same_bits(out, out32.to(dtype), "full sum");
    }
  }
}

}  // namespace
}  // namespace chorus
