// The cuBLAS call for C = alpha * A @ B + beta * C on strided (optionally batched) views: which
// operand goes first, transposes, m/n/k, leading dims and batch strides, or which operands must
// first be copied to a dense buffer. Plain C++ without CUDA types: CI runs each plan through
// OpenBLAS's column-major cblas_?gemm, which takes the same arguments as cublas?gemm(StridedBatched).
#pragma once

#include <cstdint>

namespace chorus::cuda {

// A [rows, cols] matrix view, strides in elements; batch_stride steps from one matrix of a batch
// to the next (0: the same matrix for every batch entry, i.e. broadcast).
struct MatrixLayout {
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0;
  int64_t batch_stride = 0;
};

enum class GemmOp { N, T };  // CUBLAS_OP_N / CUBLAS_OP_T (CblasNoTrans / CblasTrans)

// One column-major call, in cuBLAS's argument order:
//   gemm(transa, transb, m, n, k, alpha, first, lda, [stride_a], second, ldb, [stride_b], beta, C,
//        ldc, [stride_c], [batch])
// Column-major C = A @ B when C's columns are contiguous (first = A); otherwise, the usual trick
// for row-major C: C^T = B^T @ A^T (first = B, m and n swapped). "a" and "b" in the names below
// are cuBLAS's first and second operands, which are chorus's B and A when first_is_b.
struct GemmPlan {
  // Operands that no column-major view describes (neither stride 1, a leading dim below the
  // rows cuBLAS requires, overlapping batches of C): copy them into a dense row-major buffer
  // ([batch,] rows, cols; strides cols and 1, batch stride rows * cols, or 0 for an input whose
  // batch stride is 0) first; the call below reads (and, for C, writes) that buffer. C's copy must
  // carry its values when beta != 0 and be copied back after the call.
  bool copy_a = false, copy_b = false, copy_c = false;

  bool first_is_b = false;
  GemmOp transa = GemmOp::N, transb = GemmOp::N;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 1, ldb = 1, ldc = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // batch strides of first, second, C
  int64_t batch = 1;
  // m, n, k and the leading dims fit cuBLAS's int arguments (else the _64 entry points are needed).
  bool fits_int32 = true;
};

// Plans C[i] = alpha * A[i] @ B[i] + beta * C[i] for i < batch (A [m, k], B [k, n], C [m, n]).
// Throws chorus::Error when the shapes do not match or a size or stride is negative.
GemmPlan plan_gemm(const MatrixLayout& a, const MatrixLayout& b, const MatrixLayout& c, int64_t batch = 1);

}  // namespace chorus::cuda
