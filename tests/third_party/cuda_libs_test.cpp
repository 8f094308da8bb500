// The CUDA libraries of @local_cuda, linked from C++ compiled by g++ (not nvcc): each one's headers
// must match the library loaded at run time, and each must be loaded from its real folder. All of
// these calls work without a GPU or driver, so this runs in CI.
#include <catch2/catch.hpp>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <nccl.h>

#include <string>

namespace {

// The file the dynamic loader opened for the library that defines `symbol`.
std::string loaded_from(const void* symbol) {
  Dl_info info{};
  REQUIRE(dladdr(symbol, &info) != 0);
  return info.dli_fname;
}

}  // namespace

TEST_CASE("cudart: runtime version matches its headers", "[third_party][cuda]") {
  int version = 0;
  REQUIRE(cudaRuntimeGetVersion(&version) == cudaSuccess);
  CHECK(version == CUDART_VERSION);
}

TEST_CASE("cublas and cublasLt: versions match their headers", "[third_party][cuda]") {
  int major = -1;
  REQUIRE(cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS);
  CHECK(major == CUBLAS_VER_MAJOR);
  CHECK(cublasLtGetVersion() == static_cast<size_t>(CUBLAS_VERSION));
}

TEST_CASE("cudnn: version matches its headers", "[third_party][cuda]") {
  CHECK(cudnnGetVersion() == static_cast<size_t>(CUDNN_VERSION));
}

TEST_CASE("nccl: version matches its headers", "[third_party][cuda]") {
  int version = 0;
  REQUIRE(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
}

TEST_CASE("cuda libraries are loaded from their real folder, not Bazel's _solib",
          "[third_party][cuda]") {
  // Their RUNPATH is $ORIGIN: cuDNN dlopen()s libcudnn_ops.so.9 & co. and cuBLAS needs cuBLASLt
  // from the same folder, which only works when $ORIGIN is that folder (cuda_configure.bzl).
  for (const void* symbol : {reinterpret_cast<const void*>(&cudnnGetVersion),
                             reinterpret_cast<const void*>(&cublasGetProperty),
                             reinterpret_cast<const void*>(&ncclGetVersion)}) {
    const std::string path = loaded_from(symbol);
    INFO(path);
    CHECK(path.find("_solib") == std::string::npos);
  }
}
