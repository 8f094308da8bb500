// Elementwise ops: argument checks, broadcasting and type promotion, the kernel call, and each op's
// backward formula right below its forward. Gradients of broadcast inputs are reduced to the input's
// shape (and cast to its dtype) by the engine, once for all ops.
#include <cmath>

#include "autograd/ops/common.h"

namespace chorus {
namespace {

using namespace ops;
using kernels::BinaryOp;
using kernels::UnaryOp;

bool category_fits(DType result, DType out) {
  auto cat = [](DType d) { return d == DType::Bool ? 0 : is_floating(d) ? 2 : 1; };
  return cat(result) <= cat(out);
}

// [Half storage] (kernels/shared/pointwise_math.h): the elementwise kernels take float16/bfloat16 as
// stored and compute each element in float, so a half op on half tensors runs on them directly and
// gives a half output: one pass, no float32 temporaries, half tensors saved for backward. The bits
// equal widening to float32, computing there and rounding once. Inputs of other dtypes (an int64
// tensor added to a bfloat16 one) are still widened, and float32/float64 are their own compute types.
//
// The dtype a kernel runs on for an `out_dtype` result: out_dtype itself when it is float16/bfloat16
// and the inputs already are (`other` may also be float32 when float32_other: a Scalar kept in float,
// which the arithmetic kernels read as is), compute_dtype(out_dtype) otherwise.
DType kernel_dtype(DType out_dtype, const Tensor& a, const Tensor* other = nullptr, bool float32_other = true) {
  const bool half = out_dtype == kFloat16 || out_dtype == kBFloat16;
  const bool other_fits =
      !other || other->dtype() == out_dtype || (float32_other && other->dtype() == kFloat32);
  return half && a.dtype() == out_dtype && other_fits ? out_dtype : compute_dtype(out_dtype);
}

// `t` as a kernel running on `cd` takes it: cast to cd, except a float32 operand of a float16/bfloat16
// kernel, which stays float32 (a Scalar is not rounded to 16 bits before use: PyTorch's opmath).
Tensor kernel_operand(const Tensor& t, DType cd) {
  const bool half = cd == kFloat16 || cd == kBFloat16;
  return half && t.dtype() == kFloat32 ? t : cast(t, cd);
}

// Runs `op` on a and b (tensors) into a fresh output of dtype `out_dtype` (computed in
// kernel_dtype(out_dtype, a, b)).
Tensor binary_kernel(BinaryOp op, const char* name, const Tensor& a, const Tensor& b, DType out_dtype,
                     const Scalar& alpha = 1) {
  check_defined(a, name, "input");
  check_defined(b, name, "other");
  check_same_device(a, b, name);
  check_kernels(a, name);
  const Shape shape = broadcast_shapes(name, a.sizes(), b.sizes());
  const DType cd = kernel_dtype(out_dtype, a, &b);
  Tensor out = new_output(shape, cd, a.device(), {&a, &b});
  kernels::binary(op, out, cast(a, cd), kernel_operand(b, cd), alpha);
  return cast(out, out_dtype);
}

Tensor compare_kernel(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  check_defined(a, name, "input");
  check_defined(b, name, "other");
  check_same_device(a, b, name);
  check_kernels(a, name);
  const Shape shape = broadcast_shapes(name, a.sizes(), b.sizes());
  const DType cd = kernel_dtype(result_type(a, b), a, &b, /*float32_other=*/false);
  Tensor out = new_output(shape, kBool, a.device(), {&a, &b});
  kernels::binary(op, out, cast(a, cd), cast(b, cd));
  return out;
}

Tensor unary_kernel(UnaryOp op, const char* name, const Tensor& t, bool float_only) {
  check_defined(t, name, "input");
  check_kernels(t, name);
  DType out_dtype = t.dtype();
  if (float_only && !is_floating(out_dtype)) out_dtype = kFloat32;  // exp(int) is float, as in PyTorch
  const DType cd = kernel_dtype(out_dtype, t);
  Tensor out = new_output(t.sizes(), cd, t.device(), {&t});
  kernels::unary(op, out, cast(t, cd));
  return cast(out, out_dtype);
}

// A Scalar operand: float32 for a float16/bfloat16 result (the kernels compute in float; see kernel_operand).
Tensor wrap(const Scalar& s, const Tensor& like, DType dtype) {
  return scalar_to_tensor(s, compute_dtype(dtype), like.device());
}

bool differentiable(const Tensor& out) { return is_floating(out.dtype()); }

}  // namespace

// ------------------------------------------------------------------ add / sub
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  Tensor out = binary_kernel(BinaryOp::Add, "add", a, b, result_type(a, b), alpha);
  if (autograd::any_requires_grad({&a, &b}) && differentiable(out)) {
    autograd::record("AddBackward", {a, b}, {out}, [alpha](const TensorList& g) -> TensorList {
      return {g[0], alpha.to_double() == 1.0 ? g[0] : mul(g[0], alpha)};
    });
  }
  return out;
}

Tensor add(const Tensor& a, const Scalar& b) {
  const DType dt = result_type(a, b);
  Tensor out = binary_kernel(BinaryOp::Add, "add", a, wrap(b, a, dt), dt);
  if (autograd::any_requires_grad({&a}) && differentiable(out)) {
    autograd::record("AddBackward", {a}, {out}, [](const TensorList& g) -> TensorList { return {g[0]}; });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (a.defined() && b.defined() && (a.dtype() == kBool || b.dtype() == kBool)) {
    fail("sub: subtraction of bool tensors is not supported (got {}); use logical_xor", dtypes_str(a, b));
  }
  Tensor out = binary_kernel(BinaryOp::Sub, "sub", a, b, result_type(a, b), alpha);
  if (autograd::any_requires_grad({&a, &b}) && differentiable(out)) {
    autograd::record("SubBackward", {a, b}, {out}, [alpha](const TensorList& g) -> TensorList {
      return {g[0], mul(g[0], -alpha.to_double())};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Scalar& b) { return add(a, b.is_floating() ? Scalar(-b.to_double()) : Scalar(-b.to<int64_t>())); }

Tensor rsub(const Tensor& a, const Scalar& b) { return add(neg(a), b); }

// ------------------------------------------------------------------ mul / div
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(BinaryOp::Mul, "mul", a, b, result_type(a, b));
  if (autograd::any_requires_grad({&a, &b}) && differentiable(out)) {
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(a.requires_grad() ? b : Tensor());
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record("MulBackward", {a, b}, {out}, [sa, sb, need_a, need_b](const TensorList& g) -> TensorList {
      return {need_a ? mul(g[0], sb.unpack("mul")) : Tensor(), need_b ? mul(g[0], sa.unpack("mul")) : Tensor()};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Scalar& b) {
  const DType dt = result_type(a, b);
  Tensor out = binary_kernel(BinaryOp::Mul, "mul", a, wrap(b, a, dt), dt);
  if (autograd::any_requires_grad({&a}) && differentiable(out)) {
    autograd::record("MulBackward", {a}, {out}, [b](const TensorList& g) -> TensorList { return {mul(g[0], b)}; });
  }
  return out;
}

namespace {
DType div_type(DType t) { return is_floating(t) ? t : kFloat32; }
}  // namespace

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(BinaryOp::Div, "div", a, b, div_type(result_type(a, b)));
  if (autograd::any_requires_grad({&a, &b})) {
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(b);
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record("DivBackward", {a, b}, {out}, [sa, sb, need_a, need_b](const TensorList& g) -> TensorList {
      Tensor bv = sb.unpack("div");
      Tensor ga = div(g[0], bv);
      return {need_a ? ga : Tensor(), need_b ? neg(div(mul(ga, sa.unpack("div")), bv)) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Scalar& b) {
  const DType dt = div_type(result_type(a, b));
  Tensor out = binary_kernel(BinaryOp::Div, "div", a, wrap(b, a, dt), dt);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("DivBackward", {a}, {out}, [b](const TensorList& g) -> TensorList { return {div(g[0], b)}; });
  }
  return out;
}

Tensor rdiv(const Tensor& a, const Scalar& b) {
  check_defined(a, "rdiv", "input");
  const DType dt = div_type(result_type(a, b));
  return div(scalar_to_tensor(b, dt, a.device()), a);
}

// ------------------------------------------------------------------ maximum / minimum
namespace {
Tensor min_max(bool is_max, const Tensor& a, const Tensor& b) {
  const char* name = is_max ? "maximum" : "minimum";
  Tensor out = binary_kernel(is_max ? BinaryOp::Max : BinaryOp::Min, name, a, b, result_type(a, b));
  if (autograd::any_requires_grad({&a, &b}) && differentiable(out)) {
    SavedTensor sa(a), sb(b);
    autograd::record(is_max ? "MaximumBackward" : "MinimumBackward", {a, b}, {out},
                     [sa, sb, is_max, name](const TensorList& g) -> TensorList {
                       Tensor av = sa.unpack(name), bv = sb.unpack(name);
                       // Ties split the gradient evenly, as in PyTorch.
                       Tensor wins = is_max ? gt(av, bv) : lt(av, bv);
                       Tensor weight = add(wins.to(g[0].dtype()), mul(eq(av, bv).to(g[0].dtype()), 0.5));
                       Tensor ga = mul(g[0], weight);
                       return {ga, sub(g[0], ga)};
                     });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return min_max(true, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return min_max(false, a, b); }

// ------------------------------------------------------------------ pow
Tensor pow(const Tensor& a, const Scalar& exponent) {
  check_defined(a, "pow", "input");
  check_kernels(a, "pow");
  DType dt = result_type(a, exponent);
  if (!is_floating(dt) && exponent.is_integral() && exponent.to<int64_t>() < 0) {
    fail("pow: integers to negative integer powers are not allowed (got a {} tensor and exponent {})",
         dtype_name(a.dtype()), exponent.to<int64_t>());
  }
  const DType cd = kernel_dtype(dt, a);
  Tensor out = new_output(a.sizes(), cd, a.device(), {&a});
  kernels::pow_scalar(out, cast(a, cd), exponent.to_double());
  out = cast(out, dt);
  if (autograd::any_requires_grad({&a}) && differentiable(out)) {
    SavedTensor sa(a);
    const double e = exponent.to_double();
    autograd::record("PowBackward", {a}, {out}, [sa, e](const TensorList& g) -> TensorList {
      if (e == 0.0) return {zeros_like(g[0])};
      return {mul(g[0], mul(pow(sa.unpack("pow"), e - 1.0), e))};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& exponent) {
  Tensor out = binary_kernel(BinaryOp::Pow, "pow", a, exponent, result_type(a, exponent));
  if (autograd::any_requires_grad({&a, &exponent}) && differentiable(out)) {
    SavedTensor sa(a), se(exponent), so(out);
    autograd::record("PowBackward", {a, exponent}, {out}, [sa, se, so](const TensorList& g) -> TensorList {
      Tensor av = sa.unpack("pow"), ev = se.unpack("pow");
      // e * a^(e-1), and 0 where e == 0 (0 * 0^-1 would be NaN at a == 0; PyTorch masks it).
      Tensor ga = masked_fill(mul(g[0], mul(ev, pow(av, sub(ev, 1)))), eq(ev, 0), 0);
      // d/de a^e = a^e log a; defined as 0 where a == 0 and e >= 0 (PyTorch's convention).
      Tensor ge_ = mul(g[0], mul(so.unpack("pow"), log(av)));
      ge_ = masked_fill(ge_, logical_and(eq(av, 0), ge(ev, 0)), 0);
      return {ga, ge_};
    });
  }
  return out;
}

Tensor pow(const Scalar& base, const Tensor& exponent) {
  check_defined(exponent, "pow", "exponent");
  DType dt = result_type(exponent, base);
  return pow(scalar_to_tensor(base, dt, exponent.device()), exponent);
}

// ------------------------------------------------------------------ unary
Tensor neg(const Tensor& t) {
  Tensor out = unary_kernel(UnaryOp::Neg, "neg", t, false);
  if (autograd::any_requires_grad({&t})) {
    autograd::record("NegBackward", {t}, {out}, [](const TensorList& g) -> TensorList { return {neg(g[0])}; });
  }
  return out;
}

Tensor abs(const Tensor& t) {
  Tensor out = unary_kernel(UnaryOp::Abs, "abs", t, false);
  if (autograd::any_requires_grad({&t})) {
    SavedTensor st(t);
    autograd::record("AbsBackward", {t}, {out}, [st](const TensorList& g) -> TensorList {
      Tensor x = st.unpack("abs");
      Tensor sign = new_output(x.sizes(), x.dtype(), x.device());
      kernels::unary(UnaryOp::Sign, sign, x);
      return {mul(g[0], sign)};
    });
  }
  return out;
}

#define CHORUS_UNARY_OUT_SAVED(NAME, OPENUM, NODE, FORMULA)                                  \
  Tensor NAME(const Tensor& t) {                                                              \
    Tensor out = unary_kernel(UnaryOp::OPENUM, #NAME, t, true);                               \
    if (autograd::any_requires_grad({&t})) {                                                  \
      SavedTensor so(out);                                                                    \
      autograd::record(NODE, {t}, {out}, [so](const TensorList& g) -> TensorList {            \
        Tensor y = so.unpack(#NAME);                                                          \
        return {FORMULA};                                                                     \
      });                                                                                     \
    }                                                                                         \
    return out;                                                                               \
  }

#define CHORUS_UNARY_IN_SAVED(NAME, OPENUM, NODE, FORMULA)                                   \
  Tensor NAME(const Tensor& t) {                                                              \
    Tensor out = unary_kernel(UnaryOp::OPENUM, #NAME, t, true);                               \
    if (autograd::any_requires_grad({&t})) {                                                  \
      SavedTensor st(t);                                                                      \
      autograd::record(NODE, {t}, {out}, [st](const TensorList& g) -> TensorList {            \
        Tensor x = st.unpack(#NAME);                                                          \
        return {FORMULA};                                                                     \
      });                                                                                     \
    }                                                                                         \
    return out;                                                                               \
  }

namespace {
Tensor fused_backward(BinaryOp op, const Tensor& g, const Tensor& saved) {
  const DType cd = kernel_dtype(g.dtype(), g, &saved);
  Tensor out = new_output(g.sizes(), cd, g.device(), {&g, &saved});
  kernels::binary(op, out, cast(g, cd), kernel_operand(saved, cd));
  return cast(out, g.dtype());
}
}  // namespace

// d exp(x) = exp(x);  d sqrt(x) = 1 / (2 sqrt(x));  d rsqrt(x) = -rsqrt(x)^3 / 2
CHORUS_UNARY_OUT_SAVED(exp, Exp, "ExpBackward", mul(g[0], y))
CHORUS_UNARY_OUT_SAVED(sqrt, Sqrt, "SqrtBackward", div(g[0], mul(y, 2.0)))
CHORUS_UNARY_OUT_SAVED(rsqrt, Rsqrt, "RsqrtBackward", mul(g[0], mul(pow(y, 3.0), -0.5)))
CHORUS_UNARY_OUT_SAVED(tanh, Tanh, "TanhBackward", fused_backward(BinaryOp::TanhBackward, g[0], y))
CHORUS_UNARY_OUT_SAVED(sigmoid, Sigmoid, "SigmoidBackward", fused_backward(BinaryOp::SigmoidBackward, g[0], y))
// d log(x) = 1/x;  d log1p(x) = 1/(1+x);  d sin = cos;  d cos = -sin
CHORUS_UNARY_IN_SAVED(log, Log, "LogBackward", div(g[0], x))
CHORUS_UNARY_IN_SAVED(log1p, Log1p, "Log1pBackward", div(g[0], add(x, 1.0)))
CHORUS_UNARY_IN_SAVED(sin, Sin, "SinBackward", mul(g[0], cos(x)))
CHORUS_UNARY_IN_SAVED(cos, Cos, "CosBackward", neg(mul(g[0], sin(x))))
// d expm1 = expm1 + 1;  d erf = 2/sqrt(pi) exp(-x^2);  d erfinv = sqrt(pi)/2 exp(erfinv^2)
CHORUS_UNARY_OUT_SAVED(expm1, Expm1, "Expm1Backward", mul(g[0], add(y, 1.0)))
CHORUS_UNARY_IN_SAVED(erf, Erf, "ErfBackward", mul(g[0], mul(exp(neg(mul(x, x))), 1.12837916709551257390)))
CHORUS_UNARY_OUT_SAVED(erfinv, Erfinv, "ErfinvBackward", mul(g[0], mul(exp(mul(y, y)), 0.88622692545275801365)))
// d log2 = 1/(x ln 2);  d log10 = 1/(x ln 10)
CHORUS_UNARY_IN_SAVED(log2, Log2, "Log2Backward", div(g[0], mul(x, 0.69314718055994530942)))
CHORUS_UNARY_IN_SAVED(log10, Log10, "Log10Backward", div(g[0], mul(x, 2.30258509299404568402)))

namespace {
// floor, ceil, round, trunc and sign: piecewise constant, so their gradient is zero (as PyTorch's).
// On integer (and bool for sign) tensors floor & co. are the identity, returned as a copy.
Tensor step_function(UnaryOp op, const char* name, const char* node, const Tensor& t) {
  check_defined(t, name, "input");
  Tensor out = op != UnaryOp::Sign && !is_floating(t.dtype()) ? clone(t) : unary_kernel(op, name, t, false);
  if (autograd::any_requires_grad({&t})) {
    autograd::record(node, {t}, {out}, [](const TensorList& g) -> TensorList { return {zeros_like(g[0])}; });
  }
  return out;
}
}  // namespace

Tensor floor(const Tensor& t) { return step_function(UnaryOp::Floor, "floor", "FloorBackward", t); }
Tensor ceil(const Tensor& t) { return step_function(UnaryOp::Ceil, "ceil", "CeilBackward", t); }
Tensor round(const Tensor& t) { return step_function(UnaryOp::Round, "round", "RoundBackward", t); }
Tensor trunc(const Tensor& t) { return step_function(UnaryOp::Trunc, "trunc", "TruncBackward", t); }
Tensor sign(const Tensor& t) { return step_function(UnaryOp::Sign, "sign", "SignBackward", t); }

Tensor relu(const Tensor& t) {
  Tensor out = unary_kernel(UnaryOp::Relu, "relu", t, false);
  if (autograd::any_requires_grad({&t})) {
    SavedTensor so(out);
    autograd::record("ReluBackward", {t}, {out}, [so](const TensorList& g) -> TensorList {
      return {fused_backward(BinaryOp::ReluBackward, g[0], so.unpack("relu"))};
    });
  }
  return out;
}

Tensor gelu(const Tensor& t, const std::string& approximate) {
  if (approximate != "none" && approximate != "tanh") {
    fail("gelu: approximate must be 'none' or 'tanh', got '{}'", approximate);
  }
  const bool tanh_form = approximate == "tanh";
  Tensor out = unary_kernel(tanh_form ? UnaryOp::GeluTanh : UnaryOp::GeluErf, "gelu", t, true);
  if (autograd::any_requires_grad({&t})) {
    SavedTensor st(t);
    autograd::record("GeluBackward", {t}, {out}, [st, tanh_form](const TensorList& g) -> TensorList {
      return {fused_backward(tanh_form ? BinaryOp::GeluTanhBackward : BinaryOp::GeluErfBackward, g[0],
                             st.unpack("gelu"))};
    });
  }
  return out;
}

// ------------------------------------------------------------------ clamp, where
Tensor clamp(const Tensor& t, std::optional<Scalar> min, std::optional<Scalar> max) {
  check_defined(t, "clamp", "input");
  check_kernels(t, "clamp");
  if (!min && !max) fail("clamp: at least one of min and max must be given");
  DType dt = t.dtype();
  if (min) dt = result_type(make_tensor({0}, dt, kCPU), *min);
  if (max) dt = result_type(make_tensor({0}, dt, kCPU), *max);
  const DType cd = kernel_dtype(dt, t);
  Tensor out = new_output(t.sizes(), cd, t.device(), {&t});
  kernels::clamp(out, cast(t, cd), min ? &*min : nullptr, max ? &*max : nullptr);
  out = cast(out, dt);
  if (autograd::any_requires_grad({&t})) {
    SavedTensor st(t);
    autograd::record("ClampBackward", {t}, {out}, [st, min, max](const TensorList& g) -> TensorList {
      Tensor x = st.unpack("clamp");
      Tensor keep = ones_like(x).to(kBool);
      if (min) keep = logical_and(keep, ge(x, *min));
      if (max) keep = logical_and(keep, le(x, *max));
      return {where(keep, g[0], 0.0)};
    });
  }
  return out;
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  check_defined(condition, "where", "condition");
  check_defined(a, "where", "input");
  check_defined(b, "where", "other");
  if (condition.dtype() != kBool) {
    fail("where: condition must be a bool tensor, got {}", dtype_name(condition.dtype()));
  }
  check_same_device(condition, a, "where");
  check_same_device(a, b, "where");
  check_kernels(a, "where");
  const Shape shape = broadcast_shapes("where", broadcast_shapes("where", condition.sizes(), a.sizes()), b.sizes());
  const DType dt = result_type(a, b);
  Tensor out = new_output(shape, dt, a.device(), {&a, &b, &condition});
  kernels::where(out, condition, cast(a, dt), cast(b, dt));
  if (autograd::any_requires_grad({&a, &b}) && differentiable(out)) {
    SavedTensor sc(condition);
    autograd::record("WhereBackward", {a, b}, {out}, [sc](const TensorList& g) -> TensorList {
      Tensor c = sc.unpack("where");
      Tensor z = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
      return {where(c, g[0], z), where(c, z, g[0])};
    });
  }
  return out;
}

Tensor where(const Tensor& condition, const Tensor& a, const Scalar& b) {
  check_defined(a, "where", "input");
  return where(condition, a, scalar_to_tensor(b, result_type(a, b), a.device()));
}

// ------------------------------------------------------------------ comparisons and logic
Tensor eq(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::Eq, "eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::Ne, "ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::Lt, "lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::Le, "le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::Gt, "gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::Ge, "ge", a, b); }

#define CHORUS_COMPARE_SCALAR(NAME)                                          \
  Tensor NAME(const Tensor& a, const Scalar& b) {                            \
    check_defined(a, #NAME, "input");                                        \
    return NAME(a, scalar_to_tensor(b, result_type(a, b), a.device()));      \
  }
CHORUS_COMPARE_SCALAR(eq)
CHORUS_COMPARE_SCALAR(ne)
CHORUS_COMPARE_SCALAR(lt)
CHORUS_COMPARE_SCALAR(le)
CHORUS_COMPARE_SCALAR(gt)
CHORUS_COMPARE_SCALAR(ge)

Tensor logical_and(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::LogicalAnd, "logical_and", a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::LogicalOr, "logical_or", a, b); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return compare_kernel(BinaryOp::LogicalXor, "logical_xor", a, b); }
Tensor logical_not(const Tensor& t) {
  check_defined(t, "logical_not", "input");
  check_kernels(t, "logical_not");
  Tensor out = new_output(t.sizes(), kBool, t.device(), {&t});
  kernels::unary(UnaryOp::LogicalNot, out, cast(t, kernel_dtype(t.dtype(), t)));
  return out;
}

bool equal(const Tensor& a, const Tensor& b) {
  check_defined(a, "equal", "input");
  check_defined(b, "equal", "other");
  if (a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  return eq(a, b).to(kInt64).sum().item<int64_t>() == a.numel();
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  check_defined(a, "allclose", "input");
  check_defined(b, "allclose", "other");
  if (a.sizes() != b.sizes()) {
    fail("allclose: shapes {} and {} differ", shape_str(a.sizes()), shape_str(b.sizes()));
  }
  if (a.numel() == 0) return true;
  autograd::NoGradGuard guard;
  Tensor x = a.to(kFloat64), y = b.to(kFloat64);
  Tensor close = le(abs(sub(x, y)), add(mul(abs(y), rtol), atol));
  // Equal infinities and NaN-free: inf - inf is NaN, so treat exact equality as close.
  close = logical_or(close, eq(x, y));
  return close.to(kInt64).sum().item<int64_t>() == a.numel();
}

// ------------------------------------------------------------------ in-place
namespace {

// Shared body of the in-place binary ops: self = self op other (other broadcast to self).
Tensor& inplace_binary(BinaryOp op, const char* name, Tensor& self, const Tensor& other, const Scalar& alpha,
                       autograd::BackwardFn backward_maker(const Tensor& self_before, const Tensor& other, const Scalar& alpha)) {
  check_defined(self, name, "self");
  check_defined(other, name, "other");
  check_same_device(self, other, name);
  check_kernels(self, name);
  DType rt = result_type(self, other);
  if (op == BinaryOp::Div && !is_floating(rt)) rt = kFloat32;
  if (!category_fits(rt, self.dtype())) {
    fail("{}: result type {} can't be cast to the desired output type {}", name, dtype_name(rt),
         dtype_name(self.dtype()));
  }
  const Shape shape = broadcast_shapes(name, self.sizes(), other.sizes());
  if (shape != self.sizes()) {
    fail("{}: output with shape {} doesn't match the broadcast shape {} (in-place ops cannot grow self)",
         name, shape_str(self.sizes()), shape_str(shape));
  }
  const bool record = autograd::any_requires_grad({&self, &other}) && is_floating(self.dtype());
  autograd::check_inplace(self, name, record);
  autograd::check_no_internal_overlap(self, name);
  // mul_ and div_ need self's old value for other's gradient; a private clone, so that nothing
  // (this op included) can overwrite it.
  const bool needs_before = op == BinaryOp::Mul || op == BinaryOp::Div;
  Tensor self_before = record && other.requires_grad() && needs_before ? clone(alias_without_history(self)) : Tensor();
  // Save `other` (with its version) before writing self: when it shares self's storage
  // (a.mul_(a), a.div_(a.detach())) the write bumps that version, so backward reports the
  // overwrite instead of computing with the new values.
  autograd::BackwardFn backward;
  if (record) {
    Tensor other_saved = op == BinaryOp::Mul || op == BinaryOp::Div ? other : Tensor();
    backward = backward_maker(self_before, other_saved, alpha);
  }
  const DType cd = kernel_dtype(promote_types(rt, self.dtype()), self, &other);
  if (self.dtype() == cd) {
    // `other` over part of self's memory as another view (x.add_(x[0]), a.add_(a.t())): read from a
    // copy, as copy_ does and NumPy's ufuncs do, so every element sees other's values from before
    // the op. A kernel reading what it writes through another view gives an order-dependent answer,
    // and the CPU's sequential loop and a GPU's threads gave different ones (PyTorch refuses it).
    // The same view (a.mul_(a)) reads each element before writing it and needs no copy.
    const bool overlaps = other.storage() == self.storage() &&
                          !(other.storage_offset() == self.storage_offset() && other.sizes() == self.sizes() &&
                            other.strides() == self.strides() && other.dtype() == self.dtype());
    const Tensor operand = overlaps ? clone(alias_without_history(other)) : other;
    kernels::binary(op, self, self, kernel_operand(operand, cd), alpha);
  } else {
    Tensor tmp = new_output(self.sizes(), cd, self.device(), {&self});
    kernels::binary(op, tmp, cast(self, cd), kernel_operand(other, cd), alpha);
    kernels::copy(self, tmp);
  }
  self.bump_version();
  if (record) autograd::record_inplace(name, self, {other}, std::move(backward));
  return self;
}

autograd::BackwardFn add_backward(const Tensor&, const Tensor&, const Scalar& alpha) {
  return [alpha](const TensorList& g) -> TensorList { return {g[0], mul(g[0], alpha)}; };
}
autograd::BackwardFn sub_backward(const Tensor&, const Tensor&, const Scalar& alpha) {
  return [alpha](const TensorList& g) -> TensorList { return {g[0], mul(g[0], -alpha.to_double())}; };
}
autograd::BackwardFn mul_backward(const Tensor& self_before, const Tensor& other, const Scalar&) {
  SavedTensor so(other);
  Tensor before = self_before;  // a private clone: nothing else can modify it
  return [so, before](const TensorList& g) -> TensorList {
    return {mul(g[0], so.unpack("mul_")), before.defined() ? mul(g[0], before) : Tensor()};
  };
}
autograd::BackwardFn div_backward(const Tensor& self_before, const Tensor& other, const Scalar&) {
  SavedTensor so(other);
  Tensor before = self_before;  // a private clone: nothing else can modify it
  return [so, before](const TensorList& g) -> TensorList {
    const Tensor o = so.unpack("div_");
    Tensor self_grad = div(g[0], o);
    // d(a / b)/db = -a / b^2, with a the value self had before the division.
    return {self_grad, before.defined() ? neg(div(mul(self_grad, before), o)) : Tensor()};
  };
}

}  // namespace

Tensor& add_(Tensor& t, const Tensor& other, const Scalar& alpha) {
  return inplace_binary(BinaryOp::Add, "add_", t, other, alpha, add_backward);
}
Tensor& add_(Tensor& t, const Scalar& other) {
  check_defined(t, "add_", "self");
  return add_(t, scalar_to_tensor(other, result_type(t, other), t.device()));
}
Tensor& sub_(Tensor& t, const Tensor& other, const Scalar& alpha) {
  return inplace_binary(BinaryOp::Sub, "sub_", t, other, alpha, sub_backward);
}
Tensor& mul_(Tensor& t, const Tensor& other) { return inplace_binary(BinaryOp::Mul, "mul_", t, other, 1, mul_backward); }
Tensor& mul_(Tensor& t, const Scalar& other) {
  check_defined(t, "mul_", "self");
  return mul_(t, scalar_to_tensor(other, result_type(t, other), t.device()));
}
Tensor& div_(Tensor& t, const Tensor& other) {
  return inplace_binary(BinaryOp::Div, "div_", t, other, 1, div_backward);
}
Tensor& div_(Tensor& t, const Scalar& other) {
  check_defined(t, "div_", "self");
  return div_(t, scalar_to_tensor(other, div_type(result_type(t, other)), t.device()));
}

Tensor& clamp_(Tensor& t, std::optional<Scalar> min, std::optional<Scalar> max) {
  check_defined(t, "clamp_", "self");
  const bool record = autograd::any_requires_grad({&t});
  autograd::check_inplace(t, "clamp_", record);
  autograd::check_no_internal_overlap(t, "clamp_");
  Tensor result = [&] {
    autograd::NoGradGuard guard;
    return clamp(t, min, max);
  }();
  if (result.dtype() != t.dtype()) {
    fail("clamp_: result type {} can't be cast to the desired output type {}", dtype_name(result.dtype()),
         dtype_name(t.dtype()));
  }
  SavedTensor mask;
  if (record) {
    autograd::NoGradGuard guard;
    Tensor keep = ones_like(t).to(kBool);
    if (min) keep = logical_and(keep, ge(t, *min));
    if (max) keep = logical_and(keep, le(t, *max));
    mask = SavedTensor(keep);
  }
  kernels::copy(t, result);
  t.bump_version();
  if (record) {
    autograd::record_inplace("ClampBackward", t, {}, [mask](const TensorList& g) -> TensorList {
      return {where(mask.unpack("clamp_"), g[0], 0.0)};
    });
  }
  return t;
}

}  // namespace chorus
