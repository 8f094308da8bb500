// Unary, pow, clamp, binary (arithmetic with alpha, comparisons, logical ops, fused backward helpers)
// and where on CUDA: the cpu kernels' dispatch (kernels/cpu/pointwise.cpp) with each shared functor
// of kernels/shared/pointwise_math.h run by the strided elementwise launcher of common.cuh.
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::cuda_impl {
namespace {

template <typename T>
void unary_typed(UnaryOp op, const Tensor& out, const Tensor& in) {
  switch (op) {
    case UnaryOp::Neg:
      if constexpr (std::is_same_v<T, bool>) fail("neg: not defined for bool tensors (use logical_not)");
      else unary_launch<T, T>("neg", out, in, sh::Neg{});
      return;
    case UnaryOp::Abs: unary_launch<T, T>("abs", out, in, sh::Abs{}); return;
    case UnaryOp::Sign: unary_launch<T, T>("sign", out, in, sh::Sign{}); return;
    case UnaryOp::Relu: unary_launch<T, T>("relu", out, in, sh::Relu{}); return;
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case UnaryOp::Exp: unary_launch<T, T>("exp", out, in, sh::Exp{}); return;
      case UnaryOp::Log: unary_launch<T, T>("log", out, in, sh::Log{}); return;
      case UnaryOp::Log1p: unary_launch<T, T>("log1p", out, in, sh::Log1p{}); return;
      case UnaryOp::Sqrt: unary_launch<T, T>("sqrt", out, in, sh::Sqrt{}); return;
      case UnaryOp::Rsqrt: unary_launch<T, T>("rsqrt", out, in, sh::Rsqrt{}); return;
      case UnaryOp::Reciprocal: unary_launch<T, T>("reciprocal", out, in, sh::Reciprocal{}); return;
      case UnaryOp::Tanh: unary_launch<T, T>("tanh", out, in, sh::Tanh{}); return;
      case UnaryOp::Sigmoid: unary_launch<T, T>("sigmoid", out, in, sh::Sigmoid{}); return;
      case UnaryOp::GeluErf: unary_launch<T, T>("gelu", out, in, sh::GeluErf{}); return;
      case UnaryOp::GeluTanh: unary_launch<T, T>("gelu_tanh", out, in, sh::GeluTanh{}); return;
      case UnaryOp::Sin: unary_launch<T, T>("sin", out, in, sh::Sin{}); return;
      case UnaryOp::Cos: unary_launch<T, T>("cos", out, in, sh::Cos{}); return;
      case UnaryOp::Floor: unary_launch<T, T>("floor", out, in, sh::Floor{}); return;
      case UnaryOp::Ceil: unary_launch<T, T>("ceil", out, in, sh::Ceil{}); return;
      case UnaryOp::Round: unary_launch<T, T>("round", out, in, sh::Round{}); return;
      case UnaryOp::Trunc: unary_launch<T, T>("trunc", out, in, sh::Trunc{}); return;
      case UnaryOp::Erf: unary_launch<T, T>("erf", out, in, sh::Erf{}); return;
      case UnaryOp::Erfinv: unary_launch<T, T>("erfinv", out, in, sh::Erfinv{}); return;
      case UnaryOp::Expm1: unary_launch<T, T>("expm1", out, in, sh::Expm1{}); return;
      case UnaryOp::Log2: unary_launch<T, T>("log2", out, in, sh::Log2{}); return;
      case UnaryOp::Log10: unary_launch<T, T>("log10", out, in, sh::Log10{}); return;
      default: break;
    }
  }
  fail("unary op: expected a floating-point tensor, got {}", dtype_name(dtype_of<T>::value));
}

template <typename T>
void arithmetic_typed(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  switch (op) {
    case BinaryOp::Add:
      if (alpha.to_double() == 1.0) binary_launch<T, T, T>("add", out, a, b, sh::Add{});
      else binary_launch<T, T, T>("add", out, a, b, sh::AddAlpha<T>{alpha.to<T>()});
      return;
    case BinaryOp::Sub:
      if (alpha.to_double() == 1.0) binary_launch<T, T, T>("sub", out, a, b, sh::Sub{});
      else binary_launch<T, T, T>("sub", out, a, b, sh::SubAlpha<T>{alpha.to<T>()});
      return;
    case BinaryOp::Mul: binary_launch<T, T, T>("mul", out, a, b, sh::Mul{}); return;
    case BinaryOp::Div:
      if constexpr (std::is_floating_point_v<T>) binary_launch<T, T, T>("div", out, a, b, sh::Div{});
      else fail("div: internal error, integer division must be promoted to float by the op layer");
      return;
    case BinaryOp::Max: binary_launch<T, T, T>("maximum", out, a, b, sh::Max{}); return;
    case BinaryOp::Min: binary_launch<T, T, T>("minimum", out, a, b, sh::Min{}); return;
    case BinaryOp::Pow: binary_launch<T, T, T>("pow", out, a, b, sh::Pow{}); return;
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case BinaryOp::ReluBackward: binary_launch<T, T, T>("relu_backward", out, a, b, sh::ReluBackward{}); return;
      case BinaryOp::TanhBackward: binary_launch<T, T, T>("tanh_backward", out, a, b, sh::TanhBackward{}); return;
      case BinaryOp::SigmoidBackward:
        binary_launch<T, T, T>("sigmoid_backward", out, a, b, sh::SigmoidBackward{});
        return;
      case BinaryOp::GeluErfBackward: binary_launch<T, T, T>("gelu_backward", out, a, b, sh::GeluErfBackward{}); return;
      case BinaryOp::GeluTanhBackward:
        binary_launch<T, T, T>("gelu_tanh_backward", out, a, b, sh::GeluTanhBackward{});
        return;
      default: break;
    }
  }
  fail("binary op {}: not supported for dtype {}", static_cast<int>(op), dtype_name(dtype_of<T>::value));
}

template <typename T>
void compare_typed(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::Eq: binary_launch<bool, T, T>("eq", out, a, b, sh::Eq{}); return;
    case BinaryOp::Ne: binary_launch<bool, T, T>("ne", out, a, b, sh::Ne{}); return;
    case BinaryOp::Lt: binary_launch<bool, T, T>("lt", out, a, b, sh::Lt{}); return;
    case BinaryOp::Le: binary_launch<bool, T, T>("le", out, a, b, sh::Le{}); return;
    case BinaryOp::Gt: binary_launch<bool, T, T>("gt", out, a, b, sh::Gt{}); return;
    case BinaryOp::Ge: binary_launch<bool, T, T>("ge", out, a, b, sh::Ge{}); return;
    case BinaryOp::LogicalAnd: binary_launch<bool, T, T>("logical_and", out, a, b, sh::LogicalAnd{}); return;
    case BinaryOp::LogicalOr: binary_launch<bool, T, T>("logical_or", out, a, b, sh::LogicalOr{}); return;
    case BinaryOp::LogicalXor: binary_launch<bool, T, T>("logical_xor", out, a, b, sh::LogicalXor{}); return;
    default: fail("internal: binary op {} is not a comparison", static_cast<int>(op));
  }
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr ||
         op == BinaryOp::LogicalXor;
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& in) {
  if (out.numel() == 0) return;
  if (op == UnaryOp::LogicalNot) {
    CHORUS_DISPATCH_COMPUTE(in.dtype(), "logical_not", [&]<typename T>() {
      unary_launch<bool, T>("logical_not", out, in, sh::LogicalNot{});
    });
    return;
  }
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "unary op", [&]<typename T>() { unary_typed<T>(op, out, in); });
}

void pow_scalar(const Tensor& out, const Tensor& in, double exponent) {
  if (out.numel() == 0) return;
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "pow", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>) {  // the cpu kernel's exact shortcuts
      if (exponent == 2.0) unary_launch<T, T>("pow", out, in, sh::Square{});
      else if (exponent == 0.5) unary_launch<T, T>("pow", out, in, sh::Sqrt{});
      else if (exponent == 1.0) unary_launch<T, T>("pow", out, in, sh::Identity{});
      else unary_launch<T, T>("pow", out, in, sh::PowScalar<T>{static_cast<T>(exponent)});
    } else {
      unary_launch<T, T>("pow", out, in, sh::PowScalar<T>{static_cast<T>(exponent)});
    }
  });
}

void clamp(const Tensor& out, const Tensor& in, const Scalar* min, const Scalar* max) {
  if (out.numel() == 0) return;
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "clamp", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("clamp: not defined for bool tensors");
    } else {
      const bool has_lo = min != nullptr, has_hi = max != nullptr;
      const T lo = has_lo ? min->to<T>() : T(0), hi = has_hi ? max->to<T>() : T(0);
      unary_launch<T, T>("clamp", out, in, sh::Clamp<T>{lo, hi, has_lo, has_hi});
    }
  });
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (out.numel() == 0) return;
  if (is_comparison(op)) {
    CHORUS_DISPATCH_COMPUTE(a.dtype(), "comparison", [&]<typename T>() { compare_typed<T>(op, out, a, b); });
    return;
  }
  CHORUS_DISPATCH_COMPUTE(a.dtype(), "binary op", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {  // PyTorch's bool arithmetic, as the cpu kernel
      if (op == BinaryOp::Add || op == BinaryOp::Max) binary_launch<bool, bool, bool>("add", out, a, b, sh::LogicalOr{});
      else if (op == BinaryOp::Mul || op == BinaryOp::Min)
        binary_launch<bool, bool, bool>("mul", out, a, b, sh::LogicalAnd{});
      else fail("binary op: subtraction, division and pow are not defined for bool tensors");
    } else {
      arithmetic_typed<T>(op, out, a, b, alpha);
    }
  });
}

namespace {
template <typename T>
struct WhereElem {
  __device__ __forceinline__ void operator()(char* const (&p)[4]) const {
    *reinterpret_cast<T*>(p[0]) =
        sh::Where{}(*reinterpret_cast<const bool*>(p[1]), *reinterpret_cast<const T*>(p[2]), *reinterpret_cast<const T*>(p[3]));
  }
};
}  // namespace

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  CHORUS_DISPATCH_ALL(out.dtype(), "where", [&]<typename T>() {
    launch_elementwise<4>("where", {&out, &cond, &a, &b}, WhereElem<T>{});
  });
}

}  // namespace chorus::kernels::cuda_impl
