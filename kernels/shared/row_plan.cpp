// kernels/shared/row_plan.h: the choice of row kernel and its launch shape.
#include "kernels/shared/row_plan.h"

#include <algorithm>

#include "tensor/error.h"

namespace chorus::kernels::shared {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

RowPlan plan_rows(const RowProblem& problem) {
  const int64_t rows = problem.rows, cols = problem.cols, size = problem.element_size_bytes;
  if (rows < 0 || cols < 0) fail("plan_rows: negative size [{}, {}]", rows, cols);
  if (size != 1 && size != 2 && size != 4 && size != 8) fail("plan_rows: element size {} bytes", size);
  if (problem.row_inputs < 1) fail("plan_rows: row_inputs {} (at least one row array is read)", problem.row_inputs);
  const int64_t sms = std::max(problem.sms, 1);
  RowPlan plan;
  // 16-byte vectors when every array and every row start is aligned: a row starts at r * cols
  // elements from its array's start, hence cols % vector == 0.
  const int64_t vec = 16 / size;
  bool aligned = cols % vec == 0;
  for (uint64_t a : problem.addresses) aligned = aligned && a % 16 == 0;
  plan.vector_elements = aligned ? static_cast<int>(vec) : 1;
  const int64_t chunks = ceil_div(cols, plan.vector_elements);  // vectors per row

  if (cols * size <= kWarpRowBytes && ceil_div(chunks, 32) <= kMaxWarpVectors) {
    plan.kernel = RowKernel::Warp;
    // Short rows share a warp: as few lanes as cover the row's vectors, so no lane idles for
    // rows like 32 float32 columns (8 lanes of one 16-byte vector, 4 rows per warp).
    plan.lanes = static_cast<int>(std::min<int64_t>(32, next_pow2(std::max<int64_t>(chunks, 1))));
    plan.vectors = static_cast<int>(next_pow2(std::max<int64_t>(ceil_div(chunks, plan.lanes), 1)));
    plan.threads = kWarpThreadsPerBlock;
    plan.rows_per_block = (plan.threads / 32) * (32 / plan.lanes);
    // Enough blocks to fill every SM twice over (2048 threads per SM); more row groups than that
    // are walked by a grid-stride loop, which keeps launch counts bounded for any rows.
    const int64_t groups = ceil_div(rows, plan.rows_per_block);
    plan.blocks = std::max<int64_t>(1, std::min<int64_t>(groups, sms * (2048 / plan.threads) * 2));
    return plan;
  }
  plan.kernel = RowKernel::Block;
  // About eight vectors per thread: enough loads in flight per thread, and a long row still gets
  // at most 1024 threads.
  plan.threads = static_cast<int>(std::clamp<int64_t>(next_pow2(ceil_div(chunks, 8)), 128, 1024));
  plan.lanes = 32;
  plan.vectors = 1;
  plan.rows_per_block = 1;
  const int64_t cache_bytes = cols * size * problem.row_inputs;
  plan.cache_in_shared = cache_bytes <= kBlockCacheBytes - kRowStaticSharedBytes;
  plan.shared_bytes = plan.cache_in_shared ? cache_bytes : 0;
  plan.blocks = std::max<int64_t>(1, std::min<int64_t>(rows, sms * std::max(1, 2048 / plan.threads) * 2));
  return plan;
}

ColumnSumPlan plan_column_sums(int64_t rows, int64_t cols, int sms) {
  if (rows < 0 || cols < 0) fail("plan_column_sums: negative size [{}, {}]", rows, cols);
  ColumnSumPlan plan;
  plan.column_tiles = ceil_div(cols, 32);
  if (rows == 0 || cols == 0) {
    plan.rows_per_chunk = rows;
    return plan;
  }
  // About 4 blocks per SM in all, and at least 32 rows per row lane in a chunk, so a partial is
  // worth writing; at most 65535 chunks (gridDim.y's limit).
  const int64_t want = ceil_div(4LL * std::max(sms, 1), plan.column_tiles);
  const int64_t most = std::max<int64_t>(1, rows / (32 * kColumnSumRowLanes));
  plan.chunks = std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 65535));
  plan.rows_per_chunk = ceil_div(rows, plan.chunks);
  plan.chunks = ceil_div(rows, plan.rows_per_chunk);  // no empty chunk at the end
  return plan;
}

}  // namespace chorus::kernels::shared
