// The raw-library baselines of tests/bench:gpu_bench: cuBLAS GemmEx / GemmStridedBatchedEx and cuDNN
// convolutions called directly on chorus tensors' device memory, on the device's current stream, so
// the benchmark's events time them exactly as they time chorus's ops. Plain C++ interface: the
// implementation exists only in a build with a CUDA toolkit (available() says which); the
// device-to-device copy baseline needs no library and lives in gpu_bench.cpp.
#pragma once

#include <cstdint>
#include <memory>

#include "tensor/tensor.h"

namespace chorus::bench::raw {

// True when this binary was built with CUDA (the calls below then exist); on the sim device they
// are never made.
bool available();

// The math a GEMM runs in: float32 data in plain float32 or in TF32, or bfloat16 data (float32
// accumulation), as cuBLAS's compute types.
enum class GemmMath { Float32, TF32, BFloat16 };

// chorus's own float32 matmul setting (chorus::cuda::set_allow_tf32); a no-op without CUDA.
void set_chorus_tf32(bool allow);
// chorus's cuDNN TF32 setting (chorus::cuda::set_cudnn_allow_tf32).
void set_chorus_cudnn_tf32(bool allow);

// out[m, n] = a[m, k] · b[k, n] (row-major, dense), or per batch for 3-D operands, through
// cublasGemmEx / cublasGemmStridedBatchedEx on the current stream of a's device.
void gemm(const Tensor& a, const Tensor& b, const Tensor& out, GemmMath math);

// One convolution shape's forward, backward-data and backward-filter through cuDNN, each with the
// algorithm cuDNN's search (cudnnFind*AlgorithmEx, as chorus's conv2d) ranked fastest, and one
// workspace for all three. The constructor runs the searches; run() enqueues the three calls.
class Conv {
 public:
  // x [N, C, H, W], w [K, C, R, S], y and dy [N, K, P, Q], dx like x, dw like w; NCHW dense.
  Conv(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, const Tensor& dx, const Tensor& dw,
       int64_t stride, int64_t pad, bool allow_tf32);
  ~Conv();
  Conv(const Conv&) = delete;
  Conv& operator=(const Conv&) = delete;
  void run();
  // "fwd 1 / bwd-data 1 / bwd-filter 0" (the chosen algorithm numbers, for the log).
  std::string algorithms() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::bench::raw
