// Unary, pow, clamp, binary (arithmetic with alpha, comparisons, logical ops, fused backward helpers)
// and where on CUDA: the cpu kernels' dispatch (kernels/cpu/pointwise.cpp) with each shared functor
// of kernels/shared/pointwise_math.h run by the strided elementwise launcher of common.cuh.
// float16/bfloat16 tensors are taken as they are stored: each element widened to float, the functor
// run at float, one rounding on store ([Half storage] in pointwise_math.h), as the cpu kernels.
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::cuda_impl {
namespace {

using sh::opmath_t;

// The launches over storage type T with functor f at opmath_t<T> (sh::on_storage); B: b's storage type.
template <typename T, typename F>
void unary_on(const char* what, const Tensor& out, const Tensor& in, const F& f) {
  unary_launch<T, T>(what, out, in, sh::on_storage<T>(f));
}
template <typename T, typename B, typename F>
void binary_on(const char* what, const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  binary_launch<T, T, B>(what, out, a, b, sh::on_storage<T>(f));
}

template <typename T>
void unary_typed(UnaryOp op, const Tensor& out, const Tensor& in) {
  switch (op) {
    case UnaryOp::Neg:
      if constexpr (std::is_same_v<T, bool>) fail("neg: not defined for bool tensors (use logical_not)");
      else unary_on<T>("neg", out, in, sh::Neg{});
      return;
    case UnaryOp::Abs: unary_on<T>("abs", out, in, sh::Abs{}); return;
    case UnaryOp::Sign: unary_on<T>("sign", out, in, sh::Sign{}); return;
    case UnaryOp::Relu: unary_on<T>("relu", out, in, sh::Relu{}); return;
    default: break;
  }
  if constexpr (std::is_floating_point_v<opmath_t<T>>) {
    switch (op) {
      case UnaryOp::Exp: unary_on<T>("exp", out, in, sh::Exp{}); return;
      case UnaryOp::Log: unary_on<T>("log", out, in, sh::Log{}); return;
      case UnaryOp::Log1p: unary_on<T>("log1p", out, in, sh::Log1p{}); return;
      case UnaryOp::Sqrt: unary_on<T>("sqrt", out, in, sh::Sqrt{}); return;
      case UnaryOp::Rsqrt: unary_on<T>("rsqrt", out, in, sh::Rsqrt{}); return;
      case UnaryOp::Reciprocal: unary_on<T>("reciprocal", out, in, sh::Reciprocal{}); return;
      case UnaryOp::Tanh: unary_on<T>("tanh", out, in, sh::Tanh{}); return;
      case UnaryOp::Sigmoid: unary_on<T>("sigmoid", out, in, sh::Sigmoid{}); return;
      case UnaryOp::GeluErf: unary_on<T>("gelu", out, in, sh::GeluErf{}); return;
      case UnaryOp::GeluTanh: unary_on<T>("gelu_tanh", out, in, sh::GeluTanh{}); return;
      case UnaryOp::Sin: unary_on<T>("sin", out, in, sh::Sin{}); return;
      case UnaryOp::Cos: unary_on<T>("cos", out, in, sh::Cos{}); return;
      case UnaryOp::Floor: unary_on<T>("floor", out, in, sh::Floor{}); return;
      case UnaryOp::Ceil: unary_on<T>("ceil", out, in, sh::Ceil{}); return;
      case UnaryOp::Round: unary_on<T>("round", out, in, sh::Round{}); return;
      case UnaryOp::Trunc: unary_on<T>("trunc", out, in, sh::Trunc{}); return;
      case UnaryOp::Erf: unary_on<T>("erf", out, in, sh::Erf{}); return;
      case UnaryOp::Erfinv: unary_on<T>("erfinv", out, in, sh::Erfinv{}); return;
      case UnaryOp::Expm1: unary_on<T>("expm1", out, in, sh::Expm1{}); return;
      case UnaryOp::Log2: unary_on<T>("log2", out, in, sh::Log2{}); return;
      case UnaryOp::Log10: unary_on<T>("log10", out, in, sh::Log10{}); return;
      default: break;
    }
  }
  fail("unary op: expected a floating-point tensor, got {}", dtype_name(dtype_of<T>::value));
}

// T: the storage type of out and a; B: b's (T, or float for a float16/bfloat16 T: a Scalar kept in float).
template <typename T, typename B>
void arithmetic_typed(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  using M = opmath_t<T>;  // alpha in float for float16/bfloat16, as PyTorch's opmath
  switch (op) {
    case BinaryOp::Add:
      if (alpha.to_double() == 1.0) binary_on<T, B>("add", out, a, b, sh::Add{});
      else binary_on<T, B>("add", out, a, b, sh::AddAlpha<M>{alpha.to<M>()});
      return;
    case BinaryOp::Sub:
      if (alpha.to_double() == 1.0) binary_on<T, B>("sub", out, a, b, sh::Sub{});
      else binary_on<T, B>("sub", out, a, b, sh::SubAlpha<M>{alpha.to<M>()});
      return;
    case BinaryOp::Mul: binary_on<T, B>("mul", out, a, b, sh::Mul{}); return;
    case BinaryOp::Div:
      if constexpr (std::is_floating_point_v<M>) binary_on<T, B>("div", out, a, b, sh::Div{});
      else fail("div: internal error, integer division must be promoted to float by the op layer");
      return;
    case BinaryOp::Max: binary_on<T, B>("maximum", out, a, b, sh::Max{}); return;
    case BinaryOp::Min: binary_on<T, B>("minimum", out, a, b, sh::Min{}); return;
    case BinaryOp::Pow: binary_on<T, B>("pow", out, a, b, sh::Pow{}); return;
    default: break;
  }
  if constexpr (std::is_floating_point_v<M>) {
    switch (op) {
      case BinaryOp::ReluBackward: binary_on<T, B>("relu_backward", out, a, b, sh::ReluBackward{}); return;
      case BinaryOp::TanhBackward: binary_on<T, B>("tanh_backward", out, a, b, sh::TanhBackward{}); return;
      case BinaryOp::SigmoidBackward:
        binary_on<T, B>("sigmoid_backward", out, a, b, sh::SigmoidBackward{});
        return;
      case BinaryOp::GeluErfBackward: binary_on<T, B>("gelu_backward", out, a, b, sh::GeluErfBackward{}); return;
      case BinaryOp::GeluTanhBackward:
        binary_on<T, B>("gelu_tanh_backward", out, a, b, sh::GeluTanhBackward{});
        return;
      default: break;
    }
  }
  fail("binary op {}: not supported for dtype {}", static_cast<int>(op), dtype_name(dtype_of<T>::value));
}

template <typename T>
void compare_typed(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::Eq: binary_launch<bool, T, T>("eq", out, a, b, sh::on_storage<T, bool>(sh::Eq{})); return;
    case BinaryOp::Ne: binary_launch<bool, T, T>("ne", out, a, b, sh::on_storage<T, bool>(sh::Ne{})); return;
    case BinaryOp::Lt: binary_launch<bool, T, T>("lt", out, a, b, sh::on_storage<T, bool>(sh::Lt{})); return;
    case BinaryOp::Le: binary_launch<bool, T, T>("le", out, a, b, sh::on_storage<T, bool>(sh::Le{})); return;
    case BinaryOp::Gt: binary_launch<bool, T, T>("gt", out, a, b, sh::on_storage<T, bool>(sh::Gt{})); return;
    case BinaryOp::Ge: binary_launch<bool, T, T>("ge", out, a, b, sh::on_storage<T, bool>(sh::Ge{})); return;
    case BinaryOp::LogicalAnd: binary_launch<bool, T, T>("logical_and", out, a, b, sh::on_storage<T, bool>(sh::LogicalAnd{})); return;
    case BinaryOp::LogicalOr: binary_launch<bool, T, T>("logical_or", out, a, b, sh::on_storage<T, bool>(sh::LogicalOr{})); return;
    case BinaryOp::LogicalXor: binary_launch<bool, T, T>("logical_xor", out, a, b, sh::on_storage<T, bool>(sh::LogicalXor{})); return;
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
    CHORUS_DISPATCH_ALL(in.dtype(), "logical_not", [&]<typename T>() {
      unary_launch<bool, T>("logical_not", out, in, sh::on_storage<T, bool>(sh::LogicalNot{}));
    });
    return;
  }
  CHORUS_DISPATCH_ALL(in.dtype(), "unary op", [&]<typename T>() { unary_typed<T>(op, out, in); });
}

void pow_scalar(const Tensor& out, const Tensor& in, double exponent) {
  if (out.numel() == 0) return;
  CHORUS_DISPATCH_ALL(in.dtype(), "pow", [&]<typename T>() {
    using M = opmath_t<T>;
    if constexpr (std::is_floating_point_v<M>) {  // the cpu kernel's exact shortcuts
      if (exponent == 2.0) unary_on<T>("pow", out, in, sh::Square{});
      else if (exponent == 0.5) unary_on<T>("pow", out, in, sh::Sqrt{});
      else if (exponent == 1.0) unary_on<T>("pow", out, in, sh::Identity{});
      else unary_on<T>("pow", out, in, sh::PowScalar<M>{static_cast<M>(exponent)});
    } else {
      unary_on<T>("pow", out, in, sh::PowScalar<M>{static_cast<M>(exponent)});
    }
  });
}

void clamp(const Tensor& out, const Tensor& in, const Scalar* min, const Scalar* max) {
  if (out.numel() == 0) return;
  CHORUS_DISPATCH_ALL(in.dtype(), "clamp", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("clamp: not defined for bool tensors");
    } else {
      using M = opmath_t<T>;  // the bounds stay in float for float16/bfloat16
      const bool has_lo = min != nullptr, has_hi = max != nullptr;
      const M lo = has_lo ? min->to<M>() : M(0), hi = has_hi ? max->to<M>() : M(0);
      unary_on<T>("clamp", out, in, sh::Clamp<M>{lo, hi, has_lo, has_hi});
    }
  });
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (out.numel() == 0) return;
  if (is_comparison(op)) {
    CHORUS_DISPATCH_ALL(a.dtype(), "comparison", [&]<typename T>() { compare_typed<T>(op, out, a, b); });
    return;
  }
  CHORUS_DISPATCH_ALL(a.dtype(), "binary op", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {  // PyTorch's bool arithmetic, as the cpu kernel
      if (op == BinaryOp::Add || op == BinaryOp::Max) binary_launch<bool, bool, bool>("add", out, a, b, sh::LogicalOr{});
      else if (op == BinaryOp::Mul || op == BinaryOp::Min)
        binary_launch<bool, bool, bool>("mul", out, a, b, sh::LogicalAnd{});
      else fail("binary op: subtraction, division and pow are not defined for bool tensors");
    } else if constexpr (sh::is_reduced_float_v<T>) {
      if (b.dtype() == a.dtype()) arithmetic_typed<T, T>(op, out, a, b, alpha);
      else if (b.dtype() == kFloat32) arithmetic_typed<T, float>(op, out, a, b, alpha);
      else fail("binary op: a {} tensor takes a {} or float32 other, got {}", dtype_name(a.dtype()),
                dtype_name(a.dtype()), dtype_name(b.dtype()));
    } else {
      arithmetic_typed<T, T>(op, out, a, b, alpha);
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
