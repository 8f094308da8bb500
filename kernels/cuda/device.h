// CUDA device discovery: how many GPUs there are, what they are, and one clear error when none is.
// This header has no CUDA types in it, so any C++ file can ask "is there a GPU?" without nvcc or the
// CUDA headers. Implemented in device.cu over the CUDA runtime API.
#pragma once

#include <cstddef>
#include <string>

namespace chorus::cuda {

struct DeviceProperties {
  std::string name;             // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0;                // compute capability, e.g. 9.0 for Hopper
  int minor = 0;
  size_t total_memory_bytes = 0;
  int multiprocessor_count = 0;
};

// Number of usable CUDA devices. 0 when there is no GPU, no driver, or the driver is too old for
// this CUDA runtime: callers branch on it, so it never throws.
int device_count();

// Properties of device `index`. Throws chorus::Error saying "no CUDA device" (with the runtime's
// reason) when there is none, or naming the index and the valid range when it is out of range.
DeviceProperties device_properties(int index);

// Throws the same "no CUDA device" chorus::Error as device_properties, prefixed with `what` (the op
// or component that needed a GPU), when device_count() is 0.
void require_device(const char* what);

}  // namespace chorus::cuda
