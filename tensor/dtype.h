// Element types of chorus tensors, their names and sizes, PyTorch's type promotion, and the
// dispatch helper that turns a runtime DType into a compile-time C++ type for kernels.
// float16 and bfloat16 are storage types: kernels compute them in float32 (the elementwise ones and
// batch_norm per element on the stored tensor, the others after the op layer widens them).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "tensor/error.h"

namespace chorus {

enum class DType : uint8_t { Bool, UInt8, Int32, Int64, Float16, BFloat16, Float32, Float64 };

inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;

// IEEE binary16, converted through float32 with round-to-nearest-even.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float value);  // NOLINT: implicit like c10::Half
  operator float() const;
};

// bfloat16: the upper 16 bits of a float32, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float value) {  // NOLINT
    uint32_t u;
    std::memcpy(&u, &value, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays NaN
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

size_t element_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "int64", ... as PyTorch prints them
bool is_floating(DType dtype);         // float16, bfloat16, float32, float64
bool is_integral(DType dtype, bool include_bool);
// PyTorch's promotion lattice for two tensors of these dtypes (bool < uint8 < int32 < int64 < floats).
DType promote_types(DType a, DType b);
// The dtype a kernel computes in: float32 for float16/bfloat16, the dtype itself otherwise (what the
// op layer widens to for kernels that take no 16-bit storage).
DType compute_dtype(DType dtype);

template <typename T>
struct dtype_of;
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::Float16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };

}  // namespace chorus

// Dispatch on a runtime dtype: CHORUS_DISPATCH_ALL(dtype, "op", [&]<typename T>() { ... }).
// The lambda is the variadic tail so that commas inside it need no extra parentheses.
// The variants restrict which dtypes an op accepts, and name the op and dtype when it does not.
#define CHORUS_DTYPE_CASE(ENUM, TYPE, FN) \
  case ::chorus::DType::ENUM:             \
    return FN.template operator()<TYPE>();

#define CHORUS_DISPATCH_ALL(DTYPE, OP, ...)                                                  \
  [&] {                                                                                      \
    auto&& chorus_dispatch_fn = __VA_ARGS__;                                                 \
    switch (DTYPE) {                                                                         \
      CHORUS_DTYPE_CASE(Bool, bool, chorus_dispatch_fn)                                                      \
      CHORUS_DTYPE_CASE(UInt8, uint8_t, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Int32, int32_t, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Int64, int64_t, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Float16, ::chorus::Half, chorus_dispatch_fn)                                         \
      CHORUS_DTYPE_CASE(BFloat16, ::chorus::BFloat16, chorus_dispatch_fn)                                    \
      CHORUS_DTYPE_CASE(Float32, float, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Float64, double, chorus_dispatch_fn)                                                 \
    }                                                                                        \
    ::chorus::fail("{}: unknown dtype code {}", OP, static_cast<int>(DTYPE));                \
  }()

// Compute types only: the dtypes a CPU kernel runs in after float16/bfloat16 became float32.
#define CHORUS_DISPATCH_COMPUTE(DTYPE, OP, ...)                                               \
  [&] {                                                                                      \
    auto&& chorus_dispatch_fn = __VA_ARGS__;                                                 \
    switch (DTYPE) {                                                                         \
      CHORUS_DTYPE_CASE(Bool, bool, chorus_dispatch_fn)                                                      \
      CHORUS_DTYPE_CASE(UInt8, uint8_t, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Int32, int32_t, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Int64, int64_t, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Float32, float, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Float64, double, chorus_dispatch_fn)                                                 \
      default:                                                                               \
        break;                                                                               \
    }                                                                                        \
    ::chorus::fail("{}: dtype {} is not supported by this kernel", OP,                       \
                   ::chorus::dtype_name(DTYPE));                                             \
  }()

#define CHORUS_DISPATCH_FLOATING(DTYPE, OP, ...)                                              \
  [&] {                                                                                      \
    auto&& chorus_dispatch_fn = __VA_ARGS__;                                                 \
    switch (DTYPE) {                                                                         \
      CHORUS_DTYPE_CASE(Float32, float, chorus_dispatch_fn)                                                  \
      CHORUS_DTYPE_CASE(Float64, double, chorus_dispatch_fn)                                                 \
      default:                                                                               \
        break;                                                                               \
    }                                                                                        \
    ::chorus::fail("{}: expected a floating-point tensor (float32 or float64), got {}", OP,  \
                   ::chorus::dtype_name(DTYPE));                                             \
  }()
