// cuBLAS settings of the CUDA matmul kernels (kernels/cuda/blas.cpp). Plain C++ without CUDA types.
#pragma once

namespace chorus::cuda {

// Whether float32 matmul/bmm on CUDA may round inputs to TF32 (CUBLAS_COMPUTE_32F_FAST_TF32: about
// 1e-3 relative error, several times faster on Ampere and later). On by default, as PyTorch's
// cuBLAS setting was for years; off gives plain float32 (CUBLAS_COMPUTE_32F). Process-wide.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace chorus::cuda
