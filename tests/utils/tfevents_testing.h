// Helpers of the SummaryWriter tests: scratch folders, the test's data files, and running the
// Python oracles (read_tfevents.py, numpy_histogram.py, tools/plot.py) as child processes.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace chorus::testing {

namespace fs = std::filesystem;

// A fresh, empty folder under TEST_TMPDIR (each test case its own: cases may run alone or in any order).
inline std::string scratch_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / ("tfevents_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// A file of the test's data (runfiles under Bazel; the source tree when run by hand from the root).
inline std::string runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir != nullptr ? std::string(srcdir) + "/chorus/" + path : path;
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Runs `command` through the shell; stdin_text is fed to it when not empty. stdout and stderr are
// kept apart (stdout carries the JSON).
inline CommandResult run_command(const std::string& command, const std::string& stdin_text = "") {
  static int calls = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp != nullptr ? tmp : "/tmp") + "/cmd_" + std::to_string(::getpid()) + "_" +
                           std::to_string(calls++);
  std::string full = command + " 2>" + shell_quote(base + ".err");
  if (!stdin_text.empty()) {
    write_file(base + ".in", stdin_text);
    full += " <" + shell_quote(base + ".in");
  }
  FILE* p = ::popen(full.c_str(), "r");
  REQUIRE(p != nullptr);
  CommandResult r;
  char buf[1 << 14];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(base + ".err");
  return r;
}

// Exit status 3 from the Python helpers: a package tools/setup.sh installs is missing. The test
// fails (never skips) and says so.
inline void require_python_dependencies(const CommandResult& r, const std::string& what) {
  if (r.exit_code == 3) {
    FAIL(what << " cannot run: " << r.err
              << "\nInstall what the SummaryWriter tests need with: bash tools/setup.sh "
                 "(python3-protobuf, protobuf-compiler, python3-numpy, python3-matplotlib)");
  }
}

inline std::string python() { return "python3"; }  // Bazel's test PATH is /bin:/usr/bin:/usr/local/bin

// A fresh folder `name` filled by one of the tests' Python helpers: `python3 <script> <folder>`
// (script: a runfile path). Exit status 3 from the helper means a package is missing: the test
// fails (never skips) and says to install `packages` with tools/setup.sh.
inline std::string python_made_folder(const std::string& name, const std::string& script, const std::string& packages) {
  const std::string dir = scratch_dir(name);
  const CommandResult r = run_command(python() + " " + shell_quote(runfile(script)) + " " + shell_quote(dir));
  if (r.exit_code == 3) FAIL(script << " cannot run: " << r.err << "\nInstall " << packages << ": bash tools/setup.sh");
  INFO(script << " stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  return dir;
}

// The independent reader's JSON for the files (an object for one file, a list for several).
inline nlohmann::json read_tfevents(const std::vector<std::string>& files, int expected_exit_code = 0) {
  std::string cmd = python() + " " + shell_quote(runfile("tests/utils/read_tfevents.py"));
  for (const auto& f : files) cmd += " " + shell_quote(f);
  const CommandResult r = run_command(cmd);
  require_python_dependencies(r, "tests/utils/read_tfevents.py");
  INFO("read_tfevents.py stderr: " << r.err);
  REQUIRE(r.exit_code == expected_exit_code);
  return nlohmann::json::parse(r.out);
}
inline nlohmann::json read_tfevents(const std::string& file, int expected_exit_code = 0) {
  return read_tfevents(std::vector<std::string>{file}, expected_exit_code);
}

// The events.out.tfevents.* files directly in dir, sorted by name.
inline std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string only_event_file(const std::string& dir) {
  const std::vector<std::string> files = event_files(dir);
  INFO("event files in " << dir);
  REQUIRE(files.size() == 1);
  return files[0];
}

// What a float32 simple_value holds for a double: the JSON carries the float widened exactly.
inline double as_float32(double v) { return static_cast<double>(static_cast<float>(v)); }

inline std::string host_name() {
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof(name) - 1) == 0);
  return name;
}

}  // namespace chorus::testing
