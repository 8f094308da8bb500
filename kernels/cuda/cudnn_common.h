// What the cuDNN wrappers (cudnn_conv.cpp, cudnn_bn.cpp, cudnn_pool.cpp; g++ with cudnn.h) share:
// status checks, one cuDNN handle per device and thread set to that thread's current stream, the data
// types of the plans (cudnn_plan.h), tensor descriptors, the alpha/beta scalars, and the copies that
// take an operand cuDNN does not run to chorus's direct kernels.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>

#include "kernels/cuda/cudnn_plan.h"
#include "kernels/cuda/kernels.h"
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
  if (handles[device] == nullptr) {
    // Counted as a host synchronization, as sim models a handle's creation ([A library handle is
    // made at a thread's first call], kernels/sim/sim_kernels.cpp).
    check_cudnn(cudnnCreate(&handles[device]), "cudnnCreate");
    note_host_sync();
  }
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

// An owned cudnnTensorDescriptor_t: empty (for cuDNN to derive into), or set from a plan's 4-D dims
// and strides (NCHW or NHWC alike: cuDNN reads the layout from the strides).
struct TensorDescriptor {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDescriptor() { check_cudnn(cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor"); }
  explicit TensorDescriptor(const cudnn_plan::TensorDesc& t) : TensorDescriptor() {
    check_cudnn(cudnnSetTensorNdDescriptor(d, cudnn_type(t.type), 4, t.dims.data(), t.strides.data()),
                "cudnnSetTensorNdDescriptor");
  }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(d); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
};

// An operand of chorus's direct kernels (conv.cu, pool.cu), which know NCHW float32/float64 only: t
// itself when it is one, else an NCHW copy (float32 for half precision; undefined stays undefined).
// write_back puts a result computed in such a copy into the caller's tensor (rounding half precision
// once).
inline Tensor direct_operand(const Tensor& t) {
  const bool half = t.defined() && (t.dtype() == kFloat16 || t.dtype() == kBFloat16);
  if (!t.defined() || (t.is_contiguous() && !half)) return t;
  Tensor f = make_tensor(t.sizes(), half ? kFloat32 : t.dtype(), t.device());
  copy(f, t);
  return f;
}
inline void write_back(const Tensor& dst, const Tensor& f) {
  if (dst.defined() && !f.is_same(dst)) copy(dst, f);
}

// alpha = 1 and beta = 0 as cuDNN reads them: double for double compute, float otherwise.
struct Scalars {
  float f1 = 1.f, f0 = 0.f;
  double d1 = 1.0, d0 = 0.0;
  bool dbl;
  explicit Scalars(cudnn_plan::DataType compute) : dbl(compute == cudnn_plan::DataType::Double) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : &f1; }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : &f0; }
};

}  // namespace chorus::kernels::cuda_impl
