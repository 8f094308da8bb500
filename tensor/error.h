// chorus::Error — the one exception type for user mistakes and runtime failures.
// Messages name the op or component, what was given, and what was expected, so a user can fix the
// call without reading chorus's source. CHORUS_CHECK builds such a message with fmt.
#pragma once

// fmt/core.h alone: every file includes this header, and fmt/format.h and fmt/ranges.h cost each
// file 0.1-0.3 s to parse (docs/build.md). A file that formats a range (a shape, a list of dims)
// includes <fmt/ranges.h> itself, one that calls fmt::join <fmt/format.h>.
#include <fmt/core.h>

#include <stdexcept>
#include <string>

namespace chorus {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A device runtime that is shutting down because the process is exiting: CUDA's runtime unloads
// itself from an atexit handler registered at its first call (cudaErrorCudartUnloading, "driver
// shutting down"), so an object destroyed later in static destruction (a process group whose
// first use came before the first CUDA call) meets it; sim does the same. Work can no longer be
// observed or freed, and the process's end frees everything: destructors and watchdogs that catch
// it treat the work as finished, as PyTorch's do.
class DeviceUnloading : public Error {
 public:
  explicit DeviceUnloading(const std::string& message) : Error(message) {}
};

// Throws chorus::Error with a fmt-formatted message. Used by every argument check.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace chorus

// CHORUS_CHECK(cond, "op: got {}, expected {}", a, b): throws chorus::Error when cond is false.
#define CHORUS_CHECK(cond, ...)        \
  do {                                 \
    if (!(cond)) ::chorus::fail(__VA_ARGS__); \
  } while (0)
