// CPU kernels for convolution, pooling and batch normalization (float32 or float64). Convolution is
// im2col + Eigen GEMM per sample and group, threads over the batch; a 1x1 stride-1 unpadded
// convolution skips im2col and multiplies the input in place. Convolution and pooling also take
// channels-last tensors: oneDNN's NHWC primitives where onednn_conv.h takes the convolution, NCHW
// copies otherwise.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"
#include "tensor/tensor.h"

namespace chorus::kernels::cpu {

using kernels::Window2d;

// out [N, C_out, OH, OW]; x [N, C_in, H, W]; weight [C_out, C_in/groups, kH, kW]; bias [C_out] or
// undefined.
void conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
            int64_t groups);
// Any of grad_x, grad_weight, grad_bias may be undefined (not wanted). grad_out [N, C_out, OH, OW].
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                     const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups);

// Pooling: x [N, C, H, W] and out [N, C, OH, OW] (and grad_x, grad_out in backward), each dense NCHW
// or channels-last; the kernels compute plane by plane in NCHW (copies for channels-last operands).
// max_pool2d: indices (int64, flat h*W+w into the input plane, NCHW-contiguous [N, C, OH, OW]) are
// written when defined; undefined, none are kept. max_pool2d_backward scatters grad_out by indices when
// they are defined, else by the arg-max found again from x and out ([Max-pool arg-max],
// kernels/shared/pool_math.h: the element the indices would have named); x and out are only read then.
void max_pool2d(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w);
void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const Tensor& x,
                         const Tensor& out, const Window2d& w);
void avg_pool2d(const Tensor& out, const Tensor& x, const Window2d& w, bool count_include_pad);
void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Window2d& w, bool count_include_pad);
// Window of output cell o over an input of `in` cells split into `out` parts, as PyTorch:
// [floor(o*in/out), ceil((o+1)*in/out)).
void adaptive_avg_pool2d(const Tensor& out, const Tensor& x, int64_t in_h, int64_t in_w, int64_t out_h,
                         int64_t out_w);
void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, int64_t in_h, int64_t in_w,
                                  int64_t out_h, int64_t out_w);

// x viewed as [N, C, S] (contiguous). Training (use_batch_stats): per-channel batch mean and biased
// variance; writes save_mean and save_rstd [C]; and when running_mean/var are defined, updates them
// with momentum and the unbiased variance. Eval: normalizes with running_mean/var (save_* get
// those statistics, for backward). weight/bias [C] or undefined. x and out may be float16/bfloat16
// with every [C] tensor float32 (the mixed precision of cuDNN and PyTorch under autocast): the math
// is in float, out rounded once; otherwise every tensor has x's dtype.
void batch_norm(const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x,
                const Tensor& weight, const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                bool use_batch_stats, double momentum, double eps, int64_t n, int64_t c, int64_t s);
// Gradients of batch_norm; use_batch_stats selects the training-mode formula (statistics depend on x).
// dtypes as batch_norm's: grad_out and grad_x in x's dtype, grad_weight and grad_bias as weight's.
void batch_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                         const Tensor& grad_out, const Tensor& x, const Tensor& save_mean, const Tensor& save_rstd,
                         const Tensor& weight, bool use_batch_stats, int64_t n, int64_t c, int64_t s);

}  // namespace chorus::kernels::cpu
