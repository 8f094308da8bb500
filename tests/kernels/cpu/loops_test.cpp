// The lane-parallel reductions of kernels/cpu/loops.h (simd_sum, simd_max) in every instruction-set
// variant this CPU has: every length around the lane counts (16 float / 8 double lanes in AVX2,
// twice that in AVX-512), non-zero starts, and simd_max's NaN rule (never taken, as the scalar
// `v > m ? v : m` it replaced). The values are small integers and quarters, so every order of
// summation gives the exact sum and the reference is exact.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/loops.h"
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
