// The lane-parallel reductions of kernels/cpu/loops.h (simd_sum, simd_max) in every instruction-set
// variant this CPU has: every length around the lane counts (16 float / 8 double lanes in AVX2,
// twice that in AVX-512), non-zero starts, and simd_max's NaN rule (never taken, as the scalar
// `v > m ? v : m` it replaced). The values are small integers and quarters, so every order of
// summation gives the exact sum and the reference is exact.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/loops.h"
#include "tensor/ops.h"
#include "tests/kernels/cpu/capabilities.h"

namespace kc = chorus::kernels::cpu;
using chorus::testing::CapabilityGuard;

TEMPLATE_TEST_CASE("simd_sum adds every element once, at every length and start", "[cpu][loops]", float, double) {
  using T = TestType;
  CapabilityGuard guard;
  std::vector<T> v(300);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(static_cast<int>(i % 37) - 18) * T(0.25);
  for (kc::CpuCapability cap : chorus::testing::available_capabilities()) {
    kc::set_cpu_capability(cap);
    for (int64_t begin : {0, 1, 5, 16}) {
      for (int64_t end = begin; end <= 200; ++end) {
        double want = 0;
        for (int64_t i = begin; i < end; ++i) want += static_cast<double>(v[static_cast<size_t>(i)]);
        const T got = kc::simd_sum<T>(begin, end, [&](int64_t i) CHORUS_ELEMENT { return v[static_cast<size_t>(i)]; });
        INFO("capability " << static_cast<int>(cap) << ", [" << begin << ", " << end << ")");
        REQUIRE(static_cast<double>(got) == want);
      }
    }
  }
}

TEMPLATE_TEST_CASE("simd_max finds the largest element wherever it is, and never takes a NaN", "[cpu][loops]", float,
                   double) {
  using T = TestType;
  CapabilityGuard guard;
  const T inf = std::numeric_limits<T>::infinity();
  for (kc::CpuCapability cap : chorus::testing::available_capabilities()) {
    kc::set_cpu_capability(cap);
    for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100}) {
      for (int64_t begin : {0, 1, 3}) {
        if (begin >= n) continue;
        for (int64_t at = begin; at < n; ++at) {
          std::vector<T> v(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<T>((i * 7) % 11) - T(20);
          v[static_cast<size_t>(at)] = T(5);
          // A NaN beside it, and a larger value before `begin` that must not be seen.
          const int64_t nan_at = (at + 1) % n;
          if (nan_at != at && nan_at >= begin) v[static_cast<size_t>(nan_at)] = std::numeric_limits<T>::quiet_NaN();
          if (begin > 0) v[0] = T(100);
          const T got = kc::simd_max<T>(begin, n, -inf, [&](int64_t i) CHORUS_ELEMENT { return v[static_cast<size_t>(i)]; });
          INFO("capability " << static_cast<int>(cap) << ", n " << n << ", begin " << begin << ", max at " << at);
          REQUIRE(got == T(5));
        }
      }
    }
    // A NaN in the same lane as the maximum, one, two and four vectors of lanes before and after it
    // (lane counts 8, 16 and 32 cover both variants and both types): the lanes' update never takes it.
    for (int64_t stride : {8, 16, 32}) {
      for (int64_t at : {40, 41, 47, 55, 63}) {
        std::vector<T> v(100);
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(static_cast<int>(i % 13)) - T(30);
        v[static_cast<size_t>(at)] = T(5);
        v[static_cast<size_t>(at - stride)] = std::numeric_limits<T>::quiet_NaN();
        v[static_cast<size_t>(at + stride)] = std::numeric_limits<T>::quiet_NaN();
        const T got = kc::simd_max<T>(0, 100, -inf, [&](int64_t i) CHORUS_ELEMENT { return v[static_cast<size_t>(i)]; });
        INFO("capability " << static_cast<int>(cap) << ", NaN " << stride << " before and after the maximum at " << at);
        CHECK(got == T(5));
      }
    }
    // Every element NaN, or none above the start value: the start value.
    std::vector<T> nans(40, std::numeric_limits<T>::quiet_NaN());
    CHECK(kc::simd_max<T>(0, 40, -inf, [&](int64_t i) CHORUS_ELEMENT { return nans[static_cast<size_t>(i)]; }) == -inf);
    std::vector<T> small(40, T(-3));
    CHECK(kc::simd_max<T>(0, 40, T(2), [&](int64_t i) CHORUS_ELEMENT { return small[static_cast<size_t>(i)]; }) == T(2));
    CHECK(kc::simd_max<T>(7, 7, T(2), [&](int64_t i) CHORUS_ELEMENT { return small[static_cast<size_t>(i)]; }) == T(2));
  }
}

namespace {

// The element offset (in elements) of logical multi-index `idx` in a tensor of `strides`, with the
// trailing alignment and stride-0 broadcasting of make_iter.
int64_t offset_of(const std::vector<int64_t>& idx, const chorus::Tensor& t) {
  const size_t off = idx.size() - t.sizes().size();
  int64_t at = 0;
  for (size_t d = 0; d < t.sizes().size(); ++d) at += (t.sizes()[d] == 1 ? 0 : idx[d + off]) * t.strides()[d];
  return at;
}

}  // namespace

// make_iter + for_each_run visit every element of the broadcast shape once with the operands'
// elements at its logical index, whatever the strides and however the range is cut into chunks,
// for ranks from 0 to 13: past IterDims' 8 inline dims the numbers move to the heap, as the
// iteration's dims are pushed one by one. Checked element by element against offsets computed from
// the strides (no chorus op makes the reference).
TEST_CASE("make_iter and for_each_run pair every element at every rank, inline and past 8 dims", "[cpu][loops]") {
  using chorus::Tensor;
  for (int64_t nd = 0; nd <= 13; ++nd) {
    INFO("rank " << nd);
    // Sizes 2, 3, 2, 1 in turn (at rank 13, 10 dims past the size-1 ones: no merge is possible
    // with a reversed, so the iteration keeps them all); a's memory in reversed dim order (permuted),
    // b broadcast along every other dim and one dim shorter (trailing-aligned), out either row-major
    // or from a step-sliced block.
    chorus::Shape shape, b_shape;
    for (int64_t d = 0; d < nd; ++d) shape.push_back(d % 4 == 3 ? 1 : 2 + d % 2);
    for (int64_t d = 1; d < nd; ++d) b_shape.push_back(d % 2 ? 1 : shape[static_cast<size_t>(d)]);
    std::vector<int64_t> reversed, perm;
    for (int64_t d = nd - 1; d >= 0; --d) reversed.push_back(shape[static_cast<size_t>(d)]);
    for (int64_t d = nd - 1; d >= 0; --d) perm.push_back(d);
    const int64_t numel = chorus::numel_of(shape);
    const Tensor a = chorus::arange(numel, chorus::TensorOptions{.dtype = chorus::kInt64}).reshape(reversed).permute(perm);
    const Tensor b = chorus::arange(chorus::numel_of(b_shape), chorus::TensorOptions{.dtype = chorus::kInt64})
                         .mul(1000)
                         .reshape(b_shape);
    for (bool strided_out : {false, true}) {
      INFO("strided output " << strided_out);
      chorus::Shape block = shape;
      if (strided_out && nd > 0) block.back() *= 2;
      Tensor out = chorus::full(block, -1, chorus::TensorOptions{.dtype = chorus::kInt64});
      if (strided_out && nd > 0) out = out.slice(nd - 1, 0, block.back(), 2);
      REQUIRE(out.sizes() == shape);
      const auto it = kc::make_iter<3>(shape, {&out, &a, &b});
      // a's reversed strides allow no merge: every dim of size > 1 is kept (10 of rank 13's 13).
      int64_t kept = 0;
      for (int64_t size : shape) kept += size > 1 ? 1 : 0;
      REQUIRE(static_cast<int64_t>(it.shape.size()) == std::max<int64_t>(kept, 1));
      if (nd >= 11) REQUIRE(it.shape.size() > kc::IterDims::kInline);
      std::vector<int> seen(static_cast<size_t>(chorus::numel_of(block)), 0);
      const int64_t* out_base = static_cast<const int64_t*>(out.raw_data_ptr());
      const std::vector<int64_t> cuts{0, numel / 3, numel / 3 + 1, numel};
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        kc::for_each_run<3>(it, cuts[c], cuts[c + 1], [&](char** p, const int64_t* s, int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            auto* o = reinterpret_cast<int64_t*>(p[0] + i * s[0]);
            *o = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]) + *reinterpret_cast<const int64_t*>(p[2] + i * s[2]);
            ++seen[static_cast<size_t>(o - out_base)];
          }
        });
      }
      // Every logical index: out holds a + b of that index, written once.
      std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
      const auto* a_data = static_cast<const int64_t*>(a.raw_data_ptr());
      const auto* b_data = static_cast<const int64_t*>(b.raw_data_ptr());
      for (int64_t linear = 0; linear < numel; ++linear) {
        int64_t rem = linear;
        for (int64_t d = nd - 1; d >= 0; --d) {
          idx[static_cast<size_t>(d)] = rem % shape[static_cast<size_t>(d)];
          rem /= shape[static_cast<size_t>(d)];
        }
        const int64_t o = offset_of(idx, out);
        REQUIRE(seen[static_cast<size_t>(o)] == 1);
        REQUIRE(out_base[o] == a_data[offset_of(idx, a)] + b_data[offset_of(idx, b)]);
      }
    }
  }
}

TEST_CASE("IterDims keeps its numbers across the inline and heap storage", "[cpu][loops]") {
  kc::IterDims dims;
  for (int64_t v = 0; v < 11; ++v) dims.push_back(v * 7);  // moves to the heap at the 9th
  REQUIRE(dims.size() == 11);
  for (size_t i = 0; i < 11; ++i) CHECK(dims[i] == static_cast<int64_t>(i) * 7);
  dims.resize(5);  // back inline
  REQUIRE(dims.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(dims[i] == static_cast<int64_t>(i) * 7);
  dims.resize(9, -2);  // to the heap again: the 5 kept, the rest filled
  for (size_t i = 0; i < 9; ++i) CHECK(dims[i] == (i < 5 ? static_cast<int64_t>(i) * 7 : -2));
  const kc::IterDims copy = dims;  // a copy reads its own storage
  dims[0] = 99;
  CHECK(copy[0] == 0);
  CHECK(copy.size() == 9);
  kc::IterDims filled(3, 4);
  CHECK((filled.size() == 3 && filled[0] == 4 && filled[2] == 4));
}

// The iteration's dims: operands dense alike merge into one run; a transposed output is walked in its
// memory order (its smallest stride innermost), the input then stepping across, as PyTorch's
// TensorIterator orders by the output; an unstable or ascending sort, or no merging, changes these.
TEST_CASE("make_iter merges dense operands and walks the output's memory order", "[cpu][loops]") {
  using chorus::Tensor;
  const Tensor a = chorus::ones({2, 3, 4}), b = chorus::ones({2, 3, 4});
  Tensor out = chorus::empty({2, 3, 4});
  const auto dense = kc::make_iter<3>(out.sizes(), {&out, &a, &b});
  REQUIRE(dense.shape.size() == 1);
  CHECK(dense.shape[0] == 24);
  for (int k = 0; k < 3; ++k) CHECK(dense.stride[static_cast<size_t>(k)][0] == 4);
  // out: [2, 3] over a [3, 2] block (strides 1, 2 elements); in: row-major [2, 3] (3, 1).
  Tensor t_out = chorus::empty({3, 2}).t();
  const Tensor in = chorus::ones({2, 3});
  const auto walked = kc::make_iter<2>(t_out.sizes(), {&t_out, &in});
  REQUIRE(walked.shape.size() == 2);
  CHECK((walked.shape[0] == 3 && walked.shape[1] == 2));                            // dim 1 outer, dim 0 inner
  CHECK((walked.stride[0][0] == 8 && walked.stride[0][1] == 4));                    // the output's bytes
  CHECK((walked.stride[1][0] == 4 && walked.stride[1][1] == 12));                   // the input's
}
