// Running the example programs from a test as a user runs them: their path in the test's runfiles,
// a scratch folder per case, and a run's exit code, output and JSON summary line.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/distributed/worker_launcher.h"

namespace chorus::testing::examples {

// `path` (e.g. "examples/gpt/gpt") in the test's runfiles, or under bazel-bin/ outside Bazel.
inline std::string binary(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return (srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/")) + path;
}

// An empty path `name` in this process's scratch folder (TEST_TMPDIR, else /tmp), its parent made.
// Each case makes the folder it needs: cases run alone (a shard, --test_filter) or in any order.
inline std::string scratch(const std::string& name) {
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path p = fs::path(tmp ? tmp : "/tmp") / ("example_runs_" + std::to_string(::getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p.string();
}

struct Run {
  int code;
  std::string output;
  nlohmann::json summary;  // the {"summary": ...} line's object, if any
};

inline Run run(const std::string& cmd) {
  const CommandResult c = run_command(cmd);
  Run r{c.code, c.output, nullptr};
  const size_t at = c.output.rfind("{\"summary\":");
  if (at != std::string::npos) {
    r.summary = nlohmann::json::parse(c.output.substr(at, c.output.find('\n', at) - at))["summary"];
  }
  return r;
}

}  // namespace chorus::testing::examples
