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

// batch_norm and batch_norm_backward go through cuDNN (cudnn_bn.cpp) unless the plan
// (cudnn_bn_plan.h) or cuDNN sends the call back; these are chorus's own kernels (nn.cu), the fallback,
// with the table entries' signatures and semantics.
void batch_norm_direct(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                       bool use_batch_stats, double momentum, double eps, int64_t n, int64_t c, int64_t s);
void batch_norm_backward_direct(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& save_mean,
                                const Tensor& save_rstd, const Tensor& weight, bool use_batch_stats, int64_t n,
                                int64_t c, int64_t s);
// Eval mode through cuDNN's inference call, which writes no statistics: save_mean = running_mean,
// save_rstd = 1 / sqrt(running_var + eps), as chorus's eval forward defines them (nn.cu).
void batch_norm_inference_stats(const Tensor& save_mean, const Tensor& save_rstd, const Tensor& running_mean,
                                const Tensor& running_var, double eps, int64_t c);

// The pooling entries go through cuDNN (cudnn_pool.cpp) unless the plan (cudnn_pool_plan.h) or cuDNN
// sends the call back; these are chorus's own kernels (pool.cu), the fallback, with the table entries'
// semantics but NCHW-contiguous float32/float64 tensors only (cudnn_pool.cpp makes such copies).
void max_pool2d_direct(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w);
void max_pool2d_backward_direct(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const Tensor& x,
                                const Tensor& out, const Window2d& w);
void avg_pool2d_direct(const Tensor& out, const Tensor& x, const Window2d& w, bool count_include_pad);
void avg_pool2d_backward_direct(const Tensor& grad_x, const Tensor& grad_out, const Window2d& w,
                                bool count_include_pad);
void adaptive_avg_pool2d_direct(const Tensor& out, const Tensor& x, int64_t in_h, int64_t in_w, int64_t out_h,
                                int64_t out_w);
void adaptive_avg_pool2d_backward_direct(const Tensor& grad_x, const Tensor& grad_out, int64_t in_h, int64_t in_w,
                                         int64_t out_h, int64_t out_w);

}  // namespace chorus::kernels::cuda_impl
