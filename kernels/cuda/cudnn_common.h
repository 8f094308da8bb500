// What the cuDNN wrappers (cudnn_conv.cpp, cudnn_bn.cpp; g++ with cudnn.h) share: status checks, one
// cuDNN handle per device and thread set to that thread's current stream, and the data types of the
// plans (cudnn_plan.h).
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>

#include "kernels/cuda/cudnn_plan.h"
#include "tensor/error.h"
#include "tensor/runtime.h"

namespace chorus::kernels::cuda_impl {

inline void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) fail("cuDNN {}: {} ({})", what, cudnnGetErrorString(status), static_cast<int>(status));
}

// A handle is not thread-safe across concurrent calls, so each thread has its own per device;
// inline: one set of handles per thread for every file that includes this.
inline cudnnHandle_t handle_for(int device) {
  constexpr int kMaxDevices = 64;
  thread_local std::array<cudnnHandle_t, kMaxDevices> handles{};
  CHORUS_CHECK(device >= 0 && device < kMaxDevices, "cuDNN: device index {} out of range", device);
  if (handles[device] == nullptr) check_cudnn(cudnnCreate(&handles[device]), "cudnnCreate");
  return handles[device];
}

// The handle of `device`, ordered on this thread's current stream of it (set before every call:
// the current stream changes under stream guards).
inline cudnnHandle_t handle_on_current_stream(Device device) {
  cudnnHandle_t h = handle_for(device.index);
  check_cudnn(cudnnSetStream(h, static_cast<cudaStream_t>(current_stream(device).handle())), "cudnnSetStream");
  return h;
}

inline cudnnDataType_t cudnn_type(cudnn_plan::DataType t) {
  switch (t) {
    case cudnn_plan::DataType::Float: return CUDNN_DATA_FLOAT;
    case cudnn_plan::DataType::Double: return CUDNN_DATA_DOUBLE;
    case cudnn_plan::DataType::Half: return CUDNN_DATA_HALF;
    case cudnn_plan::DataType::BFloat16: return CUDNN_DATA_BFLOAT16;
  }
  return CUDNN_DATA_FLOAT;
}

}  // namespace chorus::kernels::cuda_impl
