// Unary, binary, comparison, where and clamp kernels. The op enum is switched on once per call,
// outside the element loop; each case instantiates a loop with a functor of
// kernels/shared/pointwise_math.h inlined: the functors the CUDA kernels instantiate too.
#include <type_traits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::cpu {
namespace {

namespace sm = ::chorus::kernels::shared;

template <typename T>
void unary_typed(UnaryOp op, const StridedIter<2>& it) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  auto need_float = [&](const char* name) {
    fail("{}: expected a floating-point tensor, got {}", name, dtype_name(dtype_of<T>::value));
  };
  switch (op) {
    case UnaryOp::Neg:
      if constexpr (std::is_same_v<T, bool>) fail("neg: not defined for bool tensors (use logical_not)");
      else unary_loop<T, T>(it, sm::Neg{});
      return;
    case UnaryOp::Abs: unary_loop<T, T>(it, sm::Abs{}); return;
    case UnaryOp::Sign: unary_loop<T, T>(it, sm::Sign{}); return;
    case UnaryOp::Relu: unary_loop<T, T>(it, sm::Relu{}); return;  // NaN stays NaN
    case UnaryOp::LogicalNot:
      fail("internal: LogicalNot goes through logical_not_typed");
    default:
      break;
  }
  if constexpr (kFloat) {
    switch (op) {
      case UnaryOp::Exp: unary_loop<T, T>(it, sm::Exp{}); return;
      case UnaryOp::Log: unary_loop<T, T>(it, sm::Log{}); return;
      case UnaryOp::Log1p: unary_loop<T, T>(it, sm::Log1p{}); return;
      case UnaryOp::Sqrt: unary_loop<T, T>(it, sm::Sqrt{}); return;
      case UnaryOp::Rsqrt: unary_loop<T, T>(it, sm::Rsqrt{}); return;
      case UnaryOp::Reciprocal: unary_loop<T, T>(it, sm::Reciprocal{}); return;
      case UnaryOp::Tanh: unary_loop<T, T>(it, sm::Tanh{}); return;
      case UnaryOp::Sigmoid: unary_loop<T, T>(it, sm::Sigmoid{}); return;
      case UnaryOp::GeluErf: unary_loop<T, T>(it, sm::GeluErf{}); return;
      case UnaryOp::GeluTanh: unary_loop<T, T>(it, sm::GeluTanh{}); return;
      case UnaryOp::Sin: unary_loop<T, T>(it, sm::Sin{}); return;
      case UnaryOp::Cos: unary_loop<T, T>(it, sm::Cos{}); return;
      case UnaryOp::Floor: unary_loop<T, T>(it, sm::Floor{}); return;
      case UnaryOp::Ceil: unary_loop<T, T>(it, sm::Ceil{}); return;
      case UnaryOp::Round: unary_loop<T, T>(it, sm::Round{}); return;
      case UnaryOp::Trunc: unary_loop<T, T>(it, sm::Trunc{}); return;
      case UnaryOp::Erf: unary_loop<T, T>(it, sm::Erf{}); return;
      case UnaryOp::Erfinv: unary_loop<T, T>(it, sm::Erfinv{}); return;
      case UnaryOp::Expm1: unary_loop<T, T>(it, sm::Expm1{}); return;
      case UnaryOp::Log2: unary_loop<T, T>(it, sm::Log2{}); return;
      case UnaryOp::Log10: unary_loop<T, T>(it, sm::Log10{}); return;
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
    CHORUS_DISPATCH_COMPUTE(in.dtype(), "logical_not", [&]<typename T>() {
      unary_loop<bool, T>(it, sm::LogicalNot{});
    });
    return;
  }
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "unary op", [&]<typename T>() { unary_typed<T>(op, it); });
}

void pow_scalar(const Tensor& out, const Tensor& in, double exponent) {
  if (out.numel() == 0) return;
  auto it = make_iter<2>(out.sizes(), {&out, &in});
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "pow", [&]<typename T>() {
    // Floating point: the exponents 2, 0.5 and 1 take exact shortcuts (x*x, sqrt, x), as PyTorch.
    if constexpr (std::is_floating_point_v<T>) {
      if (exponent == 2.0) unary_loop<T, T>(it, sm::Square{});
      else if (exponent == 0.5) unary_loop<T, T>(it, sm::Sqrt{});
      else if (exponent == 1.0) unary_loop<T, T>(it, sm::Identity{});
      else unary_loop<T, T>(it, sm::PowScalar<T>{static_cast<T>(exponent)});
    } else {
      unary_loop<T, T>(it, sm::PowScalar<T>{static_cast<T>(exponent)});
    }
  });
}

void clamp(const Tensor& out, const Tensor& in, const Scalar* min, const Scalar* max) {
  if (out.numel() == 0) return;
  auto it = make_iter<2>(out.sizes(), {&out, &in});
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "clamp", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("clamp: not defined for bool tensors");
    } else {
      const bool has_lo = min != nullptr, has_hi = max != nullptr;
      const T lo = has_lo ? min->to<T>() : T(0), hi = has_hi ? max->to<T>() : T(0);
      unary_loop<T, T>(it, sm::Clamp<T>{lo, hi, has_lo, has_hi});
    }
  });
}

namespace {

template <typename T>
void arithmetic_typed(BinaryOp op, const StridedIter<3>& it, const Scalar& alpha) {
  switch (op) {
    case BinaryOp::Add:
      if (alpha.to_double() == 1.0) binary_loop<T, T, T>(it, sm::Add{});
      else binary_loop<T, T, T>(it, sm::AddAlpha<T>{alpha.to<T>()});
      return;
    case BinaryOp::Sub:
      if (alpha.to_double() == 1.0) binary_loop<T, T, T>(it, sm::Sub{});
      else binary_loop<T, T, T>(it, sm::SubAlpha<T>{alpha.to<T>()});
      return;
    case BinaryOp::Mul: binary_loop<T, T, T>(it, sm::Mul{}); return;
    case BinaryOp::Div:
      if constexpr (std::is_floating_point_v<T>) binary_loop<T, T, T>(it, sm::Div{});
      else fail("div: internal error, integer division must be promoted to float by the op layer");
      return;
    case BinaryOp::Max: binary_loop<T, T, T>(it, sm::Max{}); return;  // NaN wins
    case BinaryOp::Min: binary_loop<T, T, T>(it, sm::Min{}); return;
    case BinaryOp::Pow: binary_loop<T, T, T>(it, sm::Pow{}); return;   // exact for integers
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case BinaryOp::ReluBackward: binary_loop<T, T, T>(it, sm::ReluBackward{}); return;
      case BinaryOp::TanhBackward: binary_loop<T, T, T>(it, sm::TanhBackward{}); return;
      case BinaryOp::SigmoidBackward: binary_loop<T, T, T>(it, sm::SigmoidBackward{}); return;
      case BinaryOp::GeluErfBackward: binary_loop<T, T, T>(it, sm::GeluErfBackward{}); return;
      case BinaryOp::GeluTanhBackward: binary_loop<T, T, T>(it, sm::GeluTanhBackward{}); return;
      default:
        break;
    }
  }
  fail("binary op {}: not supported for dtype {}", static_cast<int>(op), dtype_name(dtype_of<T>::value));
}

template <typename T>
void compare_typed(BinaryOp op, const StridedIter<3>& it) {
  switch (op) {
    case BinaryOp::Eq: binary_loop<bool, T, T>(it, sm::Eq{}); return;
    case BinaryOp::Ne: binary_loop<bool, T, T>(it, sm::Ne{}); return;
    case BinaryOp::Lt: binary_loop<bool, T, T>(it, sm::Lt{}); return;
    case BinaryOp::Le: binary_loop<bool, T, T>(it, sm::Le{}); return;
    case BinaryOp::Gt: binary_loop<bool, T, T>(it, sm::Gt{}); return;
    case BinaryOp::Ge: binary_loop<bool, T, T>(it, sm::Ge{}); return;
    case BinaryOp::LogicalAnd: binary_loop<bool, T, T>(it, sm::LogicalAnd{}); return;
    case BinaryOp::LogicalOr: binary_loop<bool, T, T>(it, sm::LogicalOr{}); return;
    case BinaryOp::LogicalXor: binary_loop<bool, T, T>(it, sm::LogicalXor{}); return;
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
    CHORUS_DISPATCH_COMPUTE(a.dtype(), "comparison", [&]<typename T>() { compare_typed<T>(op, it); });
  } else {
    CHORUS_DISPATCH_COMPUTE(a.dtype(), "binary op", [&]<typename T>() {
      if constexpr (std::is_same_v<T, bool>) {
        // bool arithmetic as PyTorch: add is logical or, mul is logical and (alpha is ignored).
        if (op == BinaryOp::Add || op == BinaryOp::Max) binary_loop<bool, bool, bool>(it, sm::LogicalOr{});
        else if (op == BinaryOp::Mul || op == BinaryOp::Min) binary_loop<bool, bool, bool>(it, sm::LogicalAnd{});
        else fail("binary op: subtraction, division and pow are not defined for bool tensors");
      } else {
        arithmetic_typed<T>(op, it, alpha);
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
