// Helpers for the fuzz targets (tests/fuzz/*_fuzz.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

namespace chorus::fuzz {

// A file path private to this process for the parsers that read files: in the test's temporary
// folder under Bazel, else /dev/shm (memory, so a fuzzer's thousands of writes a second stay cheap).
inline std::string scratch_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string base = dir ? dir : (::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  return base + "/chorus-fuzz-" + std::to_string(::getpid()) + "-" + name;
}

// Writes `data` to `path`, replacing what was there; aborts if it cannot (not a finding).
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

// A failed property of a parser's result: abort, so libFuzzer (and the corpus test) report it.
inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property failed: %s\n", what);
    std::abort();
  }
}

}  // namespace chorus::fuzz
