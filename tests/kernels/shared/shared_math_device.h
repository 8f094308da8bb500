// Test-only: the kernels/shared functors evaluated on the GPU, element by element, so
// shared_math_gpu_test can compare each with its CPU twin on the same inputs. The .cu also keeps
// every functor compiling under nvcc in CI (it is built wherever a CUDA toolkit is found).
#pragma once

#include <cstdint>
#include <vector>

namespace chorus::kernels::shared::testing {

// The ops evaluated by ops_on_device: unary ops read x, binary ops read (x, y).
enum class DeviceOp {
  Neg, Abs, Exp, Log, Log1p, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, GeluErf, GeluTanh, Sin, Cos, Sign, Reciprocal,
  Floor, Ceil, Round, Trunc, Erf, Erfinv, Expm1, Log2, Log10,
  Add, Sub, Mul, Div, Max, Min, Pow, ReluBackward, TanhBackward, SigmoidBackward, GeluErfBackward,
  GeluTanhBackward, Lt, Eq,  // comparisons give 1 or 0
  kCount
};
inline constexpr int kUnaryOps = static_cast<int>(DeviceOp::Add);

// out[i] = op(x[i]) or op(x[i], y[i]) computed on device 0, for T = float or double.
template <typename T>
std::vector<T> ops_on_device(DeviceOp op, const std::vector<T>& x, const std::vector<T>& y);

// Philox words: out[4 * i + j] = philox4x32_10(seed, first_block + i).w[j] for i < blocks.
std::vector<uint32_t> philox_on_device(uint64_t seed, uint64_t first_block, int64_t blocks);

// Element i of a randn (float32, mean 0, std 1) fill starting at first_block, and of a rand.
std::vector<float> normal_on_device(uint64_t seed, uint64_t first_block, int64_t n);
std::vector<float> uniform_on_device(uint64_t seed, uint64_t first_block, int64_t n);

// Casts float32 -> float16 / bfloat16 bits and back, through chorus::Half / BFloat16 storage.
std::vector<uint16_t> to_half_on_device(const std::vector<float>& x);
std::vector<uint16_t> to_bfloat16_on_device(const std::vector<float>& x);
std::vector<float> from_half_on_device(const std::vector<uint16_t>& bits);

// One AdamW step (amsgrad) over w, g, m, v, vmax in place, with the scalars of step `step`.
void adamw_on_device(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                     std::vector<float>& v, std::vector<float>& vmax, double lr, double weight_decay, double step);

}  // namespace chorus::kernels::shared::testing
