// CPU kernels: plain functions over tensors' raw memory. They check nothing a user could get wrong
// (the op layer in autograd/ops does that) and know nothing of autograd. Inputs are already in one
// compute dtype unless a kernel says otherwise, and `out` is allocated with the result's shape.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_types.h"
#include "tensor/generator.h"
#include "tensor/scalar.h"
#include "tensor/tensor.h"

namespace chorus::kernels::cpu {

// dst[...] = src[...] converted to dst's dtype; src is broadcast to dst's shape. Any strides.
void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& dst, const Scalar& value);

using kernels::UnaryOp;
// out = op(in); out and in have the same dtype except LogicalNot (out bool).
void unary(UnaryOp op, const Tensor& out, const Tensor& in);
void pow_scalar(const Tensor& out, const Tensor& in, double exponent);
void clamp(const Tensor& out, const Tensor& in, const Scalar* min, const Scalar* max);

using kernels::BinaryOp;
// out = a op b (op Add/Sub compute a + alpha*b). a and b broadcast to out's shape and share a dtype.
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
// out = cond ? a : b (cond bool; a, b of out's dtype; all broadcast).
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);

using kernels::ReduceOp;
// Reduces `in` over `dims` (sorted, unique) into `out`, whose shape is in's with those dims removed
// (keepdim handled by the caller as a view). out may be of a wider dtype for Sum/Prod (int64 for
// integers); float32 sums accumulate in float64.
void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<int64_t>& dims);
// Values and int64 indices of the max (or min) along one dim; the first index wins ties.
void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim);
// Softmax / log-softmax along `dim` (numerically stable: subtract the max).
void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log);
// grad_in = y * (g - sum(g*y)) for softmax; g - exp(y) * sum(g) for log-softmax (y = forward output).
void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, int64_t dim,
                      bool log);

// C = alpha * A @ B + beta * C for 2-D strided views whose rows or columns are contiguous
// (stride 1 in one of the two dims). Float32, float64 through Eigen; integers by Eigen's plain loop.
void gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta);
// Batched: c[i] = a[i] @ b[i] over the leading dim (all three 3-D, same batch).
void bmm(const Tensor& c, const Tensor& a, const Tensor& b);

// out = in.index_select(dim, index) (index int64 1-D, already bounds-checked).
void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index);
// out[i][j] = in[i][index[i][j]] along dim (out has index's shape).
void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index);
// self[... index[i][j] ...] = src[i][j] (or += when accumulate); src may be a broadcast scalar view.
void scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate);
// out.index_add_(dim, index, src): out.select(dim, index[i]) += src.select(dim, i)
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

// Random fills from Philox blocks of `gen` (deterministic for a seed, independent of threads).
void uniform(const Tensor& out, double low, double high, Generator& gen);
void normal(const Tensor& out, double mean, double std, Generator& gen);
void random_int(const Tensor& out, int64_t low, int64_t high, Generator& gen);
// The same fills from an explicit Philox position (the blocks were reserved by the caller; see
// kernels::philox_blocks): what the device-independent kernel table calls.
void uniform_at(const Tensor& out, double low, double high, uint64_t seed, uint64_t first_block);
void normal_at(const Tensor& out, double mean, double std, uint64_t seed, uint64_t first_block);
void random_int_at(const Tensor& out, int64_t low, int64_t high, uint64_t seed, uint64_t first_block);
// out[i] = start + i * step (1-D contiguous out).
void arange(const Tensor& out, double start, double step);

// Optimizer updates over contiguous float32/float64 tensors of one dtype (kernels/cpu/optim.cpp):
// SGD with weight decay, momentum (momentum_buffer undefined when momentum is 0), dampening and
// Nesterov; Adam/AdamW (decoupled weight decay) with AMSGrad when max_exp_avg_sq is defined.
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double weight_decay,
              double momentum, double dampening, bool nesterov, bool first_step);
void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,
               double step_size, double bias_correction2_sqrt, bool decoupled);
// The same updates over lists of tensors (the "foreach" path): parameter i with grads[i] and state
// buffers [i] (momentum_buffers / max_exp_avg_sqs empty when unused), all of one dtype and contiguous,
// as one parallel loop over every tensor's elements. Results equal sgd_step / adam_step per tensor
// bit for bit: the same functor, and splitting a tensor between threads changes no element's math.
void sgd_step_multi(const TensorList& params, const TensorList& grads, const TensorList& momentum_buffers, double lr,
                    double weight_decay, double momentum, double dampening, bool nesterov, bool first_step);
void adam_step_multi(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                     const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs, double lr, double beta1,
                     double beta2, double eps, double weight_decay, double step_size, double bias_correction2_sqrt,
                     bool decoupled);

}  // namespace chorus::kernels::cpu
