// Gradcheck of every differentiable op (micrograd / tinygrad's test_ops): one table, each row an op
// applied to seeded float64 inputs of given shapes and layouts, walked by one test that compares
// autograd's Jacobian with central finite differences (autograd::gradcheck). Rows cover plain
// inputs, broadcasting (binary and ternary ops, incl. a 0-d operand) and non-contiguous inputs
// (transposed or step-sliced views). gradcheck's one-hot output gradients are always contiguous,
// so a second walk re-checks each row with the output transposed and with it summed over dim 0:
// the op's backward then receives a strided or stride-0 (expanded) gradient, as in real graphs.
// Exact gradients at special points (zeros, ties, kinks) and .grad dtypes: special_gradients_test.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "tensor/sim/sim.h"
#include "tests/autograd/autograd_testing.h"

namespace chorus {
namespace {

using autograd::gradcheck;
using autograd::GradcheckOptions;
using testing::Values;
using L = const TensorList&;
using Fn = std::function<Tensor(const TensorList&)>;

enum class Layout { Contiguous, Transposed, StepSliced };

// One input of a row: its shape as the op sees it, its values, and how it sits in memory.
struct Arg {
  Shape shape;
  Values values = Values::Any;
  Layout layout = Layout::Contiguous;
  Tensor fixed;  // exact values (of `shape`) instead of random ones, e.g. zeros in chosen places

  Arg transposed() const {
    Arg a = *this;
    a.layout = Layout::Transposed;
    return a;
  }
  Arg step_sliced() const {
    Arg a = *this;
    a.layout = Layout::StepSliced;
    return a;
  }
};

Arg with(Values v, Shape s) {
  Arg a;
  a.shape = std::move(s);
  a.values = v;
  return a;
}
Arg any(Shape s) { return with(Values::Any, std::move(s)); }
Arg nonzero(Shape s) { return with(Values::AwayFromZero, std::move(s)); }
Arg fixed(Tensor values) {
  Arg a = any(values.sizes());
  a.fixed = std::move(values);
  return a;
}

// The leaf for `arg`: a transposed input is the transpose of a contiguous [.., n, m] tensor, a
// step-sliced one takes every other element of a tensor twice as long in the last dim.
Tensor make_input(const Arg& arg, Generator& gen, Device device = kCPU) {
  Shape base = arg.shape;
  if (arg.layout == Layout::Transposed) {
    REQUIRE(base.size() >= 2);
    std::swap(base[base.size() - 1], base[base.size() - 2]);
  } else if (arg.layout == Layout::StepSliced) {
    REQUIRE(!base.empty());
    base.back() *= 2;
  }
  Tensor t = testing::random_values(base, arg.values, gen).to(device);
  if (arg.layout == Layout::Transposed) t = t.transpose(-2, -1);
  if (arg.layout == Layout::StepSliced) t = t.slice(-1, 0, std::nullopt, 2);
  REQUIRE(t.sizes() == arg.shape);
  if (arg.fixed.defined()) t.copy_(arg.fixed);  // into the view: the layout stays
  // A row that asks for a non-contiguous input must really get one.
  REQUIRE(t.is_contiguous() == (arg.layout == Layout::Contiguous));
  t.requires_grad_();
  return t;
}

struct OpRow {
  std::string name;
  std::vector<Arg> args;
  Fn f;
  GradcheckOptions options = {};
};

using Table = std::vector<OpRow>;

// An elementwise op of one tensor: plain, 0-d, transposed and step-sliced inputs.
void unary(Table& t, const std::string& name, Fn f, Values v = Values::Any) {
  t.push_back({name, {with(v, {3, 4})}, f});
  t.push_back({name + " [0-d]", {with(v, {})}, f});
  t.push_back({name + " [transposed]", {with(v, {3, 4}).transposed()}, f});
  t.push_back({name + " [step-sliced]", {with(v, {2, 3, 2}).step_sliced()}, f});
}

// A broadcasting op of two tensors: same shapes, [3,1,4] with [2,4] both ways round, a 0-d
// operand on either side, and non-contiguous operands (also while broadcasting).
void binary(Table& t, const std::string& name, Fn f, Values va = Values::Any, Values vb = Values::Any) {
  t.push_back({name, {with(va, {3, 4}), with(vb, {3, 4})}, f});
  t.push_back({name + " [broadcast 3x1x4, 2x4]", {with(va, {3, 1, 4}), with(vb, {2, 4})}, f});
  t.push_back({name + " [broadcast 2x4, 3x1x4]", {with(va, {2, 4}), with(vb, {3, 1, 4})}, f});
  t.push_back({name + " [0-d, 3x4]", {with(va, {}), with(vb, {3, 4})}, f});
  t.push_back({name + " [3x4, 0-d]", {with(va, {3, 4}), with(vb, {})}, f});
  t.push_back({name + " [transposed, step-sliced]", {with(va, {3, 4}).transposed(), with(vb, {3, 4}).step_sliced()}, f});
  t.push_back({name + " [step-sliced 2x4, broadcast 3x1x4]", {with(va, {2, 4}).step_sliced(), with(vb, {3, 1, 4})}, f});
}

// The device the table's fixed tensors (masks, indices) are made on: op_table(device) sets it, so
// the same rows run on the CPU and on the sim device.
Device g_table_device = kCPU;
Tensor bools(std::vector<bool> values, Shape shape) { return tensor(values, shape, {.dtype = kBool, .device = g_table_device}); }
Tensor longs(std::vector<int64_t> values, Shape shape) { return tensor(values, shape, {.dtype = kInt64, .device = g_table_device}); }
// For rows that make their index inside the op (the device is captured when the table is built).
Tensor bools_on(Device d, std::vector<bool> values, Shape shape) { return tensor(values, shape, {.dtype = kBool, .device = d}); }
Tensor longs_on(Device d, std::vector<int64_t> values, Shape shape) { return tensor(values, shape, {.dtype = kInt64, .device = d}); }

void pointwise_rows(Table& t) {
  binary(t, "add", [](L x) { return x[0] + x[1]; });
  binary(t, "add alpha=2.5", [](L x) { return add(x[0], x[1], 2.5); });
  binary(t, "sub", [](L x) { return x[0] - x[1]; });
  binary(t, "sub alpha=-1.5", [](L x) { return sub(x[0], x[1], -1.5); });
  binary(t, "mul", [](L x) { return x[0] * x[1]; });
  binary(t, "div", [](L x) { return x[0] / x[1]; }, Values::Any, Values::AwayFromZero);
  binary(t, "maximum", [](L x) { return maximum(x[0], x[1]); });
  binary(t, "minimum", [](L x) { return minimum(x[0], x[1]); });
  binary(t, "pow tensor^tensor", [](L x) { return pow(x[0], x[1]); }, Values::Positive, Values::Any);

  unary(t, "add scalar", [](L x) { return add(x[0], 2.5); });
  unary(t, "tensor + scalar", [](L x) { return x[0] + 2.5; });
  unary(t, "scalar + tensor", [](L x) { return 2.5 + x[0]; });
  unary(t, "sub scalar", [](L x) { return sub(x[0], 1.5); });
  unary(t, "tensor - scalar", [](L x) { return x[0] - 1.5; });
  unary(t, "rsub", [](L x) { return rsub(x[0], 2.0); });
  unary(t, "scalar - tensor", [](L x) { return 2.0 - x[0]; });
  unary(t, "mul scalar", [](L x) { return mul(x[0], -3.0); });
  unary(t, "tensor * int scalar", [](L x) { return x[0] * 3; });
  unary(t, "scalar * tensor", [](L x) { return 0.5 * x[0]; });
  unary(t, "div scalar", [](L x) { return div(x[0], 4.0); });
  unary(t, "tensor / scalar", [](L x) { return x[0] / -2.5; });
  unary(t, "rdiv", [](L x) { return rdiv(x[0], 3.0); }, Values::AwayFromZero);
  unary(t, "scalar / tensor", [](L x) { return -1.5 / x[0]; }, Values::AwayFromZero);
  unary(t, "neg", [](L x) { return neg(x[0]); });
  unary(t, "-tensor", [](L x) { return -x[0]; });
  unary(t, "abs", [](L x) { return abs(x[0]); }, Values::AwayFromZero);
  unary(t, "exp", [](L x) { return exp(x[0]); });
  unary(t, "log", [](L x) { return log(x[0]); }, Values::Positive);
  unary(t, "log1p", [](L x) { return log1p(x[0]); }, Values::Positive);
  unary(t, "sqrt", [](L x) { return sqrt(x[0]); }, Values::Positive);
  unary(t, "rsqrt", [](L x) { return rsqrt(x[0]); }, Values::Positive);
  unary(t, "pow 2.5", [](L x) { return pow(x[0], 2.5); }, Values::Positive);
  unary(t, "pow 3 (int exponent)", [](L x) { return pow(x[0], 3); });
  unary(t, "pow -1.5", [](L x) { return pow(x[0], -1.5); }, Values::Positive);
  unary(t, "pow 0", [](L x) { return pow(x[0], 0.0); });
  unary(t, "pow scalar base 2", [](L x) { return pow(Scalar(2.0), x[0]); });
  unary(t, "pow scalar base 0.5", [](L x) { return pow(Scalar(0.5), x[0]); });
  unary(t, "tanh", [](L x) { return tanh(x[0]); });
  unary(t, "sigmoid", [](L x) { return sigmoid(x[0]); });
  unary(t, "relu", [](L x) { return relu(x[0]); }, Values::AwayFromZero);
  unary(t, "gelu (erf)", [](L x) { return gelu(x[0]); });
  unary(t, "gelu (tanh)", [](L x) { return gelu(x[0], "tanh"); });
  unary(t, "sin", [](L x) { return sin(x[0]); });
  unary(t, "cos", [](L x) { return cos(x[0]); });
  unary(t, "expm1", [](L x) { return expm1(x[0]); });
  unary(t, "erf", [](L x) { return erf(x[0]); });
  unary(t, "erfinv", [](L x) { return erfinv(mul(tanh(x[0]), 0.9)); });
  unary(t, "log2", [](L x) { return log2(x[0]); }, Values::Positive);
  unary(t, "log10", [](L x) { return x[0].log10(); }, Values::Positive);
  unary(t, "floor (zero gradient)", [](L x) { return add(floor(x[0]), x[0]); });
  unary(t, "ceil (zero gradient)", [](L x) { return add(ceil(x[0]), x[0]); });
  unary(t, "round (zero gradient)", [](L x) { return add(round(x[0]), x[0]); });
  unary(t, "trunc (zero gradient)", [](L x) { return add(x[0].trunc(), x[0]); });
  unary(t, "sign (zero gradient)", [](L x) { return add(sign(x[0]), x[0]); }, Values::AwayFromZero);
  // AwayFromZero values have |x| >= 0.2, so bounds at +-0.1 and 0.15 are never within eps.
  unary(t, "clamp min", [](L x) { return clamp(x[0], -0.1, std::nullopt); }, Values::AwayFromZero);
  unary(t, "clamp max", [](L x) { return clamp(x[0], std::nullopt, 0.15); }, Values::AwayFromZero);
  unary(t, "clamp min and max", [](L x) { return clamp(x[0], -0.1, 0.1); }, Values::AwayFromZero);

  // where / masked_fill: the condition is a fixed mask, not an input.
  const Tensor cond = bools({true, false, false, true, false, true, true, false, true, true, false, false}, {3, 4});
  const Tensor cond4 = bools({false, true, true, false}, {4});
  t.push_back({"where", {any({3, 4}), any({3, 4})}, [cond](L x) { return where(cond, x[0], x[1]); }});
  t.push_back({"where [broadcast 3x1x4, 2x4, cond 4]", {any({3, 1, 4}), any({2, 4})},
               [cond4](L x) { return where(cond4, x[0], x[1]); }});
  t.push_back({"where [0-d other]", {any({3, 4}), any({})}, [cond](L x) { return where(cond, x[0], x[1]); }});
  t.push_back({"where [0-d input]", {any({}), any({3, 4})}, [cond](L x) { return where(cond, x[0], x[1]); }});
  t.push_back({"where [transposed, step-sliced]", {any({3, 4}).transposed(), any({3, 4}).step_sliced()},
               [cond](L x) { return where(cond, x[0], x[1]); }});
  t.push_back({"where [cond 3x4 broadcasts both: 4 and 0-d]", {any({4}), any({})},
               [cond](L x) { return where(cond, x[0], x[1]); }});
  t.push_back({"where scalar other", {any({3, 4})}, [cond](L x) { return where(cond, x[0], 0.5); }});
  t.push_back({"masked_fill [broadcast mask]", {any({3, 4})}, [cond4](L x) { return masked_fill(x[0], cond4, 0.25); }});
  t.push_back({"masked_fill [transposed]", {any({3, 4}).transposed()},
               [cond](L x) { return x[0].masked_fill(cond, -1.0); }});
}

void reduction_rows(Table& t) {
  t.push_back({"sum all", {any({2, 3, 2})}, [](L x) { return sum(x[0]); }});
  t.push_back({"sum dim 1", {any({2, 3, 2})}, [](L x) { return sum(x[0], {1}); }});
  t.push_back({"sum dims {0,2} keepdim", {any({2, 3, 2})}, [](L x) { return sum(x[0], {0, 2}, true); }});
  t.push_back({"sum dim -1 keepdim", {any({3, 4})}, [](L x) { return x[0].sum({-1}, true); }});
  t.push_back({"sum [transposed]", {any({3, 4}).transposed()}, [](L x) { return sum(x[0], {0}); }});
  t.push_back({"sum all [step-sliced]", {any({2, 3, 2}).step_sliced()}, [](L x) { return x[0].sum(); }});
  t.push_back({"mean all", {any({2, 3, 2})}, [](L x) { return mean(x[0]); }});
  t.push_back({"mean dim 1", {any({2, 3, 2})}, [](L x) { return mean(x[0], {1}); }});
  t.push_back({"mean dims {2,0} keepdim", {any({2, 3, 2})}, [](L x) { return mean(x[0], {2, 0}, true); }});
  t.push_back({"mean [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].mean({1}); }});
  t.push_back({"mean [step-sliced] keepdim", {any({2, 3, 2}).step_sliced()}, [](L x) { return mean(x[0], {-1}, true); }});

  t.push_back({"sum of 0-d", {any({})}, [](L x) { return sum(x[0]); }});
  t.push_back({"mean of 0-d", {any({})}, [](L x) { return x[0].mean(); }});
  t.push_back({"prod of 0-d", {any({})}, [](L x) { return prod(x[0]); }});
  t.push_back({"amax of 0-d", {any({})}, [](L x) { return amax(x[0]); }});
  t.push_back({"max(dim 0) values of 0-d", {any({})}, [](L x) { return max(x[0], 0).first; }});
  t.push_back({"softmax of 0-d", {any({})}, [](L x) { return softmax(x[0], 0) * x[0]; }});
  t.push_back({"prod all", {any({2, 3})}, [](L x) { return prod(x[0]); }});
  t.push_back({"prod dim 1", {any({3, 4})}, [](L x) { return prod(x[0], 1); }});
  t.push_back({"prod dim 0 keepdim", {any({3, 4})}, [](L x) { return prod(x[0], 0, true); }});
  t.push_back({"prod [transposed]", {any({3, 4}).transposed()}, [](L x) { return prod(x[0], 1); }});
  t.push_back({"prod [step-sliced]", {any({2, 3, 2}).step_sliced()}, [](L x) { return prod(x[0], -1); }});
  // Row 0: no zero, row 1: one zero, row 2: two zeros. prod is multilinear, so central differences
  // are exact even at the zeros.
  const Tensor with_zeros =
      tensor<double>({1.5, -0.7, 2.0, 0.9, 0.8, 0.0, -1.3, 1.1, 0.0, 1.2, 0.0, -0.6}, Shape{3, 4});
  t.push_back({"prod dim 1 with zeros", {fixed(with_zeros)}, [](L x) { return prod(x[0], 1); }});
  t.push_back({"prod dim 1 keepdim with zeros [transposed]", {fixed(with_zeros.t()).transposed()},
               [](L x) { return prod(x[0], 0, true); }});
  t.push_back({"prod all with one zero", {fixed(with_zeros.narrow(0, 0, 2))}, [](L x) { return prod(x[0]); }});
  t.push_back({"prod all with two zeros", {fixed(with_zeros.narrow(0, 1, 2))}, [](L x) { return prod(x[0]); }});

  for (bool unbiased : {true, false}) {
    const std::string u = unbiased ? " unbiased" : " biased";
    t.push_back({"var all" + u, {any({3, 4})}, [unbiased](L x) { return var(x[0], {}, unbiased); }});
    t.push_back({"var dim 1 keepdim" + u, {any({3, 4})}, [unbiased](L x) { return var(x[0], {1}, unbiased, true); }});
    t.push_back({"var dims {0,2}" + u, {any({2, 3, 2})}, [unbiased](L x) { return var(x[0], {0, 2}, unbiased); }});
    t.push_back({"var [transposed]" + u, {any({3, 4}).transposed()}, [unbiased](L x) { return var(x[0], {0}, unbiased); }});
    t.push_back({"std all" + u, {any({3, 4})}, [unbiased](L x) { return chorus::std(x[0], {}, unbiased); }});
    t.push_back({"std dim 0" + u, {any({3, 4})}, [unbiased](L x) { return chorus::std(x[0], {0}, unbiased); }});
    t.push_back({"std dims {1,2} keepdim" + u, {any({2, 3, 2})},
                 [unbiased](L x) { return chorus::std(x[0], {1, 2}, unbiased, true); }});
    t.push_back({"std [step-sliced]" + u, {any({3, 4}).step_sliced()},
                 [unbiased](L x) { return chorus::std(x[0], {-1}, unbiased); }});
  }

  // Random float64 values are distinct, so the extremes are unique (ties are tested separately).
  t.push_back({"amax all", {any({3, 4})}, [](L x) { return amax(x[0]); }});
  t.push_back({"amax dim 1", {any({3, 4})}, [](L x) { return amax(x[0], {1}); }});
  t.push_back({"amax dims {0,2} keepdim", {any({2, 3, 2})}, [](L x) { return amax(x[0], {0, 2}, true); }});
  t.push_back({"amax [transposed]", {any({3, 4}).transposed()}, [](L x) { return amax(x[0], {0}); }});
  t.push_back({"amin all", {any({3, 4})}, [](L x) { return amin(x[0]); }});
  t.push_back({"amin dim 0 keepdim", {any({3, 4})}, [](L x) { return amin(x[0], {0}, true); }});
  t.push_back({"amin [step-sliced]", {any({2, 3, 2}).step_sliced()}, [](L x) { return amin(x[0], {1, 2}); }});
  t.push_back({"max()", {any({3, 4})}, [](L x) { return max(x[0]); }});
  t.push_back({"max() [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].max(); }});
  t.push_back({"min()", {any({3, 4})}, [](L x) { return min(x[0]); }});
  t.push_back({"min() [step-sliced]", {any({3, 4}).step_sliced()}, [](L x) { return x[0].min(); }});
  t.push_back({"max(dim) values", {any({3, 4})}, [](L x) { return max(x[0], 1).first; }});
  t.push_back({"max(dim, keepdim) values", {any({2, 3, 2})}, [](L x) { return max(x[0], 0, true).first; }});
  t.push_back({"max(dim) values [transposed]", {any({3, 4}).transposed()}, [](L x) { return max(x[0], -1).first; }});
  t.push_back({"min(dim) values", {any({3, 4})}, [](L x) { return min(x[0], 0).first; }});
  t.push_back({"min(dim, keepdim) values [step-sliced]", {any({2, 3, 2}).step_sliced()},
               [](L x) { return min(x[0], 2, true).first; }});

  const double inf = std::numeric_limits<double>::infinity();
  t.push_back({"norm p=1", {nonzero({3, 4})}, [](L x) { return norm(x[0], 1.0); }});
  t.push_back({"norm p=2", {any({3, 4})}, [](L x) { return norm(x[0]); }});
  t.push_back({"norm p=3", {nonzero({3, 4})}, [](L x) { return norm(x[0], 3.0); }});
  t.push_back({"norm p=inf", {nonzero({3, 4})}, [inf](L x) { return norm(x[0], inf); }});
  t.push_back({"norm p=1 dim 1", {nonzero({3, 4})}, [](L x) { return norm(x[0], 1.0, {1}); }});
  t.push_back({"norm p=2 dim 1", {any({3, 4})}, [](L x) { return norm(x[0], 2.0, {1}); }});
  t.push_back({"norm p=2 dims {0,2} keepdim", {any({2, 3, 2})}, [](L x) { return norm(x[0], 2.0, {0, 2}, true); }});
  t.push_back({"norm p=3 dim 0 keepdim", {nonzero({3, 4})}, [](L x) { return norm(x[0], 3.0, {0}, true); }});
  t.push_back({"norm p=inf dim 1", {nonzero({3, 4})}, [inf](L x) { return norm(x[0], inf, {1}); }});
  t.push_back({"norm p=2 [transposed]", {any({3, 4}).transposed()}, [](L x) { return norm(x[0], 2.0, {1}); }});
  t.push_back({"norm p=1 [step-sliced]", {nonzero({3, 4}).step_sliced()}, [](L x) { return norm(x[0], 1.0, {0}); }});
  t.push_back({"norm p=3 [transposed]", {nonzero({3, 4}).transposed()}, [](L x) { return norm(x[0], 3.0); }});

  t.push_back({"logsumexp dim 1", {any({3, 4})}, [](L x) { return logsumexp(x[0], {1}); }});
  t.push_back({"logsumexp dims {0,1} keepdim", {any({3, 4})}, [](L x) { return logsumexp(x[0], {0, 1}, true); }});
  t.push_back({"logsumexp [transposed]", {any({3, 4}).transposed()}, [](L x) { return logsumexp(x[0], {-1}); }});
  t.push_back({"logsumexp [step-sliced]", {any({2, 3, 2}).step_sliced()}, [](L x) { return logsumexp(x[0], {1}); }});
  for (bool is_log : {false, true}) {
    const std::string n = is_log ? "log_softmax" : "softmax";
    auto sm = [is_log](const Tensor& x, int64_t dim) { return is_log ? log_softmax(x, dim) : softmax(x, dim); };
    t.push_back({n + " dim 1", {any({3, 4})}, [sm](L x) { return sm(x[0], 1); }});
    t.push_back({n + " dim 0", {any({3, 4})}, [sm](L x) { return sm(x[0], 0); }});
    t.push_back({n + " dim 1 of 3-D", {any({2, 3, 2})}, [sm](L x) { return sm(x[0], 1); }});
    t.push_back({n + " 1-D", {any({5})}, [sm](L x) { return sm(x[0], 0); }});
    t.push_back({n + " [transposed]", {any({3, 4}).transposed()}, [sm](L x) { return sm(x[0], -1); }});
    t.push_back({n + " [step-sliced]", {any({2, 3, 2}).step_sliced()}, [sm](L x) { return sm(x[0], 2); }});
  }
}

void linalg_rows(Table& t) {
  auto mat = [](L x) { return matmul(x[0], x[1]); };
  t.push_back({"matmul 1-D @ 1-D", {any({4}), any({4})}, mat});
  t.push_back({"matmul 2-D @ 2-D", {any({3, 4}), any({4, 2})}, mat});
  t.push_back({"matmul 2-D @ 1-D", {any({3, 4}), any({4})}, mat});
  t.push_back({"matmul 1-D @ 2-D", {any({4}), any({4, 2})}, mat});
  t.push_back({"matmul batched broadcast", {any({2, 1, 3, 4}), any({3, 4, 2})}, mat});
  t.push_back({"matmul batched broadcast (other side)", {any({3, 2}), any({2, 1, 2, 3})}, mat});
  t.push_back({"matmul N-D @ 2-D", {any({2, 3, 4}), any({4, 2})}, mat});
  t.push_back({"matmul N-D @ 1-D", {any({2, 3, 4}), any({4})}, mat});
  t.push_back({"matmul 1-D @ N-D", {any({4}), any({2, 4, 3})}, mat});
  // Batch dims no single stride describes ([Batched products of strided views], autograd/ops/linalg.cpp):
  // attention's heads (q [B, T, H, d] permuted to [B, H, T, d], k to [B, H, d, T]), a broadcast
  // operand beside a permuted one, and five dims whose batch merges only in its innermost dim.
  t.push_back({"matmul permuted heads", {any({2, 3, 2, 4}), any({2, 3, 2, 4})},
               [](L x) { return matmul(permute(x[0], {0, 2, 1, 3}), permute(x[1], {0, 2, 3, 1})); }});
  t.push_back({"matmul permuted @ broadcast", {any({2, 3, 2, 4}), any({2, 1, 4, 3})},
               [](L x) { return matmul(permute(x[0], {0, 2, 1, 3}), x[1]); }});
  t.push_back({"matmul 5-D, batch merged in its last dim only", {any({3, 2, 2, 2, 4}), any({2, 3, 2, 4, 3})},
               [](L x) { return matmul(permute(x[0], {1, 0, 2, 3, 4}), x[1]); }});
  t.push_back({"matmul [transposed, transposed]", {any({3, 4}).transposed(), any({4, 2}).transposed()}, mat});
  t.push_back({"matmul 1-D @ 1-D [step-sliced]", {any({4}).step_sliced(), any({4}).step_sliced()}, mat});
  t.push_back({"matmul N-D @ 2-D [step-sliced, transposed]", {any({2, 3, 4}).step_sliced(), any({4, 2}).transposed()},
               mat});
  t.push_back({"matmul batched [transposed, step-sliced]", {any({2, 3, 4}).transposed(), any({2, 4, 2}).step_sliced()},
               mat});
  t.push_back({"mm", {any({3, 4}), any({4, 2})}, [](L x) { return mm(x[0], x[1]); }});
  t.push_back({"mm [transposed, step-sliced]", {any({3, 4}).transposed(), any({4, 2}).step_sliced()},
               [](L x) { return x[0].mm(x[1]); }});
  t.push_back({"bmm", {any({2, 3, 4}), any({2, 4, 2})}, [](L x) { return bmm(x[0], x[1]); }});
  t.push_back({"bmm [transposed, step-sliced]", {any({2, 3, 4}).transposed(), any({2, 4, 2}).step_sliced()},
               [](L x) { return bmm(x[0], x[1]); }});
  t.push_back({"addmm", {any({3, 2}), any({3, 4}), any({4, 2})}, [](L x) { return addmm(x[0], x[1], x[2]); }});
  t.push_back({"addmm beta=0.5 alpha=2 [bias broadcast 2]", {any({2}), any({3, 4}), any({4, 2})},
               [](L x) { return addmm(x[0], x[1], x[2], 0.5, 2.0); }});
  t.push_back({"addmm beta=-1 alpha=0.3 [0-d bias]", {any({}), any({3, 4}), any({4, 2})},
               [](L x) { return addmm(x[0], x[1], x[2], -1.0, 0.3); }});
  t.push_back({"addmm [bias 3x1]", {any({3, 1}), any({3, 4}), any({4, 2})}, [](L x) { return addmm(x[0], x[1], x[2], 2, 1); }});
  t.push_back({"addmm [transposed, step-sliced, transposed]",
               {any({3, 2}).transposed(), any({3, 4}).step_sliced(), any({4, 2}).transposed()},
               [](L x) { return addmm(x[0], x[1], x[2], 1.5, -0.5); }});
}

void view_rows(Table& t) {
  t.push_back({"view", {any({3, 4})}, [](L x) { return x[0].view({2, 6}); }});
  t.push_back({"view -1", {any({2, 3, 2})}, [](L x) { return view(x[0], {-1, 3}); }});
  t.push_back({"view [step-sliced, compatible]", {any({2, 3, 2}).step_sliced()}, [](L x) { return x[0].view({6, 2}); }});
  t.push_back({"reshape", {any({3, 4})}, [](L x) { return reshape(x[0], {4, 3}); }});
  t.push_back({"reshape [transposed: copies]", {any({3, 4}).transposed()}, [](L x) { return x[0].reshape({-1}); }});
  t.push_back({"permute", {any({2, 3, 2})}, [](L x) { return permute(x[0], {2, 0, 1}); }});
  t.push_back({"permute [step-sliced]", {any({2, 3, 2}).step_sliced()}, [](L x) { return x[0].permute({1, 2, 0}); }});
  t.push_back({"transpose", {any({2, 3, 2})}, [](L x) { return transpose(x[0], 0, 2); }});
  t.push_back({"transpose [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].transpose(1, 0); }});
  t.push_back({"t", {any({3, 4})}, [](L x) { return chorus::t(x[0]); }});
  t.push_back({"t 1-D", {any({4})}, [](L x) { return x[0].t(); }});
  t.push_back({"narrow", {any({3, 4})}, [](L x) { return narrow(x[0], 1, 1, 2); }});
  t.push_back({"narrow negative start [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].narrow(0, -3, 2); }});
  t.push_back({"slice step 2", {any({3, 7})}, [](L x) { return slice(x[0], 1, 1, 7, 2); }});
  t.push_back({"slice step 3 open end", {any({7, 2})}, [](L x) { return x[0].slice(0, std::nullopt, std::nullopt, 3); }});
  t.push_back({"slice negative bounds [transposed]", {any({3, 5}).transposed()}, [](L x) { return slice(x[0], 0, -4, -1, 2); }});
  t.push_back({"slice [step-sliced]", {any({3, 4}).step_sliced()}, [](L x) { return slice(x[0], 1, 1, std::nullopt, 2); }});
  t.push_back({"select", {any({3, 4})}, [](L x) { return select(x[0], 1, 2); }});
  t.push_back({"select negative index", {any({2, 3, 2})}, [](L x) { return x[0].select(0, -1); }});
  t.push_back({"operator[] [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0][1]; }});
  t.push_back({"select to 0-d", {any({4})}, [](L x) { return x[0].select(0, 2) * x[0]; }});
  t.push_back({"chained views", {any({2, 3, 4}).step_sliced()},
               [](L x) { return x[0].transpose(0, 2).narrow(0, 1, 2).select(2, 1).unsqueeze(0).expand({2, 2, 3}); }});
  t.push_back({"squeeze", {any({3, 1, 4, 1})}, [](L x) { return squeeze(x[0]); }});
  t.push_back({"squeeze dim", {any({3, 1, 4})}, [](L x) { return squeeze(x[0], 1); }});
  t.push_back({"squeeze dim of size > 1", {any({3, 4})}, [](L x) { return x[0].squeeze(0); }});
  t.push_back({"unsqueeze", {any({3, 4})}, [](L x) { return unsqueeze(x[0], 1); }});
  t.push_back({"unsqueeze -1 [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].unsqueeze(-1); }});
  t.push_back({"unsqueeze [step-sliced]", {any({3, 4}).step_sliced()}, [](L x) { return x[0].unsqueeze(0); }});
  t.push_back({"expand", {any({3, 1})}, [](L x) { return expand(x[0], {2, 3, 4}); }});
  t.push_back({"expand -1", {any({1, 4})}, [](L x) { return x[0].expand({3, -1}); }});
  t.push_back({"expand 0-d", {any({})}, [](L x) { return x[0].expand({2, 3}); }});
  t.push_back({"expand [step-sliced]", {any({3, 1, 2}).step_sliced()}, [](L x) { return x[0].expand({2, 3, 4, 2}); }});
  t.push_back({"expand_as", {any({4})}, [](L x) { return x[0].expand_as(zeros({3, 4}, x[0].options())); }});
  t.push_back({"flatten", {any({2, 3, 2})}, [](L x) { return flatten(x[0]); }});
  t.push_back({"flatten 1..2", {any({2, 3, 2})}, [](L x) { return x[0].flatten(1); }});
  t.push_back({"flatten 0-d", {any({})}, [](L x) { return x[0].flatten(); }});
  t.push_back({"flatten [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].flatten(); }});
  t.push_back({"as_strided", {any({8})}, [](L x) { return as_strided(x[0], {2, 3}, {3, 1}); }});
  t.push_back({"as_strided overlapping windows", {any({8})}, [](L x) { return as_strided(x[0], {3, 4}, {2, 1}); }});
  t.push_back({"as_strided offset and transposed strides", {any({3, 4})},
               [](L x) { return x[0].as_strided({2, 3}, {1, 4}, 1); }});
  t.push_back({"as_strided of a view with a storage offset", {any({8})},
               [](L x) { return as_strided(x[0].narrow(0, 2, 6), {2, 3}, {3, 1}); }});
  t.push_back({"as_strided with an explicit offset into a narrowed view", {any({8})},
               [](L x) { return x[0].narrow(0, 2, 6).as_strided({2, 2}, {2, 1}, 3); }});
  t.push_back({"as_strided stride 0", {any({4})}, [](L x) { return as_strided(x[0], {3, 2}, {0, 2}); }});
  t.push_back({"contiguous [transposed]", {any({3, 4}).transposed()}, [](L x) { return contiguous(x[0]); }});
  t.push_back({"contiguous [step-sliced]", {any({3, 4}).step_sliced()}, [](L x) { return x[0].contiguous(); }});
  t.push_back({"contiguous (already)", {any({3, 4})}, [](L x) { return x[0].contiguous() * 2.0; }});
  t.push_back({"clone", {any({3, 4})}, [](L x) { return clone(x[0]); }});
  t.push_back({"clone [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].clone(); }});
  // float32 holds ~7 digits: a larger step keeps the rounding error far below the tolerance.
  const GradcheckOptions f32{.eps = 1e-2, .atol = 1e-4, .rtol = 1e-3};
  t.push_back({"to float32", {any({3, 4})}, [](L x) { return x[0].to(kFloat32); }, f32});
  t.push_back({"to float32, square, to float64", {any({3, 4})},
               [](L x) { Tensor y = to_dtype(x[0], kFloat32); return (y * y).to(kFloat64); }, f32});
  t.push_back({"to float32 [transposed]", {any({3, 4}).transposed()}, [](L x) { return x[0].to(kFloat32) * 3.0; }, f32});
  t.push_back({"to float64 (no-op)", {any({3, 4})}, [](L x) { return x[0].to(kFloat64) * x[0]; }});
}

void join_index_rows(Table& t) {
  const Tensor cond4 = bools({false, true, true, false}, {4});
  t.push_back({"cat dim 0", {any({2, 3}), any({1, 3}), any({3, 3})}, [](L x) { return cat({x[0], x[1], x[2]}, 0); }});
  t.push_back({"cat dim 1", {any({3, 2}), any({3, 1})}, [](L x) { return cat({x[0], x[1]}, 1); }});
  t.push_back({"cat dim -1 of 3-D, same input twice", {any({2, 2, 2}), any({2, 2, 1})},
               [](L x) { return cat({x[0], x[1], x[0]}, -1); }});
  t.push_back({"cat [transposed, step-sliced]", {any({3, 4}).transposed(), any({2, 4}).step_sliced()},
               [](L x) { return cat({x[0], x[1]}, 0); }});
  t.push_back({"stack dim 0", {any({3, 2}), any({3, 2}), any({3, 2})}, [](L x) { return stack({x[0], x[1], x[2]}, 0); }});
  t.push_back({"stack dim 1", {any({3, 2}), any({3, 2})}, [](L x) { return stack({x[0], x[1]}, 1); }});
  t.push_back({"stack dim -1 [transposed, step-sliced]", {any({3, 2}).transposed(), any({3, 2}).step_sliced()},
               [](L x) { return stack({x[0], x[1]}, -1); }});
  // Every piece is used, with its own weight and out of order, so a gradient routed to the wrong
  // piece (or dropped) changes the Jacobian.
  t.push_back({"split sizes {2,1,2}", {any({5, 3})}, [](L x) {
                 TensorList p = split(x[0], std::vector<int64_t>{2, 1, 2}, 0);
                 REQUIRE(p.size() == 3);
                 return cat({p[2] * 3.0, p[0], p[1] * -2.0}, 0);
               }});
  t.push_back({"split size 2 (uneven)", {any({5, 3})}, [](L x) {
                 TensorList p = split(x[0], 2, 0);
                 REQUIRE(p.size() == 3);
                 return cat({p[1] * 2.0, p[2] * 0.5, exp(p[0])}, 0);
               }});
  t.push_back({"split dim 1 [transposed]", {any({3, 5}).transposed()}, [](L x) {
                 TensorList p = split(x[0], 3, 1);
                 REQUIRE(p.size() == 2);
                 return cat({p[1] * -1.5, p[0] * p[0]}, 1);
               }});
  t.push_back({"split, one piece used", {any({4, 3})}, [](L x) { return split(x[0], 2, 0)[1] * 3.0; }});
  t.push_back({"split sizes {2,0,3}: an empty piece", {any({5, 2})}, [](L x) {
                 TensorList p = split(x[0], std::vector<int64_t>{2, 0, 3}, 0);
                 REQUIRE(p.size() == 3);
                 REQUIRE(p[1].numel() == 0);
                 return cat({p[2] * 2.0, p[1], p[0] * p[0]}, 0);
               }});
  t.push_back({"chunk 3 of 5", {any({3, 5})}, [](L x) {
                 TensorList p = chunk(x[0], 3, 1);
                 REQUIRE(p.size() == 3);
                 return cat({p[2] * 4.0, sin(p[1]), p[0] * -1.0}, 1);
               }});
  t.push_back({"chunk dim 0 [step-sliced]", {any({4, 3}).step_sliced()}, [](L x) {
                 TensorList p = chunk(x[0], 2, 0);
                 REQUIRE(p.size() == 2);
                 return p[0] * 2.0 + p[1] * p[1];
               }});

  const Tensor rows = longs({2, 0, 2, 3}, {4});  // row 2 twice, row 1 never
  t.push_back({"index_select dim 0 (repeats)", {any({4, 3})}, [rows](L x) { return index_select(x[0], 0, rows); }});
  t.push_back({"index_select dim 1 negative", {any({3, 4})},
               [d = g_table_device](L x) { return x[0].index_select(1, longs_on(d, {-1, 0, -1}, {3})); }});
  t.push_back({"index_select [transposed]", {any({4, 3}).transposed()}, [rows](L x) { return index_select(x[0], 0, rows); }});
  t.push_back({"index_select 1-D int32 index", {any({5})},
               [d = g_table_device](L x) { return index_select(x[0], 0, tensor<int32_t>({4, 1, 1}, std::nullopt, {.dtype = kInt32, .device = d})); }});
  const Tensor gidx = longs({0, 0, 3, 1, 2, 2}, {3, 2});
  t.push_back({"gather dim 1 (repeats)", {any({3, 4})}, [gidx](L x) { return gather(x[0], 1, gidx); }});
  t.push_back({"gather dim 0", {any({4, 2})}, [d = g_table_device](L x) { return x[0].gather(0, longs_on(d, {3, 0, 3, 1, 0, 0}, {3, 2})); }});
  t.push_back({"gather [step-sliced]", {any({3, 4}).step_sliced()}, [gidx](L x) { return gather(x[0], 1, gidx); }});
  // scatter: indices unique per row, so the result does not depend on write order.
  const Tensor sidx = longs({1, 3, 0, 2, 3, 0}, {3, 2});
  t.push_back({"scatter (self and src)", {any({3, 4}), any({3, 2})}, [sidx](L x) { return scatter(x[0], 1, sidx, x[1]); }});
  t.push_back({"scatter dim 0", {any({4, 2}), any({2, 2})},
               [d = g_table_device](L x) { return scatter(x[0], 0, longs_on(d, {3, 0, 1, 3}, {2, 2}), x[1]); }});
  t.push_back({"scatter [transposed, step-sliced]", {any({3, 4}).transposed(), any({3, 2}).step_sliced()},
               [sidx](L x) { return scatter(x[0], 1, sidx, x[1]); }});
  t.push_back({"scatter src larger than index", {any({3, 4}), any({3, 3})},
               [sidx](L x) { return scatter(x[0], 1, sidx, x[1]); }});
  t.push_back({"scatter scalar value", {any({3, 4})}, [sidx](L x) { return scatter(x[0], 1, sidx, 0.75); }});
  const Tensor dup = longs({1, 1, 0, 2, 3, 3}, {3, 2});  // duplicates accumulate
  t.push_back({"scatter_add (duplicates)", {any({3, 4}), any({3, 2})}, [dup](L x) { return scatter_add(x[0], 1, dup, x[1]); }});
  t.push_back({"scatter_add [step-sliced, transposed]", {any({3, 4}).step_sliced(), any({3, 2}).transposed()},
               [dup](L x) { return scatter_add(x[0], 1, dup, x[1]); }});
  t.push_back({"scatter_add src larger than index", {any({3, 4}), any({3, 3})},
               [dup](L x) { return scatter_add(x[0], 1, dup, x[1]); }});
  t.push_back({"index by int64 tensor (2-D, repeats)", {any({4, 3})},
               [d = g_table_device](L x) { return x[0].index(longs_on(d, {0, 2, 2, 3}, {2, 2})); }});
  t.push_back({"index by negative int64 indices", {any({4, 3})}, [d = g_table_device](L x) { return x[0].index(longs_on(d, {-1, 0, -1}, {3})); }});
  t.push_back({"index by int tensor [transposed]", {any({4, 3}).transposed()}, [rows](L x) { return index(x[0], rows); }});
  t.push_back({"index by bool mask", {any({4, 3})},
               [d = g_table_device](L x) { return index(x[0], bools_on(d, {true, false, true, true}, {4})); }});
  t.push_back({"index by 2-D bool mask", {any({2, 3, 2})},
               [d = g_table_device](L x) { return x[0].index(bools_on(d, {false, true, true, true, false, true}, {2, 3})); }});
  t.push_back({"index by bool mask [step-sliced]", {any({4, 3}).step_sliced()},
               [d = g_table_device](L x) { return index(x[0], bools_on(d, {false, true, false, true}, {4})); }});

  // In-place ops on non-leaves (clones or results of ops that save nothing).
  t.push_back({"copy_ into a clone (broadcast src)", {any({3, 4}), any({4})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.copy_(x[1]);
                 return c * x[0];  // the first use of x[0] was overwritten: only this one counts
               }});
  t.push_back({"copy_ [transposed dst, step-sliced src]", {any({3, 4}).transposed(), any({3, 4}).step_sliced()},
               [](L x) {
                 Tensor c = x[0] * 2.0;
                 copy_(c, x[1]);
                 return c + x[0];
               }});
  t.push_back({"add_ alpha on a non-leaf", {any({3, 4}), any({3, 4})}, [](L x) {
                 Tensor c = x[0] * 1.5;
                 c.add_(x[1], 2.0);
                 return c * x[1];
               }});
  t.push_back({"add_ broadcast other", {any({3, 4}), any({4})}, [](L x) {
                 Tensor c = x[0] + 1.0;
                 add_(c, x[1]);
                 return c;
               }});
  t.push_back({"add_ scalar", {any({3, 4})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.add_(0.5);
                 return c * x[0];
               }});
  t.push_back({"sub_ alpha", {any({3, 4}), any({})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.sub_(x[1], 3.0);
                 return c;
               }});
  t.push_back({"mul_ on a non-leaf", {any({3, 4}), any({3, 4})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.mul_(x[1]);
                 return c;
               }});
  t.push_back({"mul_ broadcast, then reused", {any({3, 4}), any({4})}, [](L x) {
                 Tensor c = x[0] + 0.0;
                 mul_(c, x[1]);
                 return c * c;
               }});
  t.push_back({"mul_ [transposed, step-sliced]", {any({3, 4}).transposed(), any({3, 4}).step_sliced()}, [](L x) {
                 Tensor c = x[0].clone();
                 c.mul_(x[1]);
                 return c;
               }});
  t.push_back({"mul_ scalar", {any({3, 4})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.mul_(-2.5);
                 return c;
               }});
  t.push_back({"div_ scalar", {any({3, 4})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.div_(4.0);
                 return c * x[0];
               }});
  t.push_back({"div_ by a constant tensor", {any({3, 4})}, [d = g_table_device](L x) {
                 Tensor c = x[0].clone();
                 c.div_(tensor<double>({2.0, -4.0, 0.5, 8.0}, std::nullopt, {.dtype = kFloat64, .device = d}));
                 return c;
               }});
  t.push_back({"clamp_", {nonzero({3, 4})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.clamp_(-0.1, 0.15);
                 return c * x[0];
               }});
  t.push_back({"masked_fill_", {any({3, 4})}, [cond4](L x) {
                 Tensor c = x[0] * 2.0;
                 c.masked_fill_(cond4, 0.5);
                 return c;
               }});
  t.push_back({"fill_ then reuse", {any({3, 4})}, [](L x) {
                 Tensor c = x[0] * 2.0;
                 c.fill_(1.5);
                 return c * x[0];
               }});
  t.push_back({"zero_ plus add_", {any({3, 4}), any({3, 4})}, [](L x) {
                 Tensor c = x[0].clone();
                 c.zero_();
                 c.add_(x[1] * x[0]);
                 return c;
               }});
}

Table op_table(Device device = kCPU) {
  g_table_device = device;
  Table t;
  pointwise_rows(t);
  reduction_rows(t);
  linalg_rows(t);
  view_rows(t);
  join_index_rows(t);
  g_table_device = kCPU;
  return t;
}

TensorList make_inputs(const OpRow& row, Generator& gen, Device device = kCPU) {
  TensorList inputs;
  for (const Arg& a : row.args) inputs.push_back(make_input(a, gen, device));
  return inputs;
}

// Output and input gradients of one row on `device`, from the inputs seeded by `seed` and an
// output gradient seeded the same way: everything brought back to the CPU for comparison.
TensorList forward_backward(const OpRow& row, uint64_t seed, Device device) {
  Generator gen(seed);
  TensorList inputs = make_inputs(row, gen, device);
  Tensor out = row.f(inputs);
  REQUIRE(out.device() == device);
  Tensor grad_out = randn(out.sizes(), {.dtype = out.dtype()}, &gen).to(device);
  out.backward(grad_out);
  TensorList results{out.detach().cpu()};
  for (const Tensor& x : inputs) {
    REQUIRE(x.grad().defined());
    REQUIRE(x.grad().device() == device);
    results.push_back(x.grad().cpu());
  }
  return results;
}

}  // namespace

TEST_CASE("every differentiable op's gradient matches central finite differences", "[autograd][gradcheck]") {
  Generator gen(20240611);
  const Table table = op_table();
  REQUIRE(table.size() > 300);
  for (const OpRow& row : table) {
    INFO("op: " << row.name);
    TensorList inputs = make_inputs(row, gen);
    CHECK(gradcheck(row.f, inputs, row.options));
  }
}

TEST_CASE("every op's backward handles a non-contiguous incoming gradient", "[autograd][gradcheck]") {
  Generator gen(77);
  for (const OpRow& row : op_table()) {
    INFO("op: " << row.name);
    TensorList inputs = make_inputs(row, gen);
    int64_t out_dim = 0;
    {
      NoGradGuard no_grad;
      out_dim = row.f(inputs).dim();
    }
    const Fn f = row.f;
    if (out_dim >= 2) {
      INFO("output transposed: the op's backward gets a strided gradient");
      CHECK(gradcheck([f](L x) { return f(x).transpose(0, -1); }, inputs, row.options));
    }
    if (out_dim >= 1) {
      INFO("output summed over dim 0: the op's backward gets a stride-0 (expanded) gradient");
      CHECK(gradcheck([f](L x) { return f(x).sum({0}); }, inputs, row.options));
    }
  }
}

// The device seam: the same table on the sim device (its streams run the cpu kernels on worker
// threads over memory the host cannot read) gives exactly the CPU's outputs and gradients. Inputs
// keep their layouts (transposed, step-sliced) on the device; the masks and indices the rows
// capture are made there too.
TEST_CASE("every op gives the CPU's outputs and gradients on the sim device", "[autograd][sim]") {
  const Table cpu_rows = op_table(kCPU);
  const Table sim_rows = op_table(Device::sim(0));
  REQUIRE(cpu_rows.size() == sim_rows.size());
  const uint64_t tasks_before = sim::tasks_run();
  for (size_t i = 0; i < cpu_rows.size(); ++i) {
    INFO("op: " << cpu_rows[i].name);
    const TensorList expected = forward_backward(cpu_rows[i], 1000 + i, kCPU);
    const TensorList got = forward_backward(sim_rows[i], 1000 + i, Device::sim(0));
    REQUIRE(got.size() == expected.size());
    for (size_t k = 0; k < got.size(); ++k) {
      INFO((k == 0 ? std::string("output") : "gradient of input " + std::to_string(k - 1)));
      REQUIRE(got[k].sizes() == expected[k].sizes());
      CHECK(equal(got[k], expected[k]));
    }
  }
  CHECK(sim::tasks_run() > tasks_before + cpu_rows.size());  // the work ran on sim streams
}

TEST_CASE("gradcheck reports a wrong gradient, naming the input and the entry", "[autograd][gradcheck]") {
  Generator gen(3);
  Tensor x = testing::leaf({3}, gen, Values::AwayFromZero);
  // x * detach(x) has derivative 2x, but autograd sees only one factor: x.
  REQUIRE_THROWS_MATCHES(gradcheck([](L in) { return in[0] * in[0].detach(); }, {x}), Error,
                         testing::error_containing({"gradcheck: Jacobian mismatch", "input 0"}));
  // Consistent gradients pass.
  CHECK(gradcheck([](L in) { return in[0] * in[0]; }, {x}));
}

TEST_CASE("gradcheck refuses float32 inputs that require grad", "[autograd][gradcheck]") {
  Tensor x = ones({2});
  x.requires_grad_();
  REQUIRE_THROWS_MATCHES(gradcheck([](L in) { return in[0] * 2.0; }, {x}), Error,
                         testing::error_containing({"gradcheck", "float64"}));
}

TEST_CASE("split's pieces share one SplitBackward, whose gradient joins theirs", "[autograd][split]") {
  // One node for every piece ([One node for a split], autograd/ops/index.cpp). With a SliceBackward
  // per piece, an LSTM's backward made a whole-size zero gradient per time step (quadratic in the
  // sequence length); the values are gradcheck's business above.
  Tensor x = arange(24.0).reshape({6, 4});
  x.requires_grad_();
  const Tensor y = x * 1.0;
  const TensorList p = split(y, std::vector<int64_t>{1, 2, 3}, 0);
  REQUIRE(p.size() == 3);
  for (const Tensor& piece : p) {
    REQUIRE(piece.grad_fn() != nullptr);
    CHECK(piece.grad_fn().get() == p[0].grad_fn().get());
    CHECK(piece.grad_fn()->name() == "SplitBackward");
    CHECK(piece.storage().get() == y.storage().get());  // views, not copies
  }
  const TensorList c = chunk(y, 2, 1);
  CHECK(c[0].grad_fn().get() == c[1].grad_fn().get());
  // Only the last piece used: the others' rows get zeros, the used rows the weights.
  (p[2] * 3.0).sum().backward();
  const Tensor expected = cat({zeros({3, 4}), full({3, 4}, 3.0)}, 0);
  CHECK(testing::same_values(x.grad(), expected));
  // Without grad, plain views.
  const TensorList q = split(arange(6.0), 2, 0);
  CHECK(q[0].grad_fn() == nullptr);
}

}  // namespace chorus
