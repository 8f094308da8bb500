// The table of kernels a device type provides: one entry per kernel, listed once in
// CHORUS_KERNEL_LIST (kernels/dispatch.h generates the dispatching functions from the same list,
// and the sim device wraps every cpu entry from it). The cpu kernels define these signatures.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_types.h"
#include "tensor/scalar.h"
#include "tensor/tensor.h"

namespace chorus::kernels {

// X(name, (parameters), (arguments)): every kernel of the table, with the signature the cpu kernels
// (kernels/cpu/*.h, where each is documented) define. Inputs are in one dtype unless a kernel says
// otherwise; outputs are allocated by the caller. float16/bfloat16 ([Half storage],
// kernels/shared/pointwise_math.h): unary, binary, pow_scalar, clamp and where take them as stored and
// compute each element in float (binary's b may also be float32, a Scalar kept in float; comparisons
// write bool); batch_norm and batch_norm_backward take a 16-bit x, grad_out and grad_x with float32
// weight, bias, statistics and parameter gradients. The other kernels take float32/float64 (the op
// layer widens 16-bit tensors for them with compute_dtype), except where noted (gemm, conv2d and the
// pooling kernels on CUDA). conv2d and the pooling kernels take their tensors dense in NCHW or
// channels-last (kernels/cpu/conv.h says how).
#define CHORUS_KERNEL_LIST(X)                                                                                     \
  X(copy, (const Tensor& dst, const Tensor& src), (dst, src))                                                     \
  X(fill, (const Tensor& dst, const Scalar& value), (dst, value))                                                 \
  X(unary, (UnaryOp op, const Tensor& out, const Tensor& in), (op, out, in))                                      \
  X(pow_scalar, (const Tensor& out, const Tensor& in, double exponent), (out, in, exponent))                      \
  X(clamp, (const Tensor& out, const Tensor& in, const Scalar* min, const Scalar* max), (out, in, min, max))      \
  X(binary, (BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha),              \
    (op, out, a, b, alpha))                                                                                       \
  X(where, (const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b), (out, cond, a, b))          \
  X(reduce, (ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<int64_t>& dims),                 \
    (op, out, in, dims))                                                                                          \
  X(arg_reduce, (bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim),        \
    (is_max, values, indices, in, dim))                                                                           \
  X(softmax, (const Tensor& out, const Tensor& in, int64_t dim, bool log), (out, in, dim, log))                   \
  X(softmax_backward,                                                                                             \
    (const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, int64_t dim, bool log),                    \
    (grad_in, grad_out, out, dim, log))                                                                           \
  X(gemm, (const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta), (c, a, b, alpha, beta))  \
  X(bmm, (const Tensor& c, const Tensor& a, const Tensor& b), (c, a, b))                                          \
  X(index_select, (const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index), (out, in, dim, index)) \
  X(gather, (const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index), (out, in, dim, index))       \
  X(scatter, (const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate),          \
    (self, dim, index, src, accumulate))                                                                          \
  X(index_add, (const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src), (out, dim, index, src))  \
  X(uniform_at, (const Tensor& out, double low, double high, uint64_t seed, uint64_t first_block),                \
    (out, low, high, seed, first_block))                                                                          \
  X(normal_at, (const Tensor& out, double mean, double std, uint64_t seed, uint64_t first_block),                 \
    (out, mean, std, seed, first_block))                                                                          \
  X(random_int_at, (const Tensor& out, int64_t low, int64_t high, uint64_t seed, uint64_t first_block),           \
    (out, low, high, seed, first_block))                                                                          \
  X(arange, (const Tensor& out, double start, double step), (out, start, step))                                   \
  X(layer_norm,                                                                                                   \
    (const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,            \
     const Tensor& bias, int64_t rows, int64_t cols, double eps),                                                 \
    (out, mean, rstd, x, weight, bias, rows, cols, eps))                                                          \
  X(layer_norm_backward,                                                                                          \
    (const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& g, const Tensor& x,  \
     const Tensor& mean, const Tensor& rstd, const Tensor& weight, int64_t rows, int64_t cols),                    \
    (grad_x, grad_weight, grad_bias, g, x, mean, rstd, weight, rows, cols))                                       \
  X(cross_entropy,                                                                                                \
    (const Tensor& losses, const Tensor& row_weight, const Tensor& probs, const Tensor& logits,                   \
     const Tensor& target, const Tensor& class_weight, int64_t ignore_index, double label_smoothing),             \
    (losses, row_weight, probs, logits, target, class_weight, ignore_index, label_smoothing))                     \
  X(cross_entropy_backward,                                                                                       \
    (const Tensor& grad_logits, const Tensor& row_scale, const Tensor& probs, const Tensor& target,               \
     const Tensor& class_weight, int64_t ignore_index, double label_smoothing),                                   \
    (grad_logits, row_scale, probs, target, class_weight, ignore_index, label_smoothing))                         \
  X(conv2d,                                                                                                       \
    (const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,             \
     int64_t groups),                                                                                             \
    (out, x, weight, bias, w, groups))                                                                            \
  X(conv2d_backward,                                                                                              \
    (const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,            \
     const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups),                                   \
    (grad_x, grad_weight, grad_bias, grad_out, x, weight, w, groups))                                             \
  X(max_pool2d, (const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& w),                   \
    (out, indices, x, w))                                                                                         \
  X(max_pool2d_backward,                                                                                          \
    (const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices, const Tensor& x, const Tensor& out,     \
     const Window2d& w),                                                                                          \
    (grad_x, grad_out, indices, x, out, w))                                                                       \
  X(avg_pool2d, (const Tensor& out, const Tensor& x, const Window2d& w, bool count_include_pad),                  \
    (out, x, w, count_include_pad))                                                                               \
  X(avg_pool2d_backward,                                                                                          \
    (const Tensor& grad_x, const Tensor& grad_out, const Window2d& w, bool count_include_pad),                    \
    (grad_x, grad_out, w, count_include_pad))                                                                     \
  X(adaptive_avg_pool2d,                                                                                          \
    (const Tensor& out, const Tensor& x, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w),              \
    (out, x, in_h, in_w, out_h, out_w))                                                                           \
  X(adaptive_avg_pool2d_backward,                                                                                 \
    (const Tensor& grad_x, const Tensor& grad_out, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w),    \
    (grad_x, grad_out, in_h, in_w, out_h, out_w))                                                                 \
  X(batch_norm,                                                                                                   \
    (const Tensor& out, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& x, const Tensor& weight,  \
     const Tensor& bias, const Tensor& running_mean, const Tensor& running_var, bool use_batch_stats,             \
     double momentum, double eps, int64_t n, int64_t c, int64_t s),                                               \
    (out, save_mean, save_rstd, x, weight, bias, running_mean, running_var, use_batch_stats, momentum, eps, n, c, \
     s))                                                                                                          \
  X(batch_norm_backward,                                                                                          \
    (const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,            \
     const Tensor& x, const Tensor& save_mean, const Tensor& save_rstd, const Tensor& weight,                     \
     bool use_batch_stats, int64_t n, int64_t c, int64_t s),                                                      \
    (grad_x, grad_weight, grad_bias, grad_out, x, save_mean, save_rstd, weight, use_batch_stats, n, c, s))      \
  X(sgd_step,                                                                                                     \
    (const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double weight_decay,      \
     double momentum, double dampening, bool nesterov, bool first_step),                                          \
    (param, grad, momentum_buffer, lr, weight_decay, momentum, dampening, nesterov, first_step))                  \
  X(adam_step,                                                                                                    \
    (const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,                    \
     const Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,        \
     double step_size, double bias_correction2_sqrt, bool decoupled),                                             \
    (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step_size,            \
     bias_correction2_sqrt, decoupled))                                                                          \
  X(sgd_step_multi,                                                                                               \
    (const TensorList& params, const TensorList& grads, const TensorList& momentum_buffers, double lr,            \
     double weight_decay, double momentum, double dampening, bool nesterov, bool first_step),                     \
    (params, grads, momentum_buffers, lr, weight_decay, momentum, dampening, nesterov, first_step))               \
  X(adam_step_multi,                                                                                              \
    (const TensorList& params, const TensorList& grads, const TensorList& exp_avgs, const TensorList& exp_avg_sqs, \
     const TensorList& max_exp_avg_sqs, double lr, double beta1, double beta2, double eps, double weight_decay,   \
     double step_size, double bias_correction2_sqrt, bool decoupled),                                             \
    (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, lr, beta1, beta2, eps, weight_decay, step_size,       \
     bias_correction2_sqrt, decoupled))

// One device type's kernels. The cpu, sim and cuda tables fill every entry; a backend added later
// that leaves one null gets a chorus::Error naming the kernel and device from dispatch, not a crash.
struct KernelTable {
  const char* device_name = "";
#define CHORUS_TABLE_ENTRY(name, params, args) void(*name) params = nullptr;
  CHORUS_KERNEL_LIST(CHORUS_TABLE_ENTRY)
#undef CHORUS_TABLE_ENTRY
};

}  // namespace chorus::kernels
