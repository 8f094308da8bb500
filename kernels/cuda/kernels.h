// The CUDA kernels of the table (kernels/kernel_table.h), one .cu file per op family; each has the
// signature and semantics of its cpu twin (kernels/cpu/kernels.h, nn_basic.h, conv.h). Plain C++:
// table.cpp (g++) fills every entry of the cuda KernelTable from the kernels the .cu files define.
#pragma once

#include "kernels/kernel_table.h"

namespace chorus::kernels::cuda_impl {

#define CHORUS_CUDA_DECLARE(name, params, args) void name params;
CHORUS_KERNEL_LIST(CHORUS_CUDA_DECLARE)
#undef CHORUS_CUDA_DECLARE

// conv2d and conv2d_backward go through cuDNN (cudnn_conv.cpp) unless chorus::cuda::cudnn_enabled()
// is off or cuDNN cannot run the case; these are chorus's direct kernels (conv.cu), the fallback.
void conv2d_direct(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
                   int64_t groups);
void conv2d_backward_direct(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                            const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Window2d& w,
                            int64_t groups);

}  // namespace chorus::kernels::cuda_impl
