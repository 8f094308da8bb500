// Test-only kernels over the kernels/shared functors (see shared_math_device.h): one thread per
// element, the functor picked by a switch (speed is not the point here).
#include "tests/kernels/shared/shared_math_device.h"

#include <cuda_runtime.h>

#include "kernels/shared/optim_math.h"
#include "kernels/shared/philox.h"
#include "kernels/shared/pointwise_math.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace chorus::kernels::shared::testing {
namespace {

void check(cudaError_t status, const char* call) {
  CHORUS_CHECK(status == cudaSuccess, "shared_math_device: {} failed: {} ({})", call, cudaGetErrorString(status),
               cudaGetErrorName(status));
}

// A device buffer holding a copy of `host` (or n uninitialized elements), freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { check(cudaMalloc(&ptr, sizeof(T) * (n ? n : 1)), "cudaMalloc"); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    check(cudaMemcpy(ptr, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> out(n);
    check(cudaMemcpy(out.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return out;
  }
};

unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + 255) / 256); }

void finish(const char* kernel) {
  check(cudaGetLastError(), kernel);
  check(cudaDeviceSynchronize(), kernel);
}

template <typename T>
__device__ T apply(DeviceOp op, T x, T y) {
  switch (op) {
    case DeviceOp::Neg: return Neg{}(x);
    case DeviceOp::Abs: return Abs{}(x);
    case DeviceOp::Exp: return Exp{}(x);
    case DeviceOp::Log: return Log{}(x);
    case DeviceOp::Log1p: return Log1p{}(x);
    case DeviceOp::Sqrt: return Sqrt{}(x);
    case DeviceOp::Rsqrt: return Rsqrt{}(x);
    case DeviceOp::Tanh: return Tanh{}(x);
    case DeviceOp::Sigmoid: return Sigmoid{}(x);
    case DeviceOp::Relu: return Relu{}(x);
    case DeviceOp::GeluErf: return GeluErf{}(x);
    case DeviceOp::GeluTanh: return GeluTanh{}(x);
    case DeviceOp::Sin: return Sin{}(x);
    case DeviceOp::Cos: return Cos{}(x);
    case DeviceOp::Sign: return Sign{}(x);
    case DeviceOp::Reciprocal: return Reciprocal{}(x);
    case DeviceOp::Floor: return Floor{}(x);
    case DeviceOp::Ceil: return Ceil{}(x);
    case DeviceOp::Round: return Round{}(x);
    case DeviceOp::Trunc: return Trunc{}(x);
    case DeviceOp::Erf: return Erf{}(x);
    case DeviceOp::Erfinv: return Erfinv{}(x);
    case DeviceOp::Expm1: return Expm1{}(x);
    case DeviceOp::Log2: return Log2{}(x);
    case DeviceOp::Log10: return Log10{}(x);
    case DeviceOp::Add: return Add{}(x, y);
    case DeviceOp::Sub: return SubAlpha<T>{T(0.5)}(x, y);
    case DeviceOp::Mul: return Mul{}(x, y);
    case DeviceOp::Div: return Div{}(x, y);
    case DeviceOp::Max: return Max{}(x, y);
    case DeviceOp::Min: return Min{}(x, y);
    case DeviceOp::Pow: return Pow{}(x, y);
    case DeviceOp::ReluBackward: return ReluBackward{}(x, y);
    case DeviceOp::TanhBackward: return TanhBackward{}(x, y);
    case DeviceOp::SigmoidBackward: return SigmoidBackward{}(x, y);
    case DeviceOp::GeluErfBackward: return GeluErfBackward{}(x, y);
    case DeviceOp::GeluTanhBackward: return GeluTanhBackward{}(x, y);
    case DeviceOp::Lt: return Lt{}(x, y) ? T(1) : T(0);
    case DeviceOp::Eq: return Eq{}(x, y) ? T(1) : T(0);
    case DeviceOp::kCount: break;
  }
  return T(0);
}

template <typename T>
__global__ void ops_kernel(DeviceOp op, const T* x, const T* y, T* out, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = apply(op, x[i], y[i]);
}

__global__ void philox_kernel(uint64_t seed, uint64_t first_block, uint32_t* out, size_t blocks) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= blocks) return;
  const PhiloxBlock b = philox4x32_10(seed, first_block + i);
  for (int j = 0; j < 4; ++j) out[4 * i + j] = b.w[j];
}

template <typename Draw>
__global__ void draw_kernel(Draw draw, uint64_t seed, uint64_t first_block, float* out, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = philox_element(draw, seed, first_block, i);
}

template <typename D, typename S>
__global__ void cast_kernel(const S* in, D* out, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = Cast<D>{}(in[i]);
}

__global__ void adamw_kernel(AdamUpdate<float> update, float* w, const float* g, float* m, float* v, float* vmax,
                             size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) update(w[i], g[i], m[i], v[i], vmax[i]);
}

template <typename Draw>
std::vector<float> draws(const Draw& draw, uint64_t seed, uint64_t first_block, int64_t n) {
  DeviceBuffer<float> out(static_cast<size_t>(n));
  draw_kernel<<<blocks_for(out.n), 256>>>(draw, seed, first_block, out.ptr, out.n);
  finish("draw_kernel");
  return out.to_host();
}

// chorus::Half / BFloat16 are a bare uint16_t `bits` (tensor/dtype.h), so their arrays are the bits.
template <typename Storage>
std::vector<uint16_t> to_reduced(const std::vector<float>& x) {
  static_assert(sizeof(Storage) == sizeof(uint16_t));
  DeviceBuffer<float> in(x);
  DeviceBuffer<uint16_t> out(x.size());
  cast_kernel<Storage, float><<<blocks_for(x.size()), 256>>>(in.ptr, reinterpret_cast<Storage*>(out.ptr), x.size());
  finish("cast_kernel");
  return out.to_host();
}

}  // namespace

template <typename T>
std::vector<T> ops_on_device(DeviceOp op, const std::vector<T>& x, const std::vector<T>& y) {
  CHORUS_CHECK(x.size() == y.size(), "ops_on_device: x has {} elements, y {}", x.size(), y.size());
  DeviceBuffer<T> dx(x), dy(y), out(x.size());
  ops_kernel<T><<<blocks_for(x.size()), 256>>>(op, dx.ptr, dy.ptr, out.ptr, x.size());
  finish("ops_kernel");
  return out.to_host();
}
template std::vector<float> ops_on_device<float>(DeviceOp, const std::vector<float>&, const std::vector<float>&);
template std::vector<double> ops_on_device<double>(DeviceOp, const std::vector<double>&, const std::vector<double>&);

std::vector<uint32_t> philox_on_device(uint64_t seed, uint64_t first_block, int64_t blocks) {
  DeviceBuffer<uint32_t> out(static_cast<size_t>(4 * blocks));
  philox_kernel<<<blocks_for(static_cast<size_t>(blocks)), 256>>>(seed, first_block, out.ptr,
                                                                   static_cast<size_t>(blocks));
  finish("philox_kernel");
  return out.to_host();
}

std::vector<float> normal_on_device(uint64_t seed, uint64_t first_block, int64_t n) {
  return draws(NormalFloatDraw{0.0f, 1.0f}, seed, first_block, n);
}

std::vector<float> uniform_on_device(uint64_t seed, uint64_t first_block, int64_t n) {
  return draws(UniformFloatDraw{0.0f, 1.0f}, seed, first_block, n);
}

std::vector<uint16_t> to_half_on_device(const std::vector<float>& x) { return to_reduced<Half>(x); }
std::vector<uint16_t> to_bfloat16_on_device(const std::vector<float>& x) { return to_reduced<BFloat16>(x); }

std::vector<float> from_half_on_device(const std::vector<uint16_t>& bits) {
  DeviceBuffer<uint16_t> in(bits);
  DeviceBuffer<float> out(bits.size());
  cast_kernel<float, Half><<<blocks_for(bits.size()), 256>>>(reinterpret_cast<const Half*>(in.ptr), out.ptr,
                                                             bits.size());
  finish("cast_kernel");
  return out.to_host();
}

void adamw_on_device(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v,
                     std::vector<float>& vmax, double lr, double weight_decay, double step) {
  DeviceBuffer<float> dw(w), dg(g), dm(m), dv(v), dvmax(vmax);
  const AdamUpdate<float> update = make_adam_update<float>(lr, 0.9, 0.999, 1e-8, weight_decay, true, step);
  adamw_kernel<<<blocks_for(w.size()), 256>>>(update, dw.ptr, dg.ptr, dm.ptr, dv.ptr, dvmax.ptr, w.size());
  finish("adamw_kernel");
  w = dw.to_host();
  m = dm.to_host();
  v = dv.to_host();
  vmax = dvmax.to_host();
}

}  // namespace chorus::kernels::shared::testing
