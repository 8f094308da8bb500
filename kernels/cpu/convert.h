// Element conversion between any two chorus dtypes (float16/bfloat16 go through float32, since
// two user-defined conversions cannot chain in C++).
#pragma once

#include <type_traits>

#include "tensor/dtype.h"

namespace chorus::kernels::cpu {

template <typename T>
inline constexpr bool is_reduced_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename D, typename S>
inline D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (is_reduced_float_v<S>) {
    return convert<D>(static_cast<float>(v));
  } else if constexpr (is_reduced_float_v<D>) {
    return D(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

}  // namespace chorus::kernels::cpu
