// Scalar: a number passed to an op (add(t, 2), full(shape, 0.5)), kept as integer, float or bool so
// that integer tensors stay exact and type promotion can follow PyTorch (int tensor + 2.5 -> float).
#pragma once

#include <cstdint>
#include <type_traits>

#include "tensor/dtype.h"

namespace chorus {

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };

  Scalar() : kind_(Kind::Int), i_(0) {}
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(Kind::Float), d_(static_cast<double>(v)) {}  // NOLINT
  Scalar(Half v) : kind_(Kind::Float), d_(static_cast<float>(v)) {}      // NOLINT
  Scalar(BFloat16 v) : kind_(Kind::Float), d_(static_cast<float>(v)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  bool is_integral() const { return kind_ != Kind::Float; }

  template <typename T>
  T to() const {
    if (kind_ == Kind::Float) {
      if constexpr (std::is_same_v<T, bool>) return d_ != 0.0;
      else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        return T(static_cast<float>(d_));
      else return static_cast<T>(d_);
    }
    if constexpr (std::is_same_v<T, bool>) return i_ != 0;
    else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return T(static_cast<float>(i_));
    else return static_cast<T>(i_);
  }
  double to_double() const { return to<double>(); }
  // The dtype a tensor made from this scalar alone would get: bool, int64 or float32 (as torch.tensor).
  DType default_dtype() const {
    return kind_ == Kind::Bool ? DType::Bool : kind_ == Kind::Int ? DType::Int64 : DType::Float32;
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

}  // namespace chorus
