// What the CUDA row kernels (softmax in reduce.cu, layer_norm in nn.cu) share: 16-byte vector loads
// and stores, warp reductions by butterfly shuffles within a lane group, a block reduction (shuffles,
// then one shared-memory step), and the dispatch of a kernels/shared/row_plan.h plan to the kernel
// instantiated for its vector width and vectors per lane ([Row kernels] there). Included only by
// .cu files (nvcc).
#pragma once

#include <cuda/std/limits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/shared/pointwise_math.h"
#include "kernels/shared/row_plan.h"

namespace chorus::kernels::cuda_impl::row_kernels {

constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T neg_inf() {
  return -::cuda::std::numeric_limits<T>::infinity();
}

// V consecutive elements at p (V * sizeof(T) bytes, aligned to that when V > 1) widened to Acc.
template <int V, typename T, typename Acc>
__device__ __forceinline__ void load(const T* p, Acc (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = sh::to_opmath(*p);
  } else {
    struct alignas(sizeof(T) * V) Pack { T v[V]; };
    const Pack pack = *reinterpret_cast<const Pack*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = sh::to_opmath(pack.v[i]);
  }
}
// V consecutive elements of a per-column array (layer_norm's weight and bias) widened to Acc, read in
// pieces of at most 16 bytes: the array may be wider than the row (float32 weight beside a bfloat16
// row, V chosen for the row), and the plan only checks 16-byte alignment.
template <int V, typename T, typename Acc>
__device__ __forceinline__ void load_params(const T* p, Acc (&out)[V]) {
  constexpr int kPiece = V * sizeof(T) <= 16 ? V : static_cast<int>(16 / sizeof(T));
  static_assert(V % kPiece == 0, "a vector is a whole number of 16-byte pieces");
#pragma unroll
  for (int k = 0; k < V; k += kPiece) {
    Acc part[kPiece];
    load<kPiece>(p + k, part);
#pragma unroll
    for (int i = 0; i < kPiece; ++i) out[k + i] = part[i];
  }
}
// The same, kept as stored (for the shared-memory row cache).
template <int V, typename T>
__device__ __forceinline__ void load_raw(const T* p, T (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = *p;
  } else {
    struct alignas(sizeof(T) * V) Pack { T v[V]; };
    const Pack pack = *reinterpret_cast<const Pack*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = pack.v[i];
  }
}
template <int V, typename T>
__device__ __forceinline__ void store_raw(T* p, const T (&in)[V]) {
  if constexpr (V == 1) {
    *p = in[0];
  } else {
    struct alignas(sizeof(T) * V) Pack { T v[V]; };
    Pack pack;
#pragma unroll
    for (int i = 0; i < V; ++i) pack.v[i] = in[i];
    *reinterpret_cast<Pack*>(p) = pack;
  }
}
// V values rounded once to T and stored at p.
template <int V, typename T, typename Acc>
__device__ __forceinline__ void store(T* p, const Acc (&in)[V]) {
  T raw[V];
#pragma unroll
  for (int i = 0; i < V; ++i) raw[i] = sh::Cast<T>{}(in[i]);
  store_raw<V>(p, raw);
}

// Two statistics reduced together (one pass, one barrier step for both).
template <typename Acc>
struct Pair {
  Acc a, b;
};
template <typename Acc>
__device__ __forceinline__ Acc shfl_xor(Acc v, int offset) {
  return __shfl_xor_sync(kFullMask, v, offset);
}
template <typename Acc>
__device__ __forceinline__ Pair<Acc> shfl_xor(Pair<Acc> v, int offset) {
  return {__shfl_xor_sync(kFullMask, v.a, offset), __shfl_xor_sync(kFullMask, v.b, offset)};
}

struct Sum {
  template <typename Acc>
  __device__ __forceinline__ Acc operator()(Acc x, Acc y) const { return x + y; }
  template <typename Acc>
  __device__ __forceinline__ Pair<Acc> operator()(Pair<Acc> x, Pair<Acc> y) const { return {x.a + y.a, x.b + y.b}; }
};
struct Max {  // y > x ? y : x: NaN never wins, as the cpu softmax's row maximum
  template <typename Acc>
  __device__ __forceinline__ Acc operator()(Acc x, Acc y) const { return y > x ? y : x; }
};
// Online softmax statistics (a = running maximum, b = sum of exp(x - a)) of two parts of a row
// (sh::online_combine, which the CPU tests walk).
struct MaxSum {
  template <typename Acc>
  __device__ __forceinline__ Pair<Acc> operator()(Pair<Acc> x, Pair<Acc> y) const {
    sh::online_combine(x.a, x.b, y.a, y.b);
    return x;
  }
};
// One element v into online statistics s (sh::online_add).
template <typename Acc>
__device__ __forceinline__ void online_add(Pair<Acc>& s, Acc v) {
  sh::online_add(s.a, s.b, v);
}

// Every lane of an aligned group of `lanes` (a power of two <= 32) gets the group's combination.
// All 32 lanes of the warp must call it (full mask).
template <typename V, typename Op>
__device__ __forceinline__ V warp_allreduce(V v, const Op& op, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset >>= 1) v = op(v, shfl_xor(v, offset));
  return v;
}
// Every thread of the block (blockDim.x a multiple of 32, at most 1024) gets the block's
// combination; buf: 32 values in shared memory. The leading barrier lets a caller reuse buf.
template <typename V, typename Op>
__device__ __forceinline__ V block_allreduce(V v, const Op& op, V* buf) {
  v = warp_allreduce(v, op, 32);
  __syncthreads();
  if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = v;
  __syncthreads();
  v = buf[0];
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int w = 1; w < warps; ++w) v = op(v, buf[w]);  // the same order in every thread
  return v;
}

// Runs f.template operator()<V, N>() for the plan's vector width V and (warp kernel) vectors per
// lane N, among the instantiations a row of at most kWarpRowBytes needs: V in {1, 16 / sizeof(T)},
// N a power of two with N * V * sizeof(T) <= kWarpRowBytes / 32.
template <typename T, typename F>
void dispatch_row_shape(const sh::RowPlan& plan, const F& f) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  auto with_n = [&]<int V>() {
    auto go = [&]<int N>() {
      if constexpr (static_cast<int64_t>(N) * V * sizeof(T) <= sh::kWarpRowBytes / 32) f.template operator()<V, N>();
      else fail("row kernel: no instantiation for {} vectors of {} per lane", N, V);
    };
    switch (plan.kernel == sh::RowKernel::Block ? 1 : plan.vectors) {
      case 1: go.template operator()<1>(); return;
      case 2: go.template operator()<2>(); return;
      case 4: go.template operator()<4>(); return;
      case 8: go.template operator()<8>(); return;
      case 16: go.template operator()<16>(); return;
      case 32: go.template operator()<32>(); return;
      default: fail("row kernel: {} vectors per lane", plan.vectors);
    }
  };
  if (plan.vector_elements == 1) with_n.template operator()<1>();
  else if (plan.vector_elements == kVec) with_n.template operator()<kVec>();
  else fail("row kernel: vector of {} elements for a {}-byte type", plan.vector_elements, sizeof(T));
}

inline uint64_t address_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

}  // namespace chorus::kernels::cuda_impl::row_kernels
