// The job token's sources (distributed/job_token.h): a token file is refused, naming the path, what
// was found and what is expected, when it is missing, open to group or others, empty, or not a
// file; the environment's two variables; fresh tokens differ.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "distributed/job_token.h"
#include "tensor/error.h"

namespace chorus::distributed {
namespace {

std::string scratch(const std::string& name) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  return dir + "/job_token_test_" + std::to_string(::getpid()) + "_" + name;
}

std::string token_file(const std::string& name, const std::string& content, mode_t mode) {
  const std::string path = scratch(name);
  std::filesystem::remove(path);
  std::ofstream(path) << content;
  REQUIRE(::chmod(path.c_str(), mode) == 0);
  return path;
}

TEST_CASE("a token file of its owner's only gives its secret, without the surrounding whitespace",
          "[distributed][job_token]") {
  CHECK(read_job_token_file(token_file("good", "s3cret-of-the-job\n", 0600)) == "s3cret-of-the-job");
  CHECK(read_job_token_file(token_file("readonly", "  another one \r\n", 0400)) == "another one");
}

TEST_CASE("a token file with wrong permissions, empty, missing or not a file is refused, saying what was found",
          "[distributed][job_token]") {
  const std::string open_to_all = token_file("0644", "secret\n", 0644);
  CHECK_THROWS_WITH(read_job_token_file(open_to_all),
                    Catch::Contains(open_to_all) && Catch::Contains("has mode 0644") &&
                        Catch::Contains("group and others may read it") && Catch::Contains("expected mode 0600 or 0400") &&
                        Catch::Contains("chmod 600"));
  const std::string group_writable = token_file("0620", "secret\n", 0620);
  CHECK_THROWS_WITH(read_job_token_file(group_writable),
                    Catch::Contains("has mode 0620") && Catch::Contains("write or execute"));
  const std::string empty = token_file("empty", "", 0600);
  CHECK_THROWS_WITH(read_job_token_file(empty),
                    Catch::Contains(empty) && Catch::Contains("is empty (0 bytes)") && Catch::Contains("expected the job's secret"));
  const std::string blank = token_file("blank", " \n\n", 0600);
  CHECK_THROWS_WITH(read_job_token_file(blank), Catch::Contains("is empty (only 3 bytes of whitespace)"));
  const std::string missing = scratch("missing");
  std::filesystem::remove(missing);
  CHECK_THROWS_WITH(read_job_token_file(missing),
                    Catch::Contains(missing) && Catch::Contains("No such file or directory") && Catch::Contains("0600"));
  const std::string dir = scratch("dir");
  std::filesystem::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  CHECK_THROWS_WITH(read_job_token_file(dir), Catch::Contains("is not a regular file"));
  const std::string huge = token_file("huge", std::string(kMaxJobTokenBytes + 1, 'x'), 0600);
  CHECK_THROWS_WITH(read_job_token_file(huge), Catch::Contains("at most 4096 bytes"));
  // Another user's file (made so by chown, which needs root).
  const std::string foreign = token_file("foreign", "secret\n", 0600);
  const uid_t other = ::geteuid() == 65534 ? 65533 : 65534;
  if (::chown(foreign.c_str(), other, static_cast<gid_t>(-1)) == 0) {
    CHECK_THROWS_WITH(read_job_token_file(foreign),
                      Catch::Contains(foreign) && Catch::Contains("belongs to user id " + std::to_string(other)) &&
                          Catch::Contains("expected this user's own file"));
  } else {
    std::printf("CHORUS-SKIP: chown of a token file to user %u needs root; the owner check is not exercised\n",
                static_cast<unsigned>(other));
  }
}

// Sets (or, with nullptr, unsets) an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (value) ::setenv(n, value, 1);
    else ::unsetenv(n);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

TEST_CASE("the environment names the token by file or by value, not both", "[distributed][job_token]") {
  {
    ScopedEnv f(kJobTokenFileEnv, nullptr), v(kJobTokenEnv, nullptr);
    CHECK(job_token_from_env().empty());
  }
  {
    ScopedEnv f(kJobTokenFileEnv, nullptr), v(kJobTokenEnv, " from-the-environment\n");
    CHECK(job_token_from_env() == "from-the-environment");
  }
  const std::string good = token_file("env_good", "from-a-file\n", 0600);
  {
    ScopedEnv f(kJobTokenFileEnv, good.c_str()), v(kJobTokenEnv, nullptr);
    CHECK(job_token_from_env() == "from-a-file");
  }
  {
    ScopedEnv f(kJobTokenFileEnv, good.c_str()), v(kJobTokenEnv, "x");
    CHECK_THROWS_WITH(job_token_from_env(), Catch::Contains("both CHORUS_JOB_TOKEN_FILE and CHORUS_JOB_TOKEN are set"));
  }
  const std::string bad = token_file("env_bad", "secret", 0644);
  {
    ScopedEnv f(kJobTokenFileEnv, bad.c_str()), v(kJobTokenEnv, nullptr);
    CHECK_THROWS_WITH(job_token_from_env(), Catch::Contains("has mode 0644"));
  }
  {
    ScopedEnv f(kJobTokenFileEnv, nullptr), v(kJobTokenEnv, "  \t");
    CHECK_THROWS_WITH(job_token_from_env(), Catch::Contains("holds only whitespace"));
  }
}

TEST_CASE("new job tokens are 64 hex digits and never repeat", "[distributed][job_token]") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string t = new_job_token();
    CHECK(t.size() == 64);
    CHECK(t.find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(t);
  }
  CHECK(seen.size() == 100);
}

}  // namespace
}  // namespace chorus::distributed
