// Part of //tests/tensor:device_runtime_tsan_test: fails unless the test was built with
// ThreadSanitizer (bazel test --config=tsan), so that target cannot pass without checking anything.
#include <catch2/catch.hpp>

#include "tensor/sanitizers.h"

TEST_CASE("device_runtime_tsan_test is built with ThreadSanitizer (--config=tsan)") {
#if CHORUS_TSAN
  SUCCEED("built with -fsanitize=thread");
#else
  FAIL("run this target with `bazel test -c opt --config=tsan`");
#endif
}
