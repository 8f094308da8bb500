// Shared helpers of the op layer: argument checks with uniform messages, PyTorch's result-type
// rules, and moving inputs into the dtype a kernel computes in. Every op uses these, so a given
// mistake gets the same message from every op.
#pragma once

#include <string>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/inplace.h"
#include "autograd/node.h"
#include "kernels/dispatch.h"
#include "tensor/ops.h"

namespace chorus::ops {

using kernels::BinaryOp;
using kernels::ReduceOp;
using kernels::UnaryOp;
using autograd::SavedTensor;

// Throws naming `op` when t is undefined.
void check_defined(const Tensor& t, const char* op, const char* arg);
// Throws naming `op` and both devices when they differ.
void check_same_device(const Tensor& a, const Tensor& b, const char* op);
// Throws naming `op` when t's device has no kernels in this build ("no CUDA device ...").
void check_kernels(const Tensor& t, const char* op);

// Fills `t` (any device) with random numbers from `gen`: the Philox blocks are reserved on the host
// here, so the kernel may run later on a stream and still give the numbers the CPU would.
void random_fill(kernels::RandomKind kind, const Tensor& t, double a, double b, Generator& gen);

// Result dtype of a binary op between two tensors, as in PyTorch: a 0-d tensor decides only when
// its category (bool < integer < float) is higher (int64 tensor + 0-d float64 -> float64;
// float16 tensor + 0-d float32 -> float16). A Scalar of a higher category gives int64 / float32.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, const Scalar& b);

// `t` converted to dtype (no copy when it already is).
Tensor cast(const Tensor& t, DType dtype);
// The dtype a matrix product or convolution computes in: float16 / bfloat16 stay as they are on
// CUDA (cuBLAS and cuDNN use tensor cores, accumulating in float32); elsewhere they are widened to
// float32 and the result rounded back, which gives the same values up to summation order.
DType product_dtype(const Tensor& t);
// A 0-d tensor holding `value` in `dtype` on `device`.
Tensor scalar_to_tensor(const Scalar& value, DType dtype, Device device);
// Allocates an output of `shape`.
Tensor new_output(const Shape& shape, DType dtype, Device device);
// Allocates an output of `shape` in the layout its inputs suggest, as PyTorch's TensorIterator: the
// first input with the output's whole shape decides (channels-last stays channels-last, so a
// ResNet's ReLU, residual add and casts keep the convolutions' layout); broadcast inputs do not.
Tensor new_output(const Shape& shape, DType dtype, Device device, std::initializer_list<const Tensor*> inputs);
// The layout that rule picks.
MemoryFormat output_format(const Shape& shape, std::initializer_list<const Tensor*> inputs);
// Allocates an output of `shape` in the memory order `strides` give it when they are dense and do
// not overlap (a permutation of a contiguous tensor's: the heads of a [B, T, H, d] projection viewed
// as [B, H, T, d]), else contiguous: a result or gradient laid out like the tensor it mirrors, so
// that the permute and reshape around it stay views (PyTorch's empty_like keeps such a layout too).
Tensor new_output_like(const Shape& shape, const Strides& strides, DType dtype, Device device);

std::string dtypes_str(const Tensor& a, const Tensor& b);

// A fresh, contiguous, history-free result given another shape of the same numel (not a view in
// the autograd sense: nothing else refers to its storage).
Tensor reshaped_result(const Tensor& fresh, const Shape& shape);

// A view of `base` with new geometry (shares storage, no history yet), which remembers its root
// base so that in-place ops on it can rebase the history (autograd/inplace.h, [In-place ops on views]).
Tensor make_view(const Tensor& base, const Shape& sizes, const Strides& strides, int64_t storage_offset);

}  // namespace chorus::ops
