// Part of //tests/tensor:device_runtime_tsan_test: fails unless the test was built with
// ThreadSanitizer (bazel test --config=tsan), so that target cannot pass without checking anything.
#include <catch2/catch.hpp>

#include <string>

#include "tensor/sanitizers.h"

TEST_CASE("device_runtime_tsan_test is built with ThreadSanitizer (--config=tsan)") {
#if CHORUS_TSAN
  SUCCEED("built with -fsanitize=thread");
#else
  FAIL("run this target with `bazel test -c opt --config=tsan`");
#endif
}

#if CHORUS_TSAN
// TSan's runtime, linked into the executable, defines __tsan_default_suppressions weakly and reads
// whichever definition the executable holds; one in a shared library would be ignored (the dynamic
// linker looks in the executable first), as distributed/gloo.cpp's was until 2026-12-01. Calling it
// from here resolves the same way the runtime's call does, so this sees what TSan reads.
extern "C" const char* __tsan_default_suppressions();

TEST_CASE("the executable holds chorus's TSan suppressions, where the TSan runtime reads them") {
  const std::string suppressions = __tsan_default_suppressions();
  CHECK(suppressions.find("called_from_lib:libomp.so\n") != std::string::npos);
  CHECK(suppressions.find("race:gloo::transport::tcp::UnboundBuffer::signalException\n") !=
        std::string::npos);
}
#endif
