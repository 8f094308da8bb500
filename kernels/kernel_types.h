// The vocabulary every kernel family shares (cpu, cuda, and the sim device that runs the cpu
// kernels on its streams): which unary/binary/reduce operation, and the geometry of a 2-D window.
// kernels/dispatch.h declares the kernel signatures over these types.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/shared/reduce_math.h"
#include "tensor/dtype.h"

namespace chorus {
class Tensor;
}

namespace chorus::kernels {

// A list argument of the multi-tensor kernels (the *_multi entries): one launch over many tensors.
using TensorList = std::vector<Tensor>;

enum class UnaryOp {
  Neg, Abs, Exp, Log, Log1p, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, GeluErf, GeluTanh, Sin, Cos,
  Sign, LogicalNot, Reciprocal,
  Floor, Ceil, Round, Trunc, Erf, Erfinv, Expm1, Log2, Log10  // floating point (integers: floor & co. are identity)
};

enum class BinaryOp {
  Add, Sub, Mul, Div, Max, Min, Pow,  // arithmetic: out dtype = input dtype
  Eq, Ne, Lt, Le, Gt, Ge,             // comparisons: out is bool
  LogicalAnd, LogicalOr, LogicalXor,  // logical: out is bool, inputs any dtype
  // Fused backward helpers (a = grad_out, b = saved value): keep backward memory-bound.
  ReluBackward,     // a * (b > 0)
  TanhBackward,     // a * (1 - b*b), b = tanh output
  SigmoidBackward,  // a * b * (1 - b), b = sigmoid output
  GeluErfBackward,  // a * gelu'(b), b = input
  GeluTanhBackward,
};

using shared::ReduceOp;  // kernels/shared/reduce_math.h, with the rules the kernels share

// Geometry of a 2-D window op (convolution or pooling) over one [H, W] plane.
struct Window2d {
  int64_t in_h = 0, in_w = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
};

// Random fills draw from Philox-4x32-10 blocks (128 bits each). The op layer reserves the blocks a
// fill consumes from the Generator on the host, so a kernel on any device (or a stream that runs
// later) produces the same numbers from (seed, first block).
enum class RandomKind { Uniform, Normal, Int };
uint64_t philox_blocks(RandomKind kind, DType dtype, int64_t numel);

}  // namespace chorus::kernels
