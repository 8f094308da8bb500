// Shapes and strides to kernel launches, as plain C++ that CI tests on the CPU: the elementwise
// plan (broadcast, collapsed dims, contiguity and 16-byte vectorization, splits that keep every
// launch within 32-bit index math, grid sizes) and the reduction layout (outer, reduced, inner).
// The CUDA launchers call these; the index math a kernel runs (IndexCalculator) is CHORUS_HD here.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/shared/hd.h"

namespace chorus::kernels::shared {

// ------------------------------------------------------------------ elementwise

// One operand as the kernel sees it: its own sizes and strides (in elements), broadcastable to the
// output shape (trailing-aligned, as NumPy), its element size, and its data address (only the
// address's alignment matters; 0 means aligned). Operand 0 is the output by convention.
struct OperandLayout {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t element_size_bytes = 4;
  uint64_t address = 0;
};

struct ElementwisePlanOptions {
  // The largest element count and the largest byte offset one launch may index: a kernel computes
  // offsets in uint32 and the grid-stride loop may run one tile past numel, so int32's max keeps
  // headroom. Tests lower it to execute splits on small tensors.
  int64_t max_index = 2147483647;
  int max_vector_bytes = 16;  // one 128-bit load per operand
};

// A box of the collapsed iteration space launched on its own: element i (< numel) is at
// multi-index start + unravel(i, sizes) of the plan's shape, and operand k's element at byte
// offset base_offset_bytes[k] + sum_d unravel(i, sizes)[d] * plan.stride_bytes[k][d].
struct SubLaunch {
  int64_t numel = 0;
  std::vector<int64_t> start;              // per collapsed dim
  std::vector<int64_t> sizes;              // per collapsed dim
  std::vector<int64_t> base_offset_bytes;  // per operand, from its data address
  // > 1 when every operand is contiguous here and aligned for loads of this many elements
  // (vector_elements * element size <= max_vector_bytes); 1 otherwise. The last
  // numel % vector_elements elements are a tail the kernel handles element by element.
  int vector_elements = 1;
};

struct ElementwisePlan {
  std::vector<int64_t> shape;                      // collapsed, innermost last; {1} for one element
  std::vector<std::vector<int64_t>> stride_bytes;  // [operand][dim]; 0 where broadcast
  int64_t numel = 0;
  // Every operand steps through memory densely in the same order (one collapsed dim, stride equal
  // to its element size): linear index i is element i of every operand.
  bool contiguous = false;
  std::vector<SubLaunch> launches;  // empty when numel == 0; more than one only above max_index
};

// Throws chorus::Error for operands that do not broadcast to out_shape, negative strides, or more
// than 16 operands.
ElementwisePlan plan_elementwise(const std::vector<int64_t>& out_shape, const std::vector<OperandLayout>& operands,
                                 const ElementwisePlanOptions& options = {});

// Grid for a grid-stride kernel over `numel` elements in tiles of threads_per_block *
// elements_per_thread: tile t covers [t * tile, (t + 1) * tile); block b handles tiles b,
// b + blocks, ... At most blocks_per_sm blocks per SM are launched (enough to fill it a few times
// over; more only adds block scheduling), at least 1 when numel > 0.
struct GridConfig {
  int64_t blocks = 0;
  int threads_per_block = 0;
  int elements_per_thread = 0;
  int64_t tile_elements() const { return static_cast<int64_t>(threads_per_block) * elements_per_thread; }
};
GridConfig elementwise_grid(int64_t numel, int threads_per_block, int sm_count, int elements_per_thread,
                            int blocks_per_sm = 8);

// What a kernel receives for one SubLaunch: sizes and byte strides in 32-bit, innermost dim first,
// so the offsets of linear index i are computed with one division per dim.
inline constexpr int kMaxLaunchDims = 16;
template <int N>
struct IndexCalculator {
  int ndim = 0;
  uint32_t sizes[kMaxLaunchDims] = {};
  uint32_t strides[kMaxLaunchDims][N] = {};

  CHORUS_HD CHORUS_INLINE void offsets(uint32_t linear, uint32_t (&out)[N]) const {
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = 0; d < ndim; ++d) {
      const uint32_t idx = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < N; ++k) out[k] += idx * strides[d][k];
    }
  }
};

// Throws chorus::Error when N differs from the plan's operand count.
template <int N>
IndexCalculator<N> index_calculator(const ElementwisePlan& plan, const SubLaunch& launch);

// ------------------------------------------------------------------ reductions

// A reduction of `in` over some dims, as three collapsed dims in memory:
//   out[o * inner + i] = reduce over r of in[o * outer_stride + r * reduced_stride + i * inner_stride]
// for o < outer, r < reduced, i < inner, with `out` contiguous in the kept dims' order. inner == 1
// is a row reduction (reduced dims innermost in the output's order), outer == 1 a column reduction.
struct ReductionPlan {
  int64_t outer = 1, reduced = 1, inner = 1;
  int64_t outer_stride = 0, reduced_stride = 0, inner_stride = 0;  // in elements
  // The input's strides allow no such view: first copy in.permute(permutation) to a contiguous
  // tensor (kept dims in order, then reduced dims); the fields above describe that copy.
  bool needs_copy = false;
  std::vector<int64_t> permutation;
};

// reduced_dims sorted, unique, each in [0, sizes.size()). Throws chorus::Error otherwise.
ReductionPlan plan_reduction(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                             const std::vector<int64_t>& reduced_dims);

}  // namespace chorus::kernels::shared
