// Unary, binary, comparison, where and clamp kernels. The op enum is switched on once per call,
// outside the element loop; each case instantiates a loop with the functor inlined.
#include <cmath>
#include <type_traits>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"

namespace chorus::kernels::cpu {
namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kGeluCoeff = 0.044715;

template <typename T>
void unary_typed(UnaryOp op, const StridedIter<2>& it) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  auto need_float = [&](const char* name) {
    fail("{}: expected a floating-point tensor, got {}", name, dtype_name(dtype_of<T>::value));
  };
  switch (op) {
    case UnaryOp::Neg:
      if constexpr (std::is_same_v<T, bool>) fail("neg: not defined for bool tensors (use logical_not)");
      else unary_loop<T, T>(it, [](T x) { return static_cast<T>(-x); });
      return;
    case UnaryOp::Abs:
      if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) unary_loop<T, T>(it, [](T x) { return x; });
      else unary_loop<T, T>(it, [](T x) { return x < 0 ? static_cast<T>(-x) : x; });
      return;
    case UnaryOp::Sign:
      unary_loop<T, T>(it, [](T x) { return static_cast<T>((T(0) < x) - (x < T(0))); });
      return;
    case UnaryOp::Relu:
      // NaN propagates, as PyTorch's relu: only values below zero become zero.
      unary_loop<T, T>(it, [](T x) { return x < T(0) ? T(0) : x; });
      return;
    case UnaryOp::LogicalNot:
      fail("internal: LogicalNot goes through logical_not_typed");
    default:
      break;
  }
  if constexpr (kFloat) {
    switch (op) {
      case UnaryOp::Exp: unary_loop<T, T>(it, [](T x) { return std::exp(x); }); return;
      case UnaryOp::Log: unary_loop<T, T>(it, [](T x) { return std::log(x); }); return;
      case UnaryOp::Log1p: unary_loop<T, T>(it, [](T x) { return std::log1p(x); }); return;
      case UnaryOp::Sqrt: unary_loop<T, T>(it, [](T x) { return std::sqrt(x); }); return;
      case UnaryOp::Rsqrt: unary_loop<T, T>(it, [](T x) { return T(1) / std::sqrt(x); }); return;
      case UnaryOp::Reciprocal: unary_loop<T, T>(it, [](T x) { return T(1) / x; }); return;
      case UnaryOp::Tanh: unary_loop<T, T>(it, [](T x) { return std::tanh(x); }); return;
      case UnaryOp::Sigmoid:
        unary_loop<T, T>(it, [](T x) { return T(1) / (T(1) + std::exp(-x)); });
        return;
      case UnaryOp::GeluErf:
        unary_loop<T, T>(it, [](T x) { return T(0.5) * x * (T(1) + std::erf(x * T(kSqrt1_2))); });
        return;
      case UnaryOp::GeluTanh:
        unary_loop<T, T>(it, [](T x) {
          return T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x)));
        });
        return;
      case UnaryOp::Sin: unary_loop<T, T>(it, [](T x) { return std::sin(x); }); return;
      case UnaryOp::Cos: unary_loop<T, T>(it, [](T x) { return std::cos(x); }); return;
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
      unary_loop<bool, T>(it, [](T x) { return x == T(0); });
    });
    return;
  }
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "unary op", [&]<typename T>() { unary_typed<T>(op, it); });
}

namespace {

// Exact integer power by squaring (wrapping like PyTorch on overflow). Negative exponents give the
// integer result PyTorch gives: 1 for base 1, +-1 for base -1, 0 otherwise.
template <typename T>
T integer_pow(T base, T exp) {
  if constexpr (std::is_same_v<T, bool>) {
    return exp ? base : true;
  } else {
    if constexpr (std::is_signed_v<T>) {
      if (exp < 0) {
        if (base == 1) return T(1);
        if (base == -1) return (exp % 2 == 0) ? T(1) : T(-1);
        return T(0);
      }
    }
    using U = std::make_unsigned_t<T>;
    U result = 1;
    U b = static_cast<U>(base);
    auto e = static_cast<U>(exp);
    while (e) {
      if (e & 1u) result = static_cast<U>(result * b);
      b = static_cast<U>(b * b);
      e >>= 1;
    }
    return static_cast<T>(result);
  }
}

}  // namespace

void pow_scalar(const Tensor& out, const Tensor& in, double exponent) {
  if (out.numel() == 0) return;
  auto it = make_iter<2>(out.sizes(), {&out, &in});
  CHORUS_DISPATCH_COMPUTE(in.dtype(), "pow", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T>) {
      const T e = static_cast<T>(exponent);
      if (exponent == 2.0) unary_loop<T, T>(it, [](T x) { return x * x; });
      else if (exponent == 0.5) unary_loop<T, T>(it, [](T x) { return std::sqrt(x); });
      else if (exponent == 1.0) unary_loop<T, T>(it, [](T x) { return x; });
      else unary_loop<T, T>(it, [e](T x) { return std::pow(x, e); });
    } else {
      const auto e = static_cast<T>(exponent);
      unary_loop<T, T>(it, [e](T x) { return integer_pow(x, e); });
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
      unary_loop<T, T>(it, [=](T x) {
        // NaN propagates, as in PyTorch: comparisons with NaN are false, so x stays.
        if (has_lo && x < lo) x = lo;
        if (has_hi && x > hi) x = hi;
        return x;
      });
    }
  });
}

namespace {

template <typename T>
void arithmetic_typed(BinaryOp op, const StridedIter<3>& it, const Scalar& alpha) {
  switch (op) {
    case BinaryOp::Add: {
      const T a = alpha.to<T>();
      if (alpha.to_double() == 1.0) binary_loop<T, T, T>(it, [](T x, T y) { return static_cast<T>(x + y); });
      else binary_loop<T, T, T>(it, [a](T x, T y) { return static_cast<T>(x + a * y); });
      return;
    }
    case BinaryOp::Sub: {
      const T a = alpha.to<T>();
      if (alpha.to_double() == 1.0) binary_loop<T, T, T>(it, [](T x, T y) { return static_cast<T>(x - y); });
      else binary_loop<T, T, T>(it, [a](T x, T y) { return static_cast<T>(x - a * y); });
      return;
    }
    case BinaryOp::Mul:
      binary_loop<T, T, T>(it, [](T x, T y) { return static_cast<T>(x * y); });
      return;
    case BinaryOp::Div:
      if constexpr (std::is_floating_point_v<T>) binary_loop<T, T, T>(it, [](T x, T y) { return x / y; });
      else fail("div: internal error, integer division must be promoted to float by the op layer");
      return;
    case BinaryOp::Max:
      if constexpr (std::is_floating_point_v<T>)
        binary_loop<T, T, T>(it, [](T x, T y) { return (x != x || x > y) ? x : y; });  // NaN wins
      else binary_loop<T, T, T>(it, [](T x, T y) { return x > y ? x : y; });
      return;
    case BinaryOp::Min:
      if constexpr (std::is_floating_point_v<T>)
        binary_loop<T, T, T>(it, [](T x, T y) { return (x != x || x < y) ? x : y; });
      else binary_loop<T, T, T>(it, [](T x, T y) { return x < y ? x : y; });
      return;
    case BinaryOp::Pow:
      if constexpr (std::is_floating_point_v<T>) binary_loop<T, T, T>(it, [](T x, T y) { return std::pow(x, y); });
      else binary_loop<T, T, T>(it, [](T x, T y) { return integer_pow(x, y); });
      return;
    default:
      break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case BinaryOp::ReluBackward:
        binary_loop<T, T, T>(it, [](T g, T x) { return x > T(0) ? g : T(0); });
        return;
      case BinaryOp::TanhBackward:
        binary_loop<T, T, T>(it, [](T g, T y) { return g * (T(1) - y * y); });
        return;
      case BinaryOp::SigmoidBackward:
        binary_loop<T, T, T>(it, [](T g, T y) { return g * y * (T(1) - y); });
        return;
      case BinaryOp::GeluErfBackward:
        binary_loop<T, T, T>(it, [](T g, T x) {
          T cdf = T(0.5) * (T(1) + std::erf(x * T(kSqrt1_2)));
          T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
          return g * (cdf + x * pdf);
        });
        return;
      case BinaryOp::GeluTanhBackward:
        binary_loop<T, T, T>(it, [](T g, T x) {
          T inner = T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x);
          T t = std::tanh(inner);
          T d_inner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCoeff) * x * x);
          return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * d_inner);
        });
        return;
      default:
        break;
    }
  }
  fail("binary op {}: not supported for dtype {}", static_cast<int>(op), dtype_name(dtype_of<T>::value));
}

template <typename T>
void compare_typed(BinaryOp op, const StridedIter<3>& it) {
  switch (op) {
    case BinaryOp::Eq: binary_loop<bool, T, T>(it, [](T x, T y) { return x == y; }); return;
    case BinaryOp::Ne: binary_loop<bool, T, T>(it, [](T x, T y) { return x != y; }); return;
    case BinaryOp::Lt: binary_loop<bool, T, T>(it, [](T x, T y) { return x < y; }); return;
    case BinaryOp::Le: binary_loop<bool, T, T>(it, [](T x, T y) { return x <= y; }); return;
    case BinaryOp::Gt: binary_loop<bool, T, T>(it, [](T x, T y) { return x > y; }); return;
    case BinaryOp::Ge: binary_loop<bool, T, T>(it, [](T x, T y) { return x >= y; }); return;
    case BinaryOp::LogicalAnd:
      binary_loop<bool, T, T>(it, [](T x, T y) { return x != T(0) && y != T(0); });
      return;
    case BinaryOp::LogicalOr:
      binary_loop<bool, T, T>(it, [](T x, T y) { return x != T(0) || y != T(0); });
      return;
    case BinaryOp::LogicalXor:
      binary_loop<bool, T, T>(it, [](T x, T y) { return (x != T(0)) != (y != T(0)); });
      return;
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
        // bool arithmetic as PyTorch: add is logical or, mul is logical and.
        if (op == BinaryOp::Add || op == BinaryOp::Max) binary_loop<bool, bool, bool>(it, [](bool x, bool y) { return x || y; });
        else if (op == BinaryOp::Mul || op == BinaryOp::Min) binary_loop<bool, bool, bool>(it, [](bool x, bool y) { return x && y; });
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
    ternary_loop<T, bool, T, T>(it, [](bool c, T x, T y) { return c ? x : y; });
  });
}

}  // namespace chorus::kernels::cpu
