// Test-only saxpy kernel and its host launcher (see saxpy.h).
#include "tests/kernels/cuda/saxpy.h"

#include <cuda_runtime.h>

#include "tensor/error.h"

namespace chorus::cuda::testing {
namespace {

__global__ void saxpy_kernel(float a, const float* x, float* y, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

void check(cudaError_t status, const char* call) {
  CHORUS_CHECK(status == cudaSuccess, "saxpy_on_device: {} failed: {} ({})", call,
               cudaGetErrorString(status), cudaGetErrorName(status));
}

}  // namespace

void saxpy_on_device(float a, const std::vector<float>& x, std::vector<float>& y) {
  CHORUS_CHECK(x.size() == y.size(), "saxpy_on_device: x has {} elements, y has {}", x.size(),
               y.size());
  const size_t n = x.size();
  const size_t bytes = n * sizeof(float);
  float* d_x = nullptr;
  float* d_y = nullptr;
  check(cudaMalloc(&d_x, bytes), "cudaMalloc(x)");
  check(cudaMalloc(&d_y, bytes), "cudaMalloc(y)");
  check(cudaMemcpy(d_x, x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(x)");
  check(cudaMemcpy(d_y, y.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(y)");
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  saxpy_kernel<<<blocks, threads>>>(a, d_x, d_y, n);
  check(cudaGetLastError(), "saxpy_kernel launch");
  check(cudaMemcpy(y.data(), d_y, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(y back)");
  check(cudaFree(d_x), "cudaFree(x)");
  check(cudaFree(d_y), "cudaFree(y)");
}

}  // namespace chorus::cuda::testing
