// cuBLAS, opened at its first use (dlopen) instead of linked into every chorus program.
//
// Why: loading libcublas loads libcublasLt, whose static initialization took 80% of a chorus
// program's start (0.42 s, 230 MB resident for `resnet --threads 5000`, which only prints a refusal;
// perf, 2026-12-03) in every process that links the CUDA backend, CPU-only ones and every rank of a
// multi-process job included. cuDNN 9 opens its own parts the same way (libcudnn.so.9 is a small
// front that dlopen()s libcudnn_ops & co.). chorus calls six cuBLAS functions (kernels/cuda/blas.cpp),
// and the loader a seventh (cublasGetProperty, for the version): CublasApi below lists them.
#pragma once

#include <cublas_v2.h>

#include <string>
#include <vector>

namespace chorus::cuda {

// cublasGemmEx and cublasGemmStridedBatchedEx have C++ overloads in the header (wrappers taking the
// old cudaDataType compute type); these are the exported functions' types. cublas_api.cpp checks
// that the header declares an overload of each type, unevaluated (nothing is linked).
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                        const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                                      int, const void*, const void*, cudaDataType, int, long long int,
                                                      const void*, cudaDataType, int, long long int, const void*,
                                                      void*, cudaDataType, int, long long int, int,
                                                      cublasComputeType_t, cublasGemmAlgo_t);

// The cuBLAS functions chorus calls, resolved from one opened library.
struct CublasApi {
  decltype(&::cublasCreate) create = nullptr;  // cublasCreate_v2
  decltype(&::cublasSetStream) set_stream = nullptr;  // cublasSetStream_v2
  CublasGemmEx gemm_ex = nullptr;
  CublasGemmStridedBatchedEx gemm_strided_batched_ex = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetProperty) get_property = nullptr;
  std::string path;  // the candidate that opened
};

// Opens the first of `candidates` that dlopen() accepts (never closed) and resolves every function
// above; checks the library's major version against the headers chorus was built with. Throws
// chorus::Error naming each candidate tried with dlerror()'s reason, a missing function, or both
// versions.
CublasApi load_cublas(const std::vector<std::string>& candidates);

// The process's cuBLAS, loaded at the first call (thread-safe): its SONAME first (LD_LIBRARY_PATH,
// the loader's cache and default folders, as a linked library would be found), then the full path
// found when chorus was configured (@local_cuda//:lib_paths). A failed load is not retried: each
// call throws the same chorus::Error.
const CublasApi& cublas();

// Whether this process has loaded cuBLAS (cublas() succeeded).
bool cublas_loaded();

}  // namespace chorus::cuda
