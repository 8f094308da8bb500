// Which OpenBLAS a chorus program gets outside Bazel's tree, and what chorus does with the other
// build ([The OpenMP build outside Bazel's tree], third_party/openblas.BUILD; [OpenBLAS's own
// threads], kernels/cpu/gemm.cpp). openblas_probe (a cc_binary: chorus linked in, system libraries
// looked up at run time, as in a user's program) is run (a) as a copy in another folder, where
// Bazel's $ORIGIN-relative RUNPATH finds nothing and the loader falls back to the absolute entry for
// the OpenMP build's folder (before it: /etc/alternatives, Debian's default being the pthreads
// build; the case checks the folder the loader found the library in, so it fails without the entry
// whatever the alternatives name), and
// (b) in place with the pthreads build first on LD_LIBRARY_PATH and AVX2 imposed, where chorus must
// keep OpenBLAS to 1 thread. Negative controls (by hand, 2026-12-04): without the RUNPATH entry, (a)
// loads the pthreads build on this project's machines (parallel=1) and fails; without the thread
// check in use_openblas, (b) routes the 2-thread product to OpenBLAS and fails.
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

namespace fs = std::filesystem;

namespace {

constexpr const char* kOpenMpBuild = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0";
constexpr const char* kPthreadsDir = "/usr/lib/x86_64-linux-gnu/openblas-pthread";

// A path for the shell, in single quotes.
std::string quoted(const std::string& path) {
  std::string out = "'";
  for (char c : path) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The probe in the test's runfiles (the test runs under bazel test).
fs::path probe_path() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  REQUIRE(srcdir != nullptr);
  return fs::path(srcdir) / "chorus/tests/third_party/openblas_probe";
}

// Runs `command` through the shell and returns its "key=value" lines; `status` gets its exit status.
std::map<std::string, std::string> run(const std::string& command, int& status, std::string& output) {
  std::map<std::string, std::string> facts;
  output.clear();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char line[4096];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::string s(line);
    output += s;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    const size_t eq = s.find('=');
    if (eq != std::string::npos) facts[s.substr(0, eq)] = s.substr(eq + 1);
  }
  const int raw = ::pclose(pipe);
  status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return facts;
}

}  // namespace

TEST_CASE("a copy of a chorus program outside Bazel's tree loads OpenBLAS's OpenMP build", "[third_party][openblas]") {
  if (!fs::exists(kOpenMpBuild)) {
    std::printf("CHORUS-SKIP: %s is not installed (tools/setup.sh installs libopenblas0-openmp)\n", kOpenMpBuild);
    return;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  REQUIRE(tmp != nullptr);
  const fs::path dir = fs::path(tmp) / "openblas_copy";
  fs::create_directories(dir);
  const fs::path copy = dir / "openblas_probe";
  fs::copy_file(probe_path(), copy, fs::copy_options::overwrite_existing);
  fs::permissions(copy, fs::perms::owner_all);
  int status = 0;
  std::string output;
  auto facts = run("env -u LD_LIBRARY_PATH " + quoted(copy.string()), status, output);
  INFO("the copy printed:\n" << output);
  REQUIRE(status == 0);
  CHECK(facts["path"] == kOpenMpBuild);
  CHECK(facts["parallel"] == "2");
  CHECK(facts["config"].find("USE_OPENMP") != std::string::npos);
}

TEST_CASE("with OpenBLAS's pthreads build loaded, chorus gives OpenBLAS products at 1 thread only", "[third_party][openblas]") {
  if (!fs::exists(fs::path(kPthreadsDir) / "libopenblas.so.0")) {
    std::printf("CHORUS-SKIP: %s/libopenblas.so.0 is not installed, so chorus cannot be run with it\n", kPthreadsDir);
    return;
  }
  int status = 0;
  std::string output;
  // AVX2 imposed: only where oneDNN runs AVX2 code does a weight gradient go to OpenBLAS at all.
  auto facts = run(std::string("env LD_LIBRARY_PATH=") + kPthreadsDir + " CHORUS_CPU_CAPABILITY=avx2 " + quoted(probe_path().string()),
                   status, output);
  INFO("the probe printed:\n" << output);
  REQUIRE(status == 0);
  REQUIRE(facts["path"] == std::string(kPthreadsDir) + "/libopenblas.so.0");
  REQUIRE(facts["parallel"] == "1");
  CHECK(facts["route_1"] == "openblas");
  // At 2 threads oneDNN's own way for this shape under AVX2: C^T = B^T A, C its transpose.
  CHECK(facts["route_2"] == "transpose_c");
  // The 2-thread product (oneDNN's) within float32 rounding of the float64 sum: 128 products of N(0, 1)
  // values, each below about 20 in magnitude.
  REQUIRE(!facts["max_error"].empty());
  const double err = std::stod(facts["max_error"]);
  CHECK(err <= 4.0 * 128 * std::ldexp(1.0, -24) * 20.0);
  CHECK(err > 0.0);

  // And the OpenMP build Bazel links, in place: OpenBLAS at 2 threads too (the route is unchanged there).
  facts = run("env -u LD_LIBRARY_PATH CHORUS_CPU_CAPABILITY=avx2 " + quoted(probe_path().string()), status, output);
  INFO("in place, the probe printed:\n" << output);
  REQUIRE(status == 0);
  CHECK(facts["parallel"] == "2");
  CHECK(facts["route_1"] == "openblas");
  CHECK(facts["route_2"] == "openblas");
}
