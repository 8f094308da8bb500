// Helpers shared by the tensor tests. References are plain loops in double over explicit indices,
// so everything here reads a tensor's elements straight from memory through its own sizes and
// strides (never through the copy or conversion kernels under test), builds seeded random inputs
// of every dtype and layout, and compares a result with expected values, printing both on mismatch.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace chorus::testing {

// The dtypes every op family is walked over (float16/bfloat16 have their own cases).
inline const std::vector<DType> kMainDTypes = {kFloat32, kFloat64, kInt64, kInt32, kUInt8, kBool};

inline int64_t count_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Row-major multi-index of `linear` in `shape`.
inline std::vector<int64_t> unravel(int64_t linear, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = linear % shape[d];
    linear /= shape[d];
  }
  return idx;
}

// Element `idx` of t, read through t's strides and converted to double.
inline double read(const Tensor& t, const std::vector<int64_t>& idx) {
  int64_t offset = 0;
  for (size_t d = 0; d < idx.size(); ++d) offset += idx[d] * t.strides()[d];
  const char* p = static_cast<const char*>(t.raw_data_ptr()) + offset * static_cast<int64_t>(t.element_size());
  switch (t.dtype()) {
    case kBool: {
      uint8_t b;
      std::memcpy(&b, p, 1);
      return b != 0 ? 1.0 : 0.0;
    }
    case kUInt8: return *reinterpret_cast<const uint8_t*>(p);
    case kInt32: return *reinterpret_cast<const int32_t*>(p);
    case kInt64: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case kFloat16: return static_cast<float>(*reinterpret_cast<const Half*>(p));
    case kBFloat16: return static_cast<float>(*reinterpret_cast<const BFloat16*>(p));
    case kFloat32: return *reinterpret_cast<const float*>(p);
    case kFloat64: return *reinterpret_cast<const double*>(p);
  }
  return NAN;
}

// Every element of t in row-major logical order.
inline std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  const int64_t n = count_of(t.sizes());
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(read(t, unravel(i, t.sizes())));
  return out;
}

// NumPy broadcasting, written independently of chorus's broadcast_shapes.
inline Shape broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i + a.size() < n ? 1 : a[i + a.size() - n];
    const int64_t db = i + b.size() < n ? 1 : b[i + b.size() - n];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Element of t seen at `out_idx` of a broadcast result (leading dims dropped, size-1 dims pinned).
inline double read_broadcast(const Tensor& t, const std::vector<int64_t>& out_idx) {
  const size_t off = out_idx.size() - t.sizes().size();
  std::vector<int64_t> idx(t.sizes().size());
  for (size_t d = 0; d < idx.size(); ++d) idx[d] = t.sizes()[d] == 1 ? 0 : out_idx[d + off];
  return read(t, idx);
}

// The broadcast result of f(a, b) element by element, in double.
template <typename F>
std::vector<double> reference_binary(const Tensor& a, const Tensor& b, const F& f) {
  const Shape shape = broadcast(a.sizes(), b.sizes());
  std::vector<double> out;
  for (int64_t i = 0; i < count_of(shape); ++i) {
    const auto idx = unravel(i, shape);
    out.push_back(f(read_broadcast(a, idx), read_broadcast(b, idx)));
  }
  return out;
}

template <typename F>
std::vector<double> reference_unary(const Tensor& a, const F& f) {
  std::vector<double> out;
  for (double v : values(a)) out.push_back(f(v));
  return out;
}

// True when `actual` has `shape` and every element is within atol + rtol * |expected| of
// `expected` (NaN matches NaN, infinities match exactly). On a mismatch the assertion that uses it
// reports the first bad element and both tensors' values.
inline bool matches(const Tensor& actual, const Shape& shape, const std::vector<double>& expected,
                    double rtol = 1e-6, double atol = 1e-6) {
  if (!actual.defined()) {
    UNSCOPED_INFO("result is an undefined tensor");
    return false;
  }
  if (actual.sizes() != shape) {
    UNSCOPED_INFO("shape " << shape_str(actual.sizes()) << ", expected " << shape_str(shape));
    return false;
  }
  const std::vector<double> got = values(actual);
  if (got.size() != expected.size()) {
    UNSCOPED_INFO(got.size() << " elements, expected " << expected.size());
    return false;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], e = expected[i];
    bool ok;
    if (std::isnan(e)) ok = std::isnan(g);
    else if (std::isinf(e)) ok = g == e;
    else ok = std::abs(g - e) <= atol + rtol * std::abs(e);
    if (!ok) {
      std::string all;
      for (size_t j = 0; j < got.size() && j < 64; ++j) {
        all += fmt::format("{}{} vs {}", j == 0 ? "" : "; ", got[j], expected[j]);
      }
      UNSCOPED_INFO("element " << i << " (of shape " << shape_str(shape) << ") is " << g << ", expected " << e
                               << "\n(got vs expected) " << all);
      return false;
    }
  }
  return true;
}

// Exact comparison (integers, bools, values that must not round).
inline bool matches_exactly(const Tensor& actual, const Shape& shape, const std::vector<double>& expected) {
  return matches(actual, shape, expected, 0.0, 0.0);
}

// Tolerances for comparing a kernel computing in `dtype` with a double reference.
inline double rtol_for(DType dtype) {
  switch (dtype) {
    case kFloat64: return 1e-12;
    case kFloat32: return 2e-6;
    case kFloat16: return 2e-3;
    case kBFloat16: return 1.6e-2;
    default: return 0.0;
  }
}
inline double atol_for(DType dtype) {
  switch (dtype) {
    case kFloat64: return 1e-12;
    case kFloat32: return 1e-6;
    case kFloat16: return 1e-3;
    case kBFloat16: return 1e-2;
    default: return 0.0;
  }
}

// Seeded values of `dtype`: floats ~ N(0, 1), signed integers in [-30, 30), uint8 in [0, 50),
// bools fair coin flips.
inline Tensor random_tensor(const Shape& shape, DType dtype, Generator& gen) {
  switch (dtype) {
    case kBool: return randint(0, 2, shape, {.dtype = kUInt8}, &gen).to(kBool);
    case kUInt8: return randint(0, 50, shape, {.dtype = kUInt8}, &gen);
    case kInt32:
    case kInt64: return randint(-30, 30, shape, {.dtype = dtype}, &gen);
    default: return randn(shape, {.dtype = dtype}, &gen);
  }
}

// Floats in [low, high) (for ops with a restricted domain: log, sqrt, ...).
inline Tensor random_in(const Shape& shape, double low, double high, DType dtype, Generator& gen) {
  Tensor u = rand(shape, {.dtype = kFloat64}, &gen);
  return add(mul(u, high - low), low).to(dtype);
}

enum class Layout { Contiguous, Transposed, StepSliced, Expanded };
inline const std::vector<Layout> kAllLayouts = {Layout::Contiguous, Layout::Transposed, Layout::StepSliced,
                                                Layout::Expanded};
inline const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Transposed: return "transposed";
    case Layout::StepSliced: return "step-sliced";
    case Layout::Expanded: return "expanded";
  }
  return "?";
}

// A tensor of logical `shape` laid out as asked, its values from make(stored_shape) (a contiguous
// tensor): Transposed (last two dims swapped in memory), StepSliced (every other element of a
// twice-as-long last dim), Expanded (dim 0 broadcast from one row with stride 0). A layout that
// cannot apply to a shape (Transposed on 1-D, Expanded with dim 0 of size 1) gives StepSliced.
template <typename Make>
Tensor make_in_layout(const Shape& shape, Layout layout, const Make& make) {
  if (shape.empty() || layout == Layout::Contiguous) return make(shape);
  if (layout == Layout::Transposed && shape.size() >= 2) {
    Shape stored = shape;
    std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
    Tensor t = make(stored).transpose(-1, -2);
    REQUIRE((!t.is_contiguous() || shape[shape.size() - 1] == 1 || shape[shape.size() - 2] == 1));
    return t;
  }
  if (layout == Layout::Expanded && shape[0] > 1) {
    Shape one = shape;
    one[0] = 1;
    Tensor t = make(one).expand(shape);
    REQUIRE(t.stride(0) == 0);
    return t;
  }
  Shape stored = shape;
  stored.back() *= 2;
  Tensor t = make(stored).slice(-1, 0, std::nullopt, 2);
  REQUIRE(t.sizes() == shape);
  return t;
}

inline Tensor random_layout(const Shape& shape, DType dtype, Layout layout, Generator& gen) {
  return make_in_layout(shape, layout, [&](const Shape& s) { return random_tensor(s, dtype, gen); });
}

inline bool same_storage(const Tensor& a, const Tensor& b) { return a.storage().get() == b.storage().get(); }

}  // namespace chorus::testing

// Checks that `expr` throws chorus::Error (not a crash, not another exception type) whose message
// contains what `matcher` asks for, e.g. REQUIRE_CHORUS_ERROR(add(a, b), Catch::Contains("add") && ...).
#define REQUIRE_CHORUS_ERROR(expr, matcher)        \
  do {                                             \
    REQUIRE_THROWS_AS(expr, ::chorus::Error);      \
    REQUIRE_THROWS_WITH(expr, matcher);            \
  } while (0)
