// Matrix products beyond tensor/ops.h's public ones, for chorus's own layers.
#pragma once

#include "tensor/tensor.h"

namespace chorus {

// matmul(a, b) whose result is laid out in `like`'s memory order (like's shape must be the
// result's): on the CPU and sim, when a and b are batched (3-D or more) with one batch shape and
// `like` is dense (a permutation of a contiguous tensor's layout); otherwise plain matmul, which
// gives a contiguous result. scaled_dot_product_attention lays its output out like the query, as
// PyTorch's fused attention kernels do, so the heads of a [B, T, H, d] projection come back to
// [B, T, H * d] as a view ([Batched products of strided views], autograd/ops/linalg.cpp).
Tensor matmul_laid_out_like(const Tensor& a, const Tensor& b, const Tensor& like);

}  // namespace chorus
