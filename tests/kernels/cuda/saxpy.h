// Test-only: y = a * x + y on the GPU, the smallest kernel that proves the toolchain end to end
// (nvcc objects, cudart linking, a launch on real hardware). Used by device_gpu_test.
#pragma once

#include <vector>

namespace chorus::cuda::testing {

// Copies x and y to the device, runs the saxpy kernel, and copies y back. Throws chorus::Error
// naming the failing CUDA call.
void saxpy_on_device(float a, const std::vector<float>& x, std::vector<float>& y);

}  // namespace chorus::cuda::testing
