// The system libraries chorus builds on, each used once through its @repo//:target, so a broken
// third_party/*.BUILD file (missing header, wrong library path, wrong link flag) fails here, in one
// place, rather than deep inside the first layer that needs it.
#include <catch2/catch.hpp>

#include <cblas.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <Eigen/Dense>
#include <fmt/format.h>
#include <gloo/rendezvous/hash_store.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

TEST_CASE("eigen multiplies matrices", "[third_party]") {
  Eigen::Matrix2f a;
  a << 1, 2, 3, 4;
  const Eigen::Matrix2f b = a * a;
  CHECK(b(0, 0) == 7.0f);
  CHECK(b(1, 1) == 22.0f);
}

TEST_CASE("fmt formats (header and libfmt.so)", "[third_party]") {
  // fmt::vformat lives in the library, so this also proves -lfmt.
  CHECK(fmt::vformat("{}x{}", fmt::make_format_args(3, 4)) == "3x4");
  CHECK(fmt::format("{:.2f}", 1.0 / 3.0) == "0.33");
}

TEST_CASE("nlohmann json round-trips", "[third_party]") {
  const auto j = nlohmann::json::parse(R"({"shape": [2, 3], "dtype": "F32"})");
  CHECK(j["shape"][1] == 3);
  CHECK(nlohmann::json::parse(j.dump()) == j);
}

TEST_CASE("CLI11 parses flags", "[third_party]") {
  CLI::App app{"test"};
  int nproc = 1;
  app.add_option("--nproc-per-node", nproc);
  const char* argv[] = {"prog", "--nproc-per-node", "4"};
  app.parse(3, argv);
  CHECK(nproc == 4);
}

TEST_CASE("zlib computes crc32", "[third_party]") {
  const std::string data = "123456789";
  const auto crc = crc32(0L, reinterpret_cast<const Bytef*>(data.data()),
                         static_cast<uInt>(data.size()));
  CHECK(crc == 0xCBF43926UL);  // the standard CRC-32 check value
}

TEST_CASE("gloo's in-process store links and works", "[third_party]") {
  gloo::rendezvous::HashStore store;
  store.set("rank0", std::vector<char>{'o', 'k'});
  CHECK(store.get("rank0") == std::vector<char>{'o', 'k'});
}

TEST_CASE("openblas (OpenMP build) runs sgemm", "[third_party]") {
  const float a[4] = {1, 2, 3, 4};  // row-major 2x2
  float c[4] = {0, 0, 0, 0};
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, a, 2, 0.0f, c, 2);
  CHECK(c[0] == 7.0f);
  CHECK(c[3] == 22.0f);
  // The OpenMP build was loaded, not the pthread one that /etc/alternatives may point to.
  CHECK_THAT(std::string(openblas_get_config()), Catch::Matchers::Contains("USE_OPENMP"));
}
