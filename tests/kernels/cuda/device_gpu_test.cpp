// Runs only on a machine with a GPU (tag "gpu"): a real kernel launch, checked against a CPU loop.
// It fails, rather than skips, when there is no device: being run means a GPU was promised.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/device.h"
#include "tests/kernels/cuda/saxpy.h"

TEST_CASE("a GPU is present and named", "[cuda][gpu]") {
  REQUIRE(chorus::cuda::device_count() > 0);
  const auto props = chorus::cuda::device_properties(0);
  INFO("device 0: " << props.name << ", sm_" << props.major << props.minor << ", "
                    << props.total_memory_bytes << " bytes");
  CHECK(props.major >= 7);
}

TEST_CASE("saxpy on the GPU matches a CPU loop on 1M random floats", "[cuda][gpu]") {
  REQUIRE(chorus::cuda::device_count() > 0);
  const size_t n = size_t{1} << 20;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = uniform(rng);
    y[i] = uniform(rng);
  }
  const float a = 2.5f;
  std::vector<float> expected(n);
  for (size_t i = 0; i < n; ++i) expected[i] = a * x[i] + y[i];

  std::vector<float> got = y;
  chorus::cuda::testing::saxpy_on_device(a, x, got);

  // The GPU may fuse a*x+y into one FMA (one rounding instead of two): allow a few ulps.
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) {
    const float tolerance = 1e-6f * (std::fabs(a * x[i]) + std::fabs(y[i])) + 1e-6f;
    if (std::fabs(got[i] - expected[i]) > tolerance) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(got != y);  // the kernel actually wrote
}
