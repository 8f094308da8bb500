// Per-element math shared by the CPU kernels (g++) and the CUDA kernels (nvcc): one functor per
// unary, binary, comparison, logical, activation and fused-backward op of kernels/cpu/kernels.h,
// plus pow, clamp, where and the dtype casts (float16/bfloat16 <-> float, bit for bit as tensor/dtype).
// Both sides instantiate these same functors, so an op's arithmetic is written once. Only what
// device code has is used: no exceptions, no std::function, C math functions by their exact name.
#pragma once

#include <math.h>  // expf & co. in the global namespace, where CUDA declares its device versions

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/shared/hd.h"

namespace chorus {
struct Half;      // tensor/dtype.h: IEEE binary16 storage, a 16-bit `bits` member
struct BFloat16;  // tensor/dtype.h: bfloat16 storage, a 16-bit `bits` member
}  // namespace chorus

namespace chorus::kernels::shared {

// ------------------------------------------------------------------ math functions, by exact type
// The float overloads call the C float functions (expf, ...): the same functions std::exp(float)
// calls on the host, and the ones CUDA's device library provides under those names. `::exp` on a
// float would silently compute in double on the host and give other bits.
namespace math {
#define CHORUS_SHARED_MATH_1(NAME)                                              \
  CHORUS_HD CHORUS_INLINE float NAME(float x) { return ::NAME##f(x); }          \
  CHORUS_HD CHORUS_INLINE double NAME(double x) { return ::NAME(x); }
CHORUS_SHARED_MATH_1(exp)
CHORUS_SHARED_MATH_1(log)
CHORUS_SHARED_MATH_1(log1p)
CHORUS_SHARED_MATH_1(sqrt)
CHORUS_SHARED_MATH_1(tanh)
CHORUS_SHARED_MATH_1(erf)
CHORUS_SHARED_MATH_1(sin)
CHORUS_SHARED_MATH_1(cos)
CHORUS_SHARED_MATH_1(floor)
CHORUS_SHARED_MATH_1(ceil)
CHORUS_SHARED_MATH_1(trunc)
CHORUS_SHARED_MATH_1(rint)
CHORUS_SHARED_MATH_1(expm1)
CHORUS_SHARED_MATH_1(log2)
CHORUS_SHARED_MATH_1(log10)
#undef CHORUS_SHARED_MATH_1
CHORUS_HD CHORUS_INLINE float pow(float x, float y) { return ::powf(x, y); }
CHORUS_HD CHORUS_INLINE double pow(double x, double y) { return ::pow(x, y); }
}  // namespace math

// Constants of the GELU formulas (as doubles; each functor rounds them to T once).
inline constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2*pi)
inline constexpr double kGeluCoeff = 0.044715;

// ------------------------------------------------------------------ unary
struct Neg {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return static_cast<T>(-x); }
};
struct Abs {  // -0.0 stays -0.0 and NaN stays NaN (only values below zero are negated)
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) return x;
    else return x < 0 ? static_cast<T>(-x) : x;
  }
};
struct Sign {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return static_cast<T>((T(0) < x) - (x < T(0))); }
};
struct Relu {  // NaN propagates, as PyTorch's relu: only values below zero become zero
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return x < T(0) ? T(0) : x; }
};
struct LogicalNot {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x) const { return x == T(0); }
};
struct Identity {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return x; }
};
struct Square {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return x * x; }
};
// Floating point only (float, double) from here to the end of the unary ops.
struct Exp {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::exp(x); }
};
struct Log {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::log(x); }
};
struct Log1p {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::log1p(x); }
};
struct Sqrt {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::sqrt(x); }
};
struct Rsqrt {  // 1/sqrt(x), two roundings as the CPU always did (not the device's rsqrt)
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return T(1) / math::sqrt(x); }
};
struct Reciprocal {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return T(1) / x; }
};
struct Tanh {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::tanh(x); }
};
struct Sigmoid {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return T(1) / (T(1) + math::exp(-x)); }
};
struct GeluErf {  // x * Phi(x)
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const {
    return T(0.5) * x * (T(1) + math::erf(x * T(kSqrt1_2)));
  }
};
struct GeluTanh {  // the tanh approximation (approximate="tanh")
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const {
    return T(0.5) * x * (T(1) + math::tanh(T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x)));
  }
};
struct Sin {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::sin(x); }
};
struct Cos {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::cos(x); }
};
struct Floor {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::floor(x); }
};
struct Ceil {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::ceil(x); }
};
struct Round {  // halves to even, as PyTorch's round (rint in the default rounding mode)
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::rint(x); }
};
struct Trunc {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::trunc(x); }
};
struct Erf {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::erf(x); }
};
struct Expm1 {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::expm1(x); }
};
struct Log2 {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::log2(x); }
};
struct Log10 {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x) const { return math::log10(x); }
};
// The inverse error function: Giles's single-precision approximation ("Approximating the erfinv
// function", GPU Computing Gems, 2010), then Newton steps on erf(x) = y (one for float, two for
// double) so both types are accurate to a few ulps; the same code on the host and the device (the
// C library has no erfinv). erfinv(+-1) = +-inf, |y| > 1 or NaN gives NaN.
struct Erfinv {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T y) const {
    if (!(y >= T(-1) && y <= T(1))) return (y - y) / (y - y);  // NaN for |y| > 1 and NaN
    if (y == T(1) || y == T(-1)) return y > T(0) ? T(INFINITY) : T(-INFINITY);
    // w in T's precision: in float, 1 - y loses the digits that decide the tails of a double y.
    T w = -math::log((T(1) - y) * (T(1) + y));
    T p;
    if (w < T(5)) {
      w = w - T(2.5);
      p = T(2.81022636e-08f);
      p = T(3.43273939e-07f) + p * w;
      p = T(-3.5233877e-06f) + p * w;
      p = T(-4.39150654e-06f) + p * w;
      p = T(0.00021858087f) + p * w;
      p = T(-0.00125372503f) + p * w;
      p = T(-0.00417768164f) + p * w;
      p = T(0.246640727f) + p * w;
      p = T(1.50140941f) + p * w;
    } else {
      w = math::sqrt(w) - T(3);
      p = T(-0.000200214257f);
      p = T(0.000100950558f) + p * w;
      p = T(0.00134934322f) + p * w;
      p = T(-0.00367342844f) + p * w;
      p = T(0.00573950773f) + p * w;
      p = T(-0.0076224613f) + p * w;
      p = T(0.00943887047f) + p * w;
      p = T(1.00167406f) + p * w;
      p = T(2.83297682f) + p * w;
    }
    T x = p * y;
    // Newton on erf(x) = y: the approximation is good to ~1e-7 inside the float range, less in
    // double's far tails (|y| within 1e-12 of 1), so double takes up to 4 steps.
    const int steps = sizeof(T) == sizeof(double) ? 4 : 1;
    for (int i = 0; i < steps; ++i) {
      const T slope = T(1.12837916709551257390) * math::exp(-x * x);  // 2/sqrt(pi) exp(-x^2)
      if (slope == T(0)) break;  // beyond where erf can tell x apart
      const T step = (math::erf(x) - y) / slope;
      x = x - step;
      if (step == T(0)) break;
    }
    return x;
  }
};

// ------------------------------------------------------------------ pow, clamp
// Exact integer power by squaring (wrapping like PyTorch on overflow). Negative exponents give the
// integer result PyTorch gives: 1 for base 1, +-1 for base -1, 0 otherwise.
template <typename T>
CHORUS_HD CHORUS_INLINE T integer_pow(T base, T exp) {
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

// x ** exponent: powf/pow for floating point, integer_pow otherwise. (The CPU kernel sends the
// exponents 2, 0.5 and 1 of floating-point tensors to Square, Sqrt and Identity instead.)
template <typename T>
struct PowScalar {
  T exponent;
  CHORUS_HD CHORUS_INLINE T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return math::pow(x, exponent);
    else return integer_pow(x, exponent);
  }
};

// NaN propagates, as in PyTorch: comparisons with NaN are false, so x stays.
template <typename T>
struct Clamp {
  T lo, hi;
  bool has_lo, has_hi;
  CHORUS_HD CHORUS_INLINE T operator()(T x) const {
    if (has_lo && x < lo) x = lo;
    if (has_hi && x > hi) x = hi;
    return x;
  }
};

// ------------------------------------------------------------------ binary arithmetic
// On bool, Add and Max are logical or, Mul and Min logical and (PyTorch's bool arithmetic).
struct Add {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const { return static_cast<T>(x + y); }
};
struct Sub {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const { return static_cast<T>(x - y); }
};
template <typename T>
struct AddAlpha {  // x + alpha * y
  T alpha;
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const { return static_cast<T>(x + alpha * y); }
};
template <typename T>
struct SubAlpha {  // x - alpha * y
  T alpha;
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const { return static_cast<T>(x - alpha * y); }
};
struct Mul {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const { return static_cast<T>(x * y); }
};
struct Div {  // floating point only: integer division is promoted to float by the op layer
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const { return x / y; }
};
struct Max {  // NaN wins on either side, as torch.maximum
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) return (x != x || x > y) ? x : y;
    else return x > y ? x : y;
  }
};
struct Min {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) return (x != x || x < y) ? x : y;
    else return x < y ? x : y;
  }
};
struct Pow {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) return math::pow(x, y);
    else return integer_pow(x, y);
  }
};

// ------------------------------------------------------------------ comparisons and logical ops
struct Eq {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x == y; }
};
struct Ne {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x != y; }
};
struct Lt {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x < y; }
};
struct Le {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x <= y; }
};
struct Gt {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x > y; }
};
struct Ge {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x >= y; }
};
struct LogicalAnd {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x != T(0) && y != T(0); }
};
struct LogicalOr {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return x != T(0) || y != T(0); }
};
struct LogicalXor {
  template <typename T>
  CHORUS_HD CHORUS_INLINE bool operator()(T x, T y) const { return (x != T(0)) != (y != T(0)); }
};

// ------------------------------------------------------------------ fused backward helpers
// (g = incoming gradient, second argument = the saved value named below): one pass over memory.
struct ReluBackward {  // saved: the input; g where x > 0, else 0 (NaN inputs give 0)
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T g, T x) const { return x > T(0) ? g : T(0); }
};
struct TanhBackward {  // saved: y = tanh(x)
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T g, T y) const { return g * (T(1) - y * y); }
};
struct SigmoidBackward {  // saved: y = sigmoid(x)
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T g, T y) const { return g * y * (T(1) - y); }
};
struct GeluErfBackward {  // saved: the input; g * (Phi(x) + x * phi(x))
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T g, T x) const {
    T cdf = T(0.5) * (T(1) + math::erf(x * T(kSqrt1_2)));
    T pdf = T(kInvSqrt2Pi) * math::exp(T(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
struct GeluTanhBackward {  // saved: the input
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(T g, T x) const {
    T inner = T(kSqrt2OverPi) * (x + T(kGeluCoeff) * x * x * x);
    T t = math::tanh(inner);
    T d_inner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCoeff) * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * d_inner);
  }
};

// ------------------------------------------------------------------ where
struct Where {
  template <typename T>
  CHORUS_HD CHORUS_INLINE T operator()(bool c, T x, T y) const { return c ? x : y; }
};

// ------------------------------------------------------------------ dtype casts
CHORUS_HD CHORUS_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
CHORUS_HD CHORUS_INLINE float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// float32 -> IEEE binary16 bits, round to nearest even, with subnormals, infinities and NaN.
CHORUS_HD CHORUS_INLINE uint16_t float_to_half_bits(float value) {
  const uint32_t f = float_bits(value);
  const uint32_t sign = (f >> 16) & 0x8000u;
  uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (NaN keeps a quiet payload bit)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    // Adding 0.5f lets the FPU round into the low mantissa bits (2^-24 is half's smallest step).
    const float shifted = float_from_bits(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  const uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias the exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (abs >> 13));
}

CHORUS_HD CHORUS_INLINE float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: value = mant * 2^-24 (exact)
      const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return float_from_bits(out);
}

// float32 -> bfloat16 bits (the upper half of a float32), round to nearest even; NaN stays NaN.
CHORUS_HD CHORUS_INLINE uint16_t float_to_bfloat16_bits(float value) {
  uint32_t u = float_bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

CHORUS_HD CHORUS_INLINE float bfloat16_bits_to_float(uint16_t bits) {
  return float_from_bits(static_cast<uint32_t>(bits) << 16);
}

// Which 16-bit float a storage type is: 1 float16, 2 bfloat16, 0 neither. A storage type is a
// struct with a `uint16_t bits` member (chorus::Half and chorus::BFloat16, on both sides).
template <typename T>
struct ReducedFloatKind {
  static constexpr int value = 0;
};
template <>
struct ReducedFloatKind<::chorus::Half> {
  static constexpr int value = 1;
};
template <>
struct ReducedFloatKind<::chorus::BFloat16> {
  static constexpr int value = 2;
};
template <typename T>
inline constexpr bool is_reduced_float_v = ReducedFloatKind<T>::value != 0;

template <typename T>
CHORUS_HD CHORUS_INLINE float reduced_to_float(T v) {
  if constexpr (ReducedFloatKind<T>::value == 1) return half_bits_to_float(v.bits);
  else return bfloat16_bits_to_float(v.bits);
}
template <typename T>
CHORUS_HD CHORUS_INLINE T reduced_from_float(float f) {
  T out;
  if constexpr (ReducedFloatKind<T>::value == 1) out.bits = float_to_half_bits(f);
  else out.bits = float_to_bfloat16_bits(f);
  return out;
}

// Element conversion between any two chorus dtypes. float16/bfloat16 go through float32 (a double
// is first rounded to float, then to 16 bits, as the CPU always did); a float to uint8 goes through
// int64 (PyTorch's static_cast_with_inter_type: -1.5 is 255 on every device, where a direct cast of a
// negative float to an unsigned type is undefined, 255 on x86 and 0 on a GPU, whose conversion
// saturates); everything else is static_cast (so a nonzero value becomes true, and a float becomes
// an integer by truncation; a float outside a signed type's range, NaN included, is undefined in
// C++ and differs between x86 and a GPU, in PyTorch too).
template <typename D>
struct Cast {
  template <typename S>
  CHORUS_HD CHORUS_INLINE D operator()(S v) const {
    if constexpr (std::is_same_v<D, S>) return v;
    else if constexpr (is_reduced_float_v<S>) return Cast<D>{}(reduced_to_float(v));
    else if constexpr (is_reduced_float_v<D>) return reduced_from_float<D>(static_cast<float>(v));
    else if constexpr (std::is_same_v<D, uint8_t> && std::is_floating_point_v<S>) return static_cast<D>(static_cast<int64_t>(v));
    else return static_cast<D>(v);
  }
};

// ------------------------------------------------------------------ half storage, float math
// [Half storage] float16/bfloat16 tensors are storage types: a kernel loads each element widened to
// float (exact), runs the op's functor instantiated at float (the "opmath" type, as PyTorch's), and
// rounds the result to 16 bits once on store. That is bit for bit what casting the inputs to float32,
// computing in float32 and casting the result back gives, in one pass and without float32 temporaries.
// opmath_t<T>: the type a functor runs at for storage type T (float for the 16-bit floats, T otherwise).
template <typename T>
using opmath_t = std::conditional_t<is_reduced_float_v<T>, float, T>;

template <typename T>
CHORUS_HD CHORUS_INLINE opmath_t<T> to_opmath(T v) {
  if constexpr (is_reduced_float_v<T>) return reduced_to_float(v);
  else return v;
}

// Functor f run on storage values: every operand widened by to_opmath (float16/bfloat16 to float; a
// float32 operand, such as a Scalar kept in float, stays as it is), the result stored as Out (one
// rounding for a 16-bit Out, none for bool or a type f already returns).
template <typename Out, typename F>
struct InOpmath {
  F f;
  template <typename... S>
  CHORUS_HD CHORUS_INLINE Out operator()(S... v) const {
    return Cast<Out>{}(f(to_opmath(v)...));
  }
};

// The element function a CUDA kernel instantiates for storage type T: f itself for the types the
// functors compute in directly, f wrapped in InOpmath for float16/bfloat16 (Out: the stored type).
// (The CPU loops do the same through float buffers: kernels/cpu/loops.h, unary_loop_opmath.)
template <typename T, typename Out = T, typename F>
CHORUS_HD CHORUS_INLINE auto on_storage(const F& f) {
  if constexpr (is_reduced_float_v<T>) return InOpmath<Out, F>{f};
  else return f;
}

}  // namespace chorus::kernels::shared
