// cuBLAS is opened at its first use, not linked (kernels/cuda/cublas_api.h): a program linking all of
// chorus (//:chorus, the CUDA backend included) starts without libcublas/libcublasLt in its memory;
// the first cublas() opens it and resolves every function; a library that cannot be opened, is not
// cuBLAS, or is another major version of it is a chorus::Error that names what was tried. Runs
// without a GPU: opening cuBLAS and asking its version and status names needs no device.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels/cuda/cublas_api.h"
#include "local_cuda/lib_paths.h"
#include "tensor/error.h"
#include "tensor/runtime.h"

namespace chorus {
namespace {

// The lines of /proc/self/maps that map a file whose path contains `needle`.
std::string mapped(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  while (std::getline(maps, line)) {
    if (line.find(needle) != std::string::npos) found += line + "\n";
  }
  return found;
}

// Read during the executable's static initialization: after every shared library it links (chorus's
// own, cudart, cuDNN, NCCL) has been loaded and initialized, before any test case runs.
// ("/libcublas" would also match chorus's own libcublas_api.so in a test's shared-object build.)
const std::string g_cublas_at_start = mapped("/libcublas.so") + mapped("/libcublasLt.so");
const bool g_loaded_at_start = cuda::cublas_loaded();

TEST_CASE("a program linking chorus's CUDA backend starts without cuBLAS", "[cuda][cublas]") {
  INFO("mapped at start:\n" << g_cublas_at_start);
  CHECK(g_cublas_at_start.empty());
  CHECK_FALSE(g_loaded_at_start);
  // The CUDA backend is linked and answers (no GPU here, or one: either way no cuBLAS is needed).
  CHECK(device_count(DeviceType::CUDA) >= 0);
}

TEST_CASE("cublas() opens cuBLAS at first use and resolves every function", "[cuda][cublas]") {
  const cuda::CublasApi& api = cuda::cublas();
  CHECK(cuda::cublas_loaded());
  CHECK((api.path == cuda::lib_paths::kCublasSoname || api.path == cuda::lib_paths::kCublasPath));
  CHECK(api.create != nullptr);
  CHECK(api.set_stream != nullptr);
  CHECK(api.gemm_ex != nullptr);
  CHECK(api.gemm_strided_batched_ex != nullptr);
  // Host-only calls, answered without a device.
  int major = -1;
  REQUIRE(api.get_property(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS);
  CHECK(major == CUBLAS_VER_MAJOR);
  CHECK(std::string(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED)) == "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(std::string(api.status_string(CUBLAS_STATUS_SUCCESS)) == "success");
  // Now it is in memory, the major version chorus was built with, with libcublasLt.
  const std::string suffix = "/libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  const std::string lines = mapped("/libcublas.so.");
  INFO("mapped:\n" << lines);
  bool versioned = false;
  for (size_t start = 0, end; start < lines.size(); start = end + 1) {
    end = lines.find('\n', start);
    const std::string line = lines.substr(start, end - start);
    if (line.size() >= suffix.size() && line.compare(line.size() - suffix.size(), suffix.size(), suffix) == 0) {
      versioned = true;
    }
  }
  CHECK(versioned);
  CHECK_FALSE(mapped("/libcublasLt.so").empty());
  // Loaded once: the same functions each call.
  CHECK(&cuda::cublas() == &api);
}

TEST_CASE("a cuBLAS that cannot be opened is an error naming each candidate", "[cuda][cublas]") {
  try {
    cuda::load_cublas({"/nonexistent/libcublas.so.13", "libchorus_no_such_cublas.so.1"});
    FAIL("opened a library that does not exist");
  } catch (const Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("cuBLAS could not be opened: tried /nonexistent/libcublas.so.13 (") != std::string::npos);
    CHECK(what.find("; libchorus_no_such_cublas.so.1 (") != std::string::npos);
    CHECK(what.find("No such file or directory") != std::string::npos);
    CHECK(what.find("set LD_LIBRARY_PATH") != std::string::npos);
  }
  CHECK_THROWS_WITH(cuda::load_cublas({}), Catch::Contains("no library to open"));
}

TEST_CASE("a library that is not cuBLAS is refused by the first missing function", "[cuda][cublas]") {
  // zlib opens, but has none of cuBLAS's functions.
  CHECK_THROWS_WITH(cuda::load_cublas({"libz.so.1"}),
                    Catch::Contains("cuBLAS: libz.so.1 has no function cublasCreate_v2") &&
                        Catch::Contains("expected the cuBLAS " + std::to_string(CUBLAS_VER_MAJOR)));
}

TEST_CASE("a library of another cuBLAS major version is refused, naming both versions", "[cuda][cublas]") {
  // libfake_cublas.so (fake_cublas.c, built beside this test) has every function's name and says
  // it is cuBLAS 1.
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string fake =
      (srcdir ? std::string(srcdir) + "/chorus/" : std::string("bazel-bin/")) + "tests/kernels/cuda/libfake_cublas.so";
  CHECK_THROWS_WITH(cuda::load_cublas({fake}),
                    Catch::Contains("cuBLAS: " + fake + " is version 1, but chorus was built with cuBLAS " +
                                    std::to_string(CUBLAS_VER_MAJOR) + "'s headers") &&
                        Catch::Contains("LD_LIBRARY_PATH"));
}

}  // namespace
}  // namespace chorus
