// Launch plans for the row kernels (softmax, log_softmax and layer_norm, forward and backward, on
// CUDA): which kernel variant runs a [rows, cols] problem, its vector width, lanes per row, rows per
// block and grid, as plain C++ that CI tests on the CPU (tests/kernels/shared:row_plan_test walks
// this index math to compute softmax). The CHORUS_HD functions below are the index math the kernels
// in kernels/cuda/row_kernels.h run.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/shared/hd.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::shared {

// [Row kernels] A softmax or layer norm row is memory bound: the goal is one read and one write of
// every element, at copy bandwidth. Two shapes do that:
//  - Warp: a row of at most kWarpRowBytes is held in registers by a group of `lanes` threads of one
//    warp (32, or fewer for short rows, so a warp holds 32 / lanes rows); lane l keeps `vectors`
//    vectors of `vector_elements` elements, vector j at column (j * lanes + l) * vector_elements
//    (neighbouring lanes read neighbouring 16-byte pieces: coalesced). The row's statistics are
//    combined with butterfly shuffles (xor lanes/2 ... 1) inside the group, so every lane ends with
//    them and writes its own elements: no shared memory, no __syncthreads.
//  - Block: one block of `threads` per row; thread t walks vectors t, t + threads, ... Per-thread
//    values are combined by shuffles within each warp, then once through shared memory. The row is
//    copied into shared memory on its first read when `cache_in_shared` (it fits), so later passes
//    (normalizing, writing) do not read global memory again; otherwise they stream it again.
enum class RowKernel { Warp, Block };

// A row of up to this many bytes per input array stays in one warp's registers (1024 float32, 512
// float64 columns: 32 or 16 registers of row per lane and input).
constexpr int64_t kWarpRowBytes = 4096;
// Shared memory a block may use for the cached row(s) without opting in to more (the default
// dynamic limit on every architecture since sm_70).
constexpr int64_t kBlockCacheBytes = 48 * 1024;
// Room left in those 48 KiB for the kernels' own static __shared__ arrays (at most 32 pairs of
// double, 512 bytes, for the block reductions): the default limit is on static and dynamic shared
// memory together, and a launch asking for more fails (cudaErrorInvalidValue). So a row is cached
// when its bytes fit in kBlockCacheBytes - kRowStaticSharedBytes.
constexpr int64_t kRowStaticSharedBytes = 1024;
// Per-lane register capacity the warp kernel is compiled for: vectors per lane in {1, 2, 4, ... ,
// kMaxWarpVectors}. A row of at most kWarpRowBytes that would need more (16-bit or 1-byte elements
// loaded one at a time: over 1024 of them) takes the block kernel.
constexpr int kMaxWarpVectors = 32;
constexpr int kWarpThreadsPerBlock = 128;

struct RowProblem {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t element_size_bytes = 4;  // of the stored elements
  // Row arrays the kernel reads (softmax forward: 1; softmax backward and layer_norm backward: 2,
  // g and y or x); the block kernel caches that many rows in shared memory.
  int row_inputs = 1;
  // Data addresses of every row array and per-column array (weight, bias) the kernel reads or
  // writes: vector loads need each one 16-byte aligned (0 counts as aligned).
  std::vector<uint64_t> addresses;
  int sms = 132;  // streaming multiprocessors of the device (grid sizing)
};

struct RowPlan {
  RowKernel kernel = RowKernel::Warp;
  // Elements per vector load: 16 bytes' worth when every address is 16-byte aligned and cols is a
  // multiple of it (so every row starts aligned too); else 1.
  int vector_elements = 1;
  // Warp kernel: lanes per row (a power of two, <= 32) and vectors per lane (a power of two, the
  // kernel's compile-time register capacity); lanes * vectors * vector_elements >= cols.
  int lanes = 32;
  int vectors = 1;
  int rows_per_block = 1;  // warp: (threads / 32) * (32 / lanes); block: 1
  int threads = kWarpThreadsPerBlock;
  int64_t blocks = 1;  // the grid; blocks stride over row groups when rows need more
  bool cache_in_shared = false;  // block kernel: row(s) kept in shared memory
  int64_t shared_bytes = 0;      // dynamic shared memory of the launch
};

// Throws chorus::Error for negative sizes or an element size other than 1, 2, 4, 8.
RowPlan plan_rows(const RowProblem& problem);

// --- index math shared by the CUDA kernels and the CPU test -------------------------------------

// Warp kernel: the row group a thread belongs to in its block, and its lane within that group.
CHORUS_HD CHORUS_INLINE int warp_row_in_block(int thread, int lanes) { return thread / lanes; }
CHORUS_HD CHORUS_INLINE int warp_lane(int thread, int lanes) { return thread % lanes; }
// Warp kernel: first column of vector j of lane `lane`.
CHORUS_HD CHORUS_INLINE int64_t warp_column(int lane, int j, int lanes, int vector_elements) {
  return (static_cast<int64_t>(j) * lanes + lane) * vector_elements;
}
// Block kernel: first column of vector k (0, 1, ...) of thread t.
CHORUS_HD CHORUS_INLINE int64_t block_column(int thread, int64_t k, int threads, int vector_elements) {
  return (k * threads + thread) * vector_elements;
}

// Online softmax statistics of part of a row (the block kernel's one pass): m, the running maximum,
// and s, the sum of exp(x - m). A NaN never becomes the maximum but makes s NaN for good, as the
// CPU softmax's row is all NaN then: while no finite maximum has been seen s is 0 or NaN and is kept
// (not reset) when one arrives; exp(v - v) is NaN for v = inf, as on the CPU.
template <typename Acc>
CHORUS_HD CHORUS_INLINE void online_add(Acc& m, Acc& s, Acc v) {
  const Exp exp_;
  const Acc neg_inf = static_cast<Acc>(-INFINITY);
  if (v > m) {
    s = (m == neg_inf ? s : s * exp_(m - v)) + exp_(v - v);
    m = v;
  } else if (m != neg_inf) {
    s += exp_(v - m);
  } else if (v != v) {
    s = v;
  }
}
// Two parts' statistics combined into (m, s). A part with no finite maximum adds s * exp(-inf) = 0
// (or its NaN); when neither has one the sums are added unscaled (0, or NaN if a NaN was seen),
// since exp(-inf - -inf) is NaN.
template <typename Acc>
CHORUS_HD CHORUS_INLINE void online_combine(Acc& m, Acc& s, Acc m2, Acc s2) {
  const Exp exp_;
  const Acc top = m2 > m ? m2 : m;
  if (top == static_cast<Acc>(-INFINITY)) {
    s = s + s2;
  } else {
    s = s * exp_(m - top) + s2 * exp_(m2 - top);
  }
  m = top;
}

}  // namespace chorus::kernels::shared

namespace chorus::kernels::shared {

// Per-column sums over rows (layer_norm's weight and bias gradients): blocks of 32 columns x
// kColumnSumRowLanes row lanes, the rows split into `chunks` pieces (blockIdx.y), each block writing
// one partial per column and chunk; a second kernel adds a column's partials in chunk order
// (deterministic: no atomics). Enough chunks to give every SM a few blocks even when cols is small.
constexpr int kColumnSumRowLanes = 8;
struct ColumnSumPlan {
  int64_t column_tiles = 0;    // blockIdx.x: ceil(cols / 32)
  int64_t chunks = 1;          // blockIdx.y
  int64_t rows_per_chunk = 0;  // chunk c covers rows [c * rows_per_chunk, min(rows, (c + 1) * rows_per_chunk))
};
ColumnSumPlan plan_column_sums(int64_t rows, int64_t cols, int sms);

}  // namespace chorus::kernels::shared
