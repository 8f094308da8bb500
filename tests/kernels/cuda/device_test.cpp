// chorus::cuda device discovery, on whatever machine runs it. With no GPU (CI) asking for a device
// must give a clear chorus::Error; with a GPU the properties must be plausible and a bad index must
// name the valid range. Each branch asserts, so neither passes by doing nothing.
#include "kernels/cuda/device.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tensor/error.h"

namespace {

// Matches a chorus::Error (not just any exception) whose message contains every one of `parts`.
Catch::Matchers::Generic::PredicateMatcher<chorus::Error> error_containing(
    std::vector<std::string> parts) {
  std::string description = "chorus::Error containing";
  for (const auto& part : parts) description += " \"" + part + "\"";
  return Catch::Matchers::Predicate<chorus::Error>(
      [parts](const chorus::Error& error) {
        const std::string message = error.what();
        for (const auto& part : parts) {
          if (message.find(part) == std::string::npos) return false;
        }
        return true;
      },
      description);
}

}  // namespace

TEST_CASE("device_count never throws and is not negative", "[cuda][device]") {
  int count = -1;
  REQUIRE_NOTHROW(count = chorus::cuda::device_count());
  CHECK(count >= 0);
}

TEST_CASE("device_properties and require_device agree with device_count", "[cuda][device]") {
  const int count = chorus::cuda::device_count();
  if (count == 0) {
    CHECK_THROWS_MATCHES(chorus::cuda::device_properties(0), chorus::Error,
                         error_containing({"device_properties", "no CUDA device"}));
    CHECK_THROWS_MATCHES(chorus::cuda::require_device("Tensor::to(cuda)"), chorus::Error,
                         error_containing({"Tensor::to(cuda)", "no CUDA device"}));
  } else {
    for (int i = 0; i < count; ++i) {
      const chorus::cuda::DeviceProperties props = chorus::cuda::device_properties(i);
      INFO("device " << i << ": " << props.name);
      CHECK_FALSE(props.name.empty());
      CHECK(props.major >= 7);
      CHECK(props.total_memory_bytes > 0);
      CHECK(props.multiprocessor_count > 0);
    }
    CHECK_NOTHROW(chorus::cuda::require_device("device_test"));
    const std::string range = "0 to " + std::to_string(count - 1);
    CHECK_THROWS_MATCHES(chorus::cuda::device_properties(count), chorus::Error,
                         error_containing({"index " + std::to_string(count), range}));
    CHECK_THROWS_MATCHES(chorus::cuda::device_properties(-1), chorus::Error,
                         error_containing({"index -1", range}));
  }
}
