#include "tensor/dtype.h"

#include <bit>

namespace chorus {

// float32 -> binary16, round to nearest even, with subnormals, infinities and NaN.
Half::Half(float value) {
  uint32_t f = std::bit_cast<uint32_t>(value);
  uint32_t sign = (f >> 16) & 0x8000u;
  uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    bits = static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    // Add the magic 0.5f so the FPU does the rounding into the low mantissa bits.
    float shifted = std::bit_cast<float>(abs) + 0.5f;
    bits = static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
    return;
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  bits = static_cast<uint16_t>(sign | (abs >> 13));
}

Half::operator float() const {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: value = mant * 2^-24
      float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::Bool:
    case DType::UInt8:
      return 1;
    case DType::Float16:
    case DType::BFloat16:
      return 2;
    case DType::Int32:
    case DType::Float32:
      return 4;
    case DType::Int64:
    case DType::Float64:
      return 8;
  }
  fail("element_size: unknown dtype code {}", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "unknown";
}

bool is_floating(DType dtype) {
  return dtype == DType::Float16 || dtype == DType::BFloat16 || dtype == DType::Float32 ||
         dtype == DType::Float64;
}

bool is_integral(DType dtype, bool include_bool) {
  if (dtype == DType::Bool) return include_bool;
  return dtype == DType::UInt8 || dtype == DType::Int32 || dtype == DType::Int64;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // float16 with bfloat16 promotes to float32, as in PyTorch.
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  // Otherwise the enum order is the lattice: bool < uint8 < int32 < int64 < f16/bf16 < f32 < f64.
  return static_cast<uint8_t>(a) > static_cast<uint8_t>(b) ? a : b;
}

DType compute_dtype(DType dtype) {
  return (dtype == DType::Float16 || dtype == DType::BFloat16) ? DType::Float32 : dtype;
}

}  // namespace chorus
