// What every CUDA kernel file (.cu, nvcc only) shares: error checks, the current stream of a tensor's device, the SM
// count, and the generic strided elementwise launcher over kernels/shared/launch_plan.h (broadcast,
// collapsed dims, 32-bit index splits). Included only by .cu files (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <algorithm>
#include <vector>

#include "kernels/shared/launch_plan.h"
#include "tensor/error.h"
#include "tensor/runtime.h"
#include "tensor/tensor.h"

namespace chorus::kernels::cuda_impl {

namespace sh = ::chorus::kernels::shared;

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so it does not resurface from an unrelated call
    fail("CUDA kernel {}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status));
  }
}
// After every <<<...>>>: a bad configuration or a missing device shows up here.
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

inline int sm_count(int device) {
  static std::atomic<int> cache[64] = {};
  if (device >= 0 && device < 64) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "sm count");
  if (count <= 0) count = 1;
  if (device >= 0 && device < 64) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

// The device of a kernel call made current (cudaSetDevice through the DeviceGuard), and the
// current stream of that device on this thread, where every launch goes.
struct LaunchContext {
  DeviceGuard guard;
  cudaStream_t stream;
  int sms;
  explicit LaunchContext(Device device)
      : guard(device), stream(static_cast<cudaStream_t>(current_stream(device).handle())), sms(sm_count(device.index)) {}
};

// Grid for a plain grid-stride loop over n items (blocks capped at 8 per SM, at least 1).
inline unsigned grid_for(int64_t n, int threads, int sms) {
  int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms) * 8;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

// A dense tensor like t on t's device (for kernels that write densely, then copy into a view).
inline Tensor empty_like_dense(const Tensor& t) { return make_tensor(t.sizes(), t.dtype(), t.device()); }

// A view of t's storage with other sizes and strides (no copy).
inline Tensor restrided(const Tensor& t, const Shape& sizes, const Strides& strides) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset(), sizes, strides, t.dtype()));
}

// Block-wide reduction of one value per thread (blockDim.x a power of two, buf blockDim.x long in
// shared memory); every thread gets the result. combine must be associative up to rounding.
template <typename Acc, typename Combine>
__device__ __forceinline__ Acc block_reduce(Acc value, const Combine& combine, Acc* buf) {
  buf[threadIdx.x] = value;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] = combine(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  const Acc result = buf[0];
  __syncthreads();
  return result;
}
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxIgnoringNaN {  // a > b ? a : b, as the cpu softmax's row maximum (NaN never wins)
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// ------------------------------------------------------------------ elementwise
template <int N>
struct Pointers {
  char* p[N];
};

// Element i of the sub-launch: operand k at base.p[k] + offsets(i)[k]. Op gets the N addresses.
template <int N, typename Op>
__global__ void elementwise_kernel(sh::IndexCalculator<N> calc, Pointers<N> base, uint32_t numel, Op op) {
  const uint32_t step = gridDim.x * blockDim.x;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += step) {
    uint32_t off[N];
    calc.offsets(i, off);
    char* p[N];
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = base.p[k] + off[k];
    op(p);
  }
}

// [Vector loads] A launch whose operands are all dense and aligned (SubLaunch::vector_elements = V >
// 1, planned and tested on the CPU in launch_plan.h) moves V elements per operand per access: 16
// bytes of the widest operand, as PyTorch's vectorized elementwise kernel. One element per access
// ran relu and add at 0.70 (float32) and 0.38 (bfloat16) of PyTorch's rate on an H200 (2026-11-29,
// docs/data/gpu_run_2026-11-29_h200_call1_summary.txt, `layers`). An Op takes part by naming a type
// `Packed` and giving `pack<V>(base, i)` (pack i: elements i*V .. i*V+V-1) and `dense(base, i)`
// (element i of dense operands, for the last numel % V); one without them (where) keeps the
// element loop.
template <int V, typename T>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename Op>
concept PackedOp = requires { typename Op::Packed; };

template <int N, int V, typename Op>
__global__ void elementwise_vector_kernel(Pointers<N> base, uint32_t numel, Op op) {
  const uint32_t step = gridDim.x * blockDim.x, packs = numel / V;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += step) op.template pack<V>(base.p, i);
  for (uint32_t i = packs * V + blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += step) op.dense(base.p, i);
}

// The vector kernel for a launch planned with V = vector_elements; false when V is not one it has.
template <int N, typename Op>
bool launch_vector(const Pointers<N>& base, int64_t numel, int vector, const LaunchContext& ctx, const Op& op) {
  if constexpr (!PackedOp<Op>) {
    return false;
  } else {
    auto go = [&]<int V>() {
      // Only the widths the plan can choose for these element sizes are compiled.
      if constexpr (V * Op::kWidestBytes > 16) {
        return false;
      } else {
        const sh::GridConfig grid = sh::elementwise_grid(numel, 256, ctx.sms, V);
        elementwise_vector_kernel<N, V, Op><<<static_cast<unsigned>(grid.blocks), grid.threads_per_block, 0, ctx.stream>>>(
            base, static_cast<uint32_t>(numel), op);
        return true;
      }
    };
    switch (vector) {
      case 2: return go.template operator()<2>();
      case 4: return go.template operator()<4>();
      case 8: return go.template operator()<8>();
      case 16: return go.template operator()<16>();
      default: return false;
    }
  }
}

// Runs op over out's shape (operand 0 = out; the others broadcast to it), on out's device's current
// stream, split into launches whose offsets fit 32 bits.
template <int N, typename Op>
void launch_elementwise(const char* what, const std::array<const Tensor*, N>& operands, const Op& op) {
  const Tensor& out = *operands[0];
  if (out.numel() == 0) return;
  std::vector<sh::OperandLayout> layouts;
  layouts.reserve(N);
  for (const Tensor* t : operands) {
    layouts.push_back(sh::OperandLayout{t->sizes(), t->strides(), static_cast<int64_t>(t->element_size()),
                                        reinterpret_cast<uint64_t>(t->raw_data_ptr())});
  }
  const sh::ElementwisePlan plan = sh::plan_elementwise(out.sizes(), layouts);
  LaunchContext ctx(out.device());
  for (const sh::SubLaunch& launch : plan.launches) {
    const sh::IndexCalculator<N> calc = sh::index_calculator<N>(plan, launch);
    Pointers<N> base;
    for (int k = 0; k < N; ++k) base.p[k] = static_cast<char*>(operands[k]->raw_data_ptr()) + launch.base_offset_bytes[k];
    if (launch.vector_elements > 1 && launch_vector<N>(base, launch.numel, launch.vector_elements, ctx, op)) {
      check_launch(what);
      continue;
    }
    const sh::GridConfig grid = sh::elementwise_grid(launch.numel, 256, ctx.sms, 1);
    elementwise_kernel<N, Op><<<static_cast<unsigned>(grid.blocks), grid.threads_per_block, 0, ctx.stream>>>(
        calc, base, static_cast<uint32_t>(launch.numel), op);
    check_launch(what);
  }
}

// Per-element adapters from a shared functor to the addresses the elementwise kernel hands over.
template <typename Out, typename In, typename F>
struct UnaryElem {
  F f;
  using Packed = void;
  static constexpr int kWidestBytes = static_cast<int>(std::max(sizeof(Out), sizeof(In)));
  __device__ __forceinline__ void operator()(char* const (&p)[2]) const {
    *reinterpret_cast<Out*>(p[0]) = f(*reinterpret_cast<const In*>(p[1]));
  }
  __device__ __forceinline__ void dense(char* const (&p)[2], uint32_t i) const {
    reinterpret_cast<Out*>(p[0])[i] = f(reinterpret_cast<const In*>(p[1])[i]);
  }
  template <int V>
  __device__ __forceinline__ void pack(char* const (&p)[2], uint32_t i) const {
    const Pack<V, In> in = reinterpret_cast<const Pack<V, In>*>(p[1])[i];
    Pack<V, Out> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = f(in.v[j]);
    reinterpret_cast<Pack<V, Out>*>(p[0])[i] = out;
  }
};
template <typename Out, typename A, typename B, typename F>
struct BinaryElem {
  F f;
  using Packed = void;
  static constexpr int kWidestBytes = static_cast<int>(std::max({sizeof(Out), sizeof(A), sizeof(B)}));
  __device__ __forceinline__ void operator()(char* const (&p)[3]) const {
    *reinterpret_cast<Out*>(p[0]) = f(*reinterpret_cast<const A*>(p[1]), *reinterpret_cast<const B*>(p[2]));
  }
  __device__ __forceinline__ void dense(char* const (&p)[3], uint32_t i) const {
    reinterpret_cast<Out*>(p[0])[i] = f(reinterpret_cast<const A*>(p[1])[i], reinterpret_cast<const B*>(p[2])[i]);
  }
  template <int V>
  __device__ __forceinline__ void pack(char* const (&p)[3], uint32_t i) const {
    const Pack<V, A> a = reinterpret_cast<const Pack<V, A>*>(p[1])[i];
    const Pack<V, B> b = reinterpret_cast<const Pack<V, B>*>(p[2])[i];
    Pack<V, Out> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = f(a.v[j], b.v[j]);
    reinterpret_cast<Pack<V, Out>*>(p[0])[i] = out;
  }
};

template <typename Out, typename In, typename F>
void unary_launch(const char* what, const Tensor& out, const Tensor& in, const F& f) {
  launch_elementwise<2>(what, {&out, &in}, UnaryElem<Out, In, F>{f});
}
template <typename Out, typename A, typename B, typename F>
void binary_launch(const char* what, const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  launch_elementwise<3>(what, {&out, &a, &b}, BinaryElem<Out, A, B, F>{f});
}

}  // namespace chorus::kernels::cuda_impl
