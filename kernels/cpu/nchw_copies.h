// Helpers of the CPU's plane-by-plane kernels (convolution, pooling, batch norm): they read and write
// NCHW memory, so a channels-last operand goes through an NCHW copy and a channels-last result is
// copied back; and the parallel grain for loops over planes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/parallel.h"
#include "tensor/tensor.h"

namespace chorus::kernels::cpu {

// An NCHW (contiguous) view of t: t itself, or a copy in host memory (a sim device's task may touch
// host memory, never fresh device memory).
inline Tensor nchw(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor dense = make_tensor(t.sizes(), t.dtype(), kCPU);
  copy(dense, t);
  return dense;
}
// Where a kernel writes `t`'s values: t itself when contiguous, else fresh NCHW memory for write_back.
inline Tensor nchw_result(const Tensor& t) {
  return !t.defined() || t.is_contiguous() ? t : make_tensor(t.sizes(), t.dtype(), kCPU);
}
inline void write_back(const Tensor& result, const Tensor& computed) {
  if (computed.defined() && !computed.is_same(result)) copy(result, computed);
}

// Planes per task of a loop over planes of `plane_work` elements each.
inline int64_t plane_grain(int64_t plane_work) {
  return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(plane_work, 1));
}

}  // namespace chorus::kernels::cpu
