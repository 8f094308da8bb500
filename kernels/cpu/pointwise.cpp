// Unary, binary, comparison, where and clamp kernels. The op enum is switched on once per call,
// outside the element loop; each case instantiates a loop with a functor of
// kernels/shared/pointwise_math.h inlined: the functors the CUDA kernels instantiate too.
// float16/bfloat16 tensors are taken as they are stored: each loop widens an element to float, runs
// the functor at float and rounds once on store ([Half storage] in pointwise_math.h, loops.h).
#include <type_traits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::cpu {
namespace {

namespace sm = ::chorus::kernels::shared;
using sm::opmath_t;

// The loops over storage type T with functor f at opmath_t<T>: float16/bfloat16 through the float
// buffers of loops.h's *_opmath loops; B: b's storage type.
template <typename T, typename F>
void unary_on(const StridedIter<2>& it, const F& f) {
  if constexpr (sm::is_reduced_float_v<T>) unary_loop_opmath<T, T>(it, f);
  else unary_loop<T, T>(it, f);
}
template <typename T, typename B, typename F>
void binary_on(const StridedIter<3>& it, const F& f) {
  if constexpr (sm::is_reduced_float_v<T>) binary_loop_opmath<T, T, B>(it, f);
  else binary_loop<T, T, B>(it, f);
}
// Comparisons and logical_not: a bool output.
template <typename T, typename F>
void compare_on(const StridedIter<3>& it, const F& f) {
  if constexpr (sm::is_reduced_float_v<T>) binary_loop_opmath<bool, T, T>(it, f);
  else binary_loop<bool, T, T>(it, f);
}

template <typename T>
void unary_typed(UnaryOp op, const StridedIter<2>& it) {
  constexpr bool kFloat = std::is_floating_point_v<opmath_t<T>>;
  auto need_float = [&](const char* name) {
    fail("{}: expected a floating-point tensor, got {}", name, dtype_name(dtype_of<T>::value));
  };
  switch (op) {
    case UnaryOp::Neg:
      if constexpr (std::is_same_v<T, bool>) fail("neg: not defined for bool tensors (use logical_not)");
      else unary_on<T>(it, sm::Neg{});
      return;
    case UnaryOp::Abs: unary_on<T>(it, sm::Abs{}); return;
    case UnaryOp::Sign: unary_on<T>(it, sm::Sign{}); return;
    case UnaryOp::Relu: unary_on<T>(it, sm::Relu{}); return;  // NaN stays NaN
    case UnaryOp::LogicalNot:
      fail("internal: LogicalNot goes through logical_not_typed");
    default:
      break;
  }
  if constexpr (kFloat) {
    switch (op) {
      case UnaryOp::Exp: unary_on<T>(it, sm::Exp{}); return;
      case UnaryOp::Log: unary_on<T>(it, sm::Log{}); return;
      case UnaryOp::Log1p: unary_on<T>(it, sm::Log1p{}); return;
      case UnaryOp::Sqrt: unary_on<T>(it, sm::Sqrt{}); return;
      case UnaryOp::Rsqrt: unary_on<T>(it, sm::Rsqrt{}); return;
      case UnaryOp::Reciprocal: unary_on<T>(it, sm::Reciprocal{}); return;
      case UnaryOp::Tanh: unary_on<T>(it, sm::Tanh{}); return;
      case UnaryOp::Sigmoid: unary_on<T>(it, sm::Sigmoid{}); return;
      case UnaryOp::GeluErf: unary_on<T>(it, sm::GeluErf{}); return;
      case UnaryOp::GeluTanh: unary_on<T>(it, sm::GeluTanh{}); return;
      case UnaryOp::Sin: unary_on<T>(it, sm::Sin{}); return;
      case UnaryOp::Cos: unary_on<T>(it, sm::Cos{}); return;
      case UnaryOp::Floor: unary_on<T>(it, sm::Floor{}); return;
      case UnaryOp::Ceil: unary_on<T>(it, sm::Ceil{}); return;
      case UnaryOp::Round: unary_on<T>(it, sm::Round{}); return;
      case UnaryOp::Trunc: unary_on<T>(it, sm::Trunc{}); return;
      case UnaryOp::Erf: unary_on<T>(it, sm::Erf{}); return;
      case UnaryOp::Erfinv: unary_on<T>(it, sm::Erfinv{}); return;
      case UnaryOp::Expm1: unary_on<T>(it, sm::Expm1{}); return;
      case UnaryOp::Log2: unary_on<T>(it, sm::Log2{}); return;
      case UnaryOp::Log10: unary_on<T>(it, sm::Log10{}); return;
      default: break;
    }
  }
  need_float("unary op");
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& in) {
  if (out.numel() == 0) return;
  auto it = make_iter<2>(out.sizes(), {&out, &in});
  if (op == UnaryOp::LogicalNot) {
    CHORUS_DISPATCH_ALL(in.dtype(), "logical_not", [&]<typename T>() {
      if constexpr (sm::is_reduced_float_v<T>) unary_loop_opmath<bool, T>(it, sm::LogicalNot{});
      else unary_loop<bool, T>(it, sm::LogicalNot{});
    });
    return;
  }
  CHORUS_DISPATCH_ALL(in.dtype(), "unary op", [&]<typename T>() { unary_typed<T>(op, it); });
}

void pow_scalar(const Tensor& out, const Tensor& in, double exponent) {
  if (out.numel() == 0) return;
  auto it = make_iter<2>(out.sizes(), {&out, &in});
  CHORUS_DISPATCH_ALL(in.dtype(), "pow", [&]<typename T>() {
    // Floating point: the exponents 2, 0.5 and 1 take exact shortcuts (x*x, sqrt, x), as PyTorch.
    using M = opmath_t<T>;
    if constexpr (std::is_floating_point_v<M>) {
      if (exponent == 2.0) unary_on<T>(it, sm::Square{});
      else if (exponent == 0.5) unary_on<T>(it, sm::Sqrt{});
      else if (exponent == 1.0) unary_on<T>(it, sm::Identity{});
      else unary_on<T>(it, sm::PowScalar<M>{static_cast<M>(exponent)});
    } else {
      unary_on<T>(it, sm::PowScalar<M>{static_cast<M>(exponent)});
    }
  });
}

void clamp(const Tensor& out, const Tensor& in, const Scalar* min, const Scalar* max) {
  if (out.numel() == 0) return;
  auto it = make_iter<2>(out.sizes(), {&out, &in});
  CHORUS_DISPATCH_ALL(in.dtype(), "clamp", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("clamp: not defined for bool tensors");
    } else {
      using M = opmath_t<T>;  // the bounds stay in float for float16/bfloat16 (never rounded to 16 bits)
      const bool has_lo = min != nullptr, has_hi = max != nullptr;
      const M lo = has_lo ? min->to<M>() : M(0), hi = has_hi ? max->to<M>() : M(0);
      unary_on<T>(it, sm::Clamp<M>{lo, hi, has_lo, has_hi});
    }
  });
}

namespace {

// T: the storage type of out and a; B: b's (T, or float for a float16/bfloat16 T: a Scalar kept in float).
template <typename T, typename B>
void arithmetic_typed(BinaryOp op, const StridedIter<3>& it, const Scalar& alpha) {
  using M = opmath_t<T>;  // alpha in float for float16/bfloat16, as PyTorch's opmath
  switch (op) {
    case BinaryOp::Add:
      if (alpha.to_double() == 1.0) binary_on<T, B>(it, sm::Add{});
      else binary_on<T, B>(it, sm::AddAlpha<M>{alpha.to<M>()});
      return;
    case BinaryOp::Sub:
      if (alpha.to_double() == 1.0) binary_on<T, B>(it, sm::Sub{});
      else binary_on<T, B>(it, sm::SubAlpha<M>{alpha.to<M>()});
      return;
    case BinaryOp::Mul: binary_on<T, B>(it, sm::Mul{}); return;
    case BinaryOp::Div:
      if constexpr (std::is_floating_point_v<M>) binary_on<T, B>(it, sm::Div{});
      else fail("div: internal error, integer division must be promoted to float by the op layer");
      return;
    case BinaryOp::Max: binary_on<T, B>(it, sm::Max{}); return;  // NaN wins
    case BinaryOp::Min: binary_on<T, B>(it, sm::Min{}); return;
    case BinaryOp::Pow: binary_on<T, B>(it, sm::Pow{}); return;   // exact for integers
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<M>) {
    switch (op) {
      case BinaryOp::ReluBackward: binary_on<T, B>(it, sm::ReluBackward{}); return;
      case BinaryOp::TanhBackward: binary_on<T, B>(it, sm::TanhBackward{}); return;
      case BinaryOp::SigmoidBackward: binary_on<T, B>(it, sm::SigmoidBackward{}); return;
      case BinaryOp::GeluErfBackward: binary_on<T, B>(it, sm::GeluErfBackward{}); return;
      case BinaryOp::GeluTanhBackward: binary_on<T, B>(it, sm::GeluTanhBackward{}); return;
      default:
        break;
    }
  }
  fail("binary op {}: not supported for dtype {}", static_cast<int>(op), dtype_name(dtype_of<T>::value));
}

template <typename T>
void compare_typed(BinaryOp op, const StridedIter<3>& it) {
  switch (op) {
    case BinaryOp::Eq: compare_on<T>(it, sm::Eq{}); return;
    case BinaryOp::Ne: compare_on<T>(it, sm::Ne{}); return;
    case BinaryOp::Lt: compare_on<T>(it, sm::Lt{}); return;
    case BinaryOp::Le: compare_on<T>(it, sm::Le{}); return;
    case BinaryOp::Gt: compare_on<T>(it, sm::Gt{}); return;
    case BinaryOp::Ge: compare_on<T>(it, sm::Ge{}); return;
    case BinaryOp::LogicalAnd: compare_on<T>(it, sm::LogicalAnd{}); return;
    case BinaryOp::LogicalOr: compare_on<T>(it, sm::LogicalOr{}); return;
    case BinaryOp::LogicalXor: compare_on<T>(it, sm::LogicalXor{}); return;
    default:
      fail("internal: binary op {} is not a comparison", static_cast<int>(op));
  }
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge || op == BinaryOp::LogicalAnd ||
         op == BinaryOp::LogicalOr || op == BinaryOp::LogicalXor;
}

}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (out.numel() == 0) return;
  auto it = make_iter<3>(out.sizes(), {&out, &a, &b});
  if (is_comparison(op)) {
    CHORUS_DISPATCH_ALL(a.dtype(), "comparison", [&]<typename T>() { compare_typed<T>(op, it); });
  } else {
    CHORUS_DISPATCH_ALL(a.dtype(), "binary op", [&]<typename T>() {
      if constexpr (std::is_same_v<T, bool>) {
        // bool arithmetic as PyTorch: add is logical or, mul is logical and (alpha is ignored).
        if (op == BinaryOp::Add || op == BinaryOp::Max) binary_loop<bool, bool, bool>(it, sm::LogicalOr{});
        else if (op == BinaryOp::Mul || op == BinaryOp::Min) binary_loop<bool, bool, bool>(it, sm::LogicalAnd{});
        else fail("binary op: subtraction, division and pow are not defined for bool tensors");
      } else if constexpr (sm::is_reduced_float_v<T>) {
        if (b.dtype() == a.dtype()) arithmetic_typed<T, T>(op, it, alpha);
        else if (b.dtype() == kFloat32) arithmetic_typed<T, float>(op, it, alpha);
        else fail("binary op: a {} tensor takes a {} or float32 other, got {}", dtype_name(a.dtype()),
                  dtype_name(a.dtype()), dtype_name(b.dtype()));
      } else {
        arithmetic_typed<T, T>(op, it, alpha);
      }
    });
  }
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  auto it = make_iter<4>(out.sizes(), {&out, &cond, &a, &b});
  CHORUS_DISPATCH_ALL(out.dtype(), "where", [&]<typename T>() {
    ternary_loop<T, bool, T, T>(it, sm::Where{});
  });
}

}  // namespace chorus::kernels::cpu
