// CUDA device discovery over the runtime API (see device.h).
// Compiled by nvcc (//tools/build_defs:cuda.bzl) although it has no kernels: it is the first file
// that includes tensor/error.h (and so fmt) through nvcc, which keeps that path tested.
#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include "tensor/error.h"

namespace chorus::cuda {
namespace {

struct CountResult {
  int count = 0;
  cudaError_t status = cudaSuccess;
};

CountResult query_count() {
  CountResult result;
  result.status = cudaGetDeviceCount(&result.count);
  if (result.status != cudaSuccess) {
    result.count = 0;
    // Clear the error so that it does not surface from an unrelated later runtime call.
    cudaGetLastError();
  }
  return result;
}

// Why there is no device, in the runtime's words, e.g. "CUDA driver version is insufficient for
// CUDA runtime version (cudaErrorInsufficientDriver)".
std::string no_device_reason(const CountResult& result) {
  if (result.status == cudaSuccess) return "the CUDA driver reports 0 devices";
  return fmt::format("{} ({})", cudaGetErrorString(result.status), cudaGetErrorName(result.status));
}

[[noreturn]] void fail_no_device(const char* what, const CountResult& result) {
  fail("{}: no CUDA device available: {}. Run on a machine with an NVIDIA GPU and driver, or use "
       "CPU tensors.",
       what, no_device_reason(result));
}

}  // namespace

int device_count() { return query_count().count; }

DeviceProperties device_properties(int index) {
  const CountResult result = query_count();
  if (result.count == 0) fail_no_device("cuda::device_properties", result);
  CHORUS_CHECK(index >= 0 && index < result.count,
               "cuda::device_properties: device index {} is out of range; valid indices are 0 to "
               "{} ({} CUDA device{})",
               index, result.count - 1, result.count, result.count == 1 ? "" : "s");

  cudaDeviceProp prop{};
  const cudaError_t status = cudaGetDeviceProperties(&prop, index);
  CHORUS_CHECK(status == cudaSuccess, "cuda::device_properties({}): {} ({})", index,
               cudaGetErrorString(status), cudaGetErrorName(status));
  return DeviceProperties{
      .name = prop.name,
      .major = prop.major,
      .minor = prop.minor,
      .total_memory_bytes = prop.totalGlobalMem,
      .multiprocessor_count = prop.multiProcessorCount,
  };
}

void require_device(const char* what) {
  const CountResult result = query_count();
  if (result.count == 0) fail_no_device(what, result);
}

}  // namespace chorus::cuda
