// kernels/shared/row_plan: the row kernels' launch choices (warp or block kernel, vector width from
// alignment, lanes and vectors per lane, rows per block, grid, shared-memory cache), and the plans
// executed on the CPU: an emulated launch walks the kernels' index math (warp_column with butterfly
// reductions inside each lane group, or block_column with a block reduction) to compute a softmax
// of random rows, every element written exactly once, compared with chorus's CPU softmax.
#include "kernels/shared/row_plan.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace {

using namespace chorus;
namespace sm = chorus::kernels::shared;

sm::RowPlan plan(int64_t rows, int64_t cols, int64_t size, uint64_t address = 0, int row_inputs = 1) {
  return sm::plan_rows({.rows = rows, .cols = cols, .element_size_bytes = size, .row_inputs = row_inputs,
                        .addresses = {address, 0}, .sms = 132});
}

// Online softmax statistics (max, sum of exp(x - max)), with the functions the CUDA block kernel
// runs (sm::online_add per element, sm::online_combine across threads).
struct Stats {
  double m = -std::numeric_limits<double>::infinity(), s = 0;
};

// Runs the plan's launch on the CPU: softmax of x [rows, cols] into y, counting writes per element.
void emulate_softmax(const sm::RowPlan& p, const float* x, float* y, int64_t rows, int64_t cols,
                     std::vector<int>& writes) {
  const int V = p.vector_elements;
  if (p.kernel == sm::RowKernel::Warp) {
    REQUIRE(static_cast<int64_t>(p.lanes) * p.vectors * V >= cols);
    for (int64_t block = 0; block < p.blocks; ++block) {
      for (int64_t first = block * p.rows_per_block; first < rows; first += p.blocks * p.rows_per_block) {
        for (int t = 0; t < p.threads; t += p.lanes) {  // one lane group (row) at a time
          const int64_t row = first + sm::warp_row_in_block(t, p.lanes);
          REQUIRE(sm::warp_row_in_block(t, p.lanes) < p.rows_per_block);
          if (row >= rows) continue;
          // Per-lane maxima, then the butterfly: lane l combines with l ^ offset, offsets lanes/2 .. 1.
          std::vector<double> mx(p.lanes, -std::numeric_limits<double>::infinity()), sum(p.lanes, 0);
          for (int l = 0; l < p.lanes; ++l) {
            REQUIRE(sm::warp_lane(t + l, p.lanes) == l);
            for (int j = 0; j < p.vectors; ++j) {
              const int64_t c = sm::warp_column(l, j, p.lanes, V);
              for (int i = 0; i < V && c < cols; ++i) {
                REQUIRE(c + i < cols);  // a vector is never cut by the row's end
                mx[l] = std::max<double>(mx[l], x[row * cols + c + i]);
              }
            }
          }
          for (int off = p.lanes / 2; off > 0; off >>= 1) {
            std::vector<double> next = mx;
            for (int l = 0; l < p.lanes; ++l) next[l] = std::max(mx[l], mx[l ^ off]);
            mx = next;
          }
          for (int l = 0; l < p.lanes; ++l)
            for (int j = 0; j < p.vectors; ++j)
              for (int i = 0; i < V; ++i)
                if (sm::warp_column(l, j, p.lanes, V) + i < cols)
                  sum[l] += std::exp(x[row * cols + sm::warp_column(l, j, p.lanes, V) + i] - mx[l]);
          for (int off = p.lanes / 2; off > 0; off >>= 1) {
            std::vector<double> next = sum;
            for (int l = 0; l < p.lanes; ++l) next[l] = sum[l] + sum[l ^ off];
            sum = next;
          }
          for (int l = 0; l < p.lanes; ++l) {
            REQUIRE(mx[l] == mx[0]);
            for (int j = 0; j < p.vectors; ++j)
              for (int i = 0; i < V; ++i) {
                const int64_t c = sm::warp_column(l, j, p.lanes, V) + i;
                if (c >= cols) continue;
                y[row * cols + c] = static_cast<float>(std::exp(x[row * cols + c] - mx[l]) / sum[l]);
                ++writes[row * cols + c];
              }
          }
        }
      }
    }
    return;
  }
  REQUIRE(cols % V == 0);
  for (int64_t block = 0; block < p.blocks; ++block) {
    for (int64_t row = block; row < rows; row += p.blocks) {
      std::vector<Stats> per_thread(p.threads);
      for (int t = 0; t < p.threads; ++t)
        for (int64_t k = 0; sm::block_column(t, k, p.threads, V) < cols; ++k)
          for (int i = 0; i < V; ++i)
            sm::online_add(per_thread[t].m, per_thread[t].s,
                           static_cast<double>(x[row * cols + sm::block_column(t, k, p.threads, V) + i]));
      Stats all;
      for (const Stats& s : per_thread) sm::online_combine(all.m, all.s, s.m, s.s);
      for (int t = 0; t < p.threads; ++t)
        for (int64_t k = 0; sm::block_column(t, k, p.threads, V) < cols; ++k)
          for (int i = 0; i < V; ++i) {
            const int64_t c = sm::block_column(t, k, p.threads, V) + i;
            y[row * cols + c] = static_cast<float>(std::exp(x[row * cols + c] - all.m) / all.s);
            ++writes[row * cols + c];
          }
    }
  }
}

}  // namespace

TEST_CASE("rows up to 4 KiB take the warp kernel with 16-byte vectors when aligned", "[row_plan]") {
  sm::RowPlan p = plan(1000, 1024, 4);
  CHECK(p.kernel == sm::RowKernel::Warp);
  CHECK(p.vector_elements == 4);
  CHECK(p.lanes == 32);
  CHECK(p.vectors == 8);
  CHECK(p.rows_per_block == 4);
  CHECK(p.blocks == 250);
  p = plan(49152, 128, 4);  // one 16-byte vector per lane
  CHECK((p.kernel == sm::RowKernel::Warp && p.vector_elements == 4 && p.lanes == 32 && p.vectors == 1));
  CHECK(p.blocks == 132 * 16 * 2);  // capped: the grid strides over the remaining rows
  p = plan(10, 32, 4);  // 8 lanes of one vector each, 4 rows per warp
  CHECK((p.lanes == 8 && p.vectors == 1 && p.vector_elements == 4 && p.rows_per_block == 16 && p.blocks == 1));
  p = plan(100, 1, 4);  // one lane per row, 32 rows per warp
  CHECK((p.kernel == sm::RowKernel::Warp && p.lanes == 1 && p.vectors == 1 && p.vector_elements == 1));
  CHECK(p.rows_per_block == 128);
  p = plan(7, 33, 4);  // 33 is no multiple of 4: scalar, two per lane
  CHECK((p.vector_elements == 1 && p.lanes == 32 && p.vectors == 2));
  p = plan(7, 1023, 4);
  CHECK((p.vector_elements == 1 && p.lanes == 32 && p.vectors == 32));
  p = plan(7, 512, 8);  // float64: 2 per vector, 512 columns still in registers
  CHECK((p.kernel == sm::RowKernel::Warp && p.vector_elements == 2 && p.vectors == 8));
  p = plan(7, 1024, 2);  // 16-bit storage: 8 per vector
  CHECK((p.kernel == sm::RowKernel::Warp && p.vector_elements == 8 && p.lanes == 32 && p.vectors == 4));
}

TEST_CASE("a misaligned array turns vectors off", "[row_plan]") {
  CHECK(plan(4, 1024, 4, 4).vector_elements == 1);
  CHECK(plan(4, 1024, 4, 16).vector_elements == 4);
  CHECK(plan(4, 1024, 8, 8).vector_elements == 1);
  CHECK(plan(4, 1026, 4, 0).vector_elements == 1);  // row starts every 1026 * 4 bytes: not all aligned
  CHECK(plan(4, 1024, 4, 4).vectors == 32);
}

TEST_CASE("longer rows take a block each, cached in shared memory when they fit", "[row_plan]") {
  sm::RowPlan p = plan(100, 1025, 4);
  CHECK(p.kernel == sm::RowKernel::Block);
  CHECK(p.vector_elements == 1);
  CHECK(p.threads == 256);
  CHECK(p.cache_in_shared);
  CHECK(p.shared_bytes == 1025 * 4);
  CHECK(p.blocks == 100);
  p = plan(100, 513, 8);
  CHECK((p.kernel == sm::RowKernel::Block && p.shared_bytes == 513 * 8));
  p = plan(5, 4096, 4);
  CHECK((p.threads == 128 && p.vector_elements == 4 && p.cache_in_shared));
  p = plan(5, 10000, 4);
  CHECK((p.threads == 512 && p.vector_elements == 4 && p.cache_in_shared && p.shared_bytes == 40000));
  p = plan(5, 10000, 4, 0, 2);  // two row arrays (a backward): 80000 bytes do not fit
  CHECK((!p.cache_in_shared && p.shared_bytes == 0));
  p = plan(1 << 20, 100000, 4);
  CHECK((p.threads == 1024 && !p.cache_in_shared && p.blocks == 132 * 2 * 2));
  // The 48 KiB a block may use by default hold the kernels' static arrays too: a row of 48 KiB
  // (float32 12288 columns, GPT-3's width) is not cached; one that leaves kRowStaticSharedBytes is.
  p = plan(5, 12288, 4);
  CHECK((p.kernel == sm::RowKernel::Block && !p.cache_in_shared && p.shared_bytes == 0));
  p = plan(5, 12032, 4);
  CHECK((p.cache_in_shared && p.shared_bytes == 12032 * 4));
  p = plan(5, 6144, 4, 0, 2);  // a backward's two rows of 24 KiB
  CHECK(!p.cache_in_shared);
  p = plan(5, 12288, 2, 0, 2);  // bf16 layer_norm backward at 12288
  CHECK(!p.cache_in_shared);
  CHECK_THROWS_AS(plan(-1, 4, 4), Error);
  CHECK_THROWS_AS(plan(1, 4, 3), Error);
}

TEST_CASE("every warp plan fits the kernels' instantiations; a block plan's shared memory fits the default limit", "[row_plan]") {
  // dispatch_row_shape (kernels/cuda/row_kernels.h) instantiates vectors per lane 1 ... kMaxWarpVectors
  // with vectors * vector_elements * size <= kWarpRowBytes / 32. 16-bit rows loaded one element at a
  // time (a column count no multiple of 8, or a misaligned view) of 1025-2048 columns needed 64.
  sm::RowPlan p = plan(4, 1500, 2, 2);  // bf16, Whisper's 1500 frames
  CHECK((p.kernel == sm::RowKernel::Block && p.vector_elements == 1));
  for (int64_t size : {1, 2, 4, 8}) {
    for (uint64_t address : {uint64_t(0), uint64_t(size % 16)}) {
      for (int64_t cols = 1; cols <= 3 * sm::kWarpRowBytes / size; ++cols) {
        for (int inputs : {1, 2}) {
          p = plan(3, cols, size, address, inputs);
          if (p.kernel == sm::RowKernel::Warp) {
            const bool fits = p.vectors >= 1 && p.vectors <= sm::kMaxWarpVectors && (p.vectors & (p.vectors - 1)) == 0 &&
                              p.vectors * p.vector_elements * size <= sm::kWarpRowBytes / 32 &&
                              static_cast<int64_t>(p.lanes) * p.vectors * p.vector_elements >= cols;
            if (!fits) FAIL("size " << size << " cols " << cols << " address " << address << ": vectors " << p.vectors);
          } else {
            if (p.shared_bytes + sm::kRowStaticSharedBytes > sm::kBlockCacheBytes)
              FAIL("size " << size << " cols " << cols << ": shared " << p.shared_bytes);
          }
        }
      }
    }
  }
}

TEST_CASE("the emulated launch computes softmax equal to chorus's, every element written once", "[row_plan]") {
  std::mt19937 rng(7);
  for (int64_t cols : {1, 2, 31, 32, 33, 100, 128, 1023, 1024, 1025, 4096, 10000}) {
    for (int64_t rows : {1, 3, 200}) {
      for (bool misaligned : {false, true}) {
        INFO("rows " << rows << " cols " << cols << (misaligned ? " misaligned" : ""));
        Generator g(rng());
        const Tensor base = mul(randn({rows * cols + 1}, {}, &g), 4.0);
        const Tensor x = base.narrow(0, misaligned ? 1 : 0, rows * cols).reshape({rows, cols}).contiguous();
        const float* px = x.data_ptr<float>() + 0;
        if (rows >= 3 && cols >= 3) {
          // A NaN first in row 0 (a thread's first element, before any finite one); in row 1 a NaN
          // after a prefix of -inf (a causal mask); row 2 all -inf. The CPU's rows 0-2 are all NaN.
          float* w = x.data_ptr<float>();
          w[0] = std::nanf("");
          const int64_t prefix = std::min<int64_t>(cols - 2, 40);
          for (int64_t c = 0; c < prefix; ++c) w[cols + c] = -INFINITY;
          w[cols + prefix] = std::nanf("");
          for (int64_t c = 0; c < cols; ++c) w[2 * cols + c] = -INFINITY;
        }
        // The address the plan sees: the view's own (contiguous() keeps an offset view as it is).
        const sm::RowPlan p = sm::plan_rows({.rows = rows, .cols = cols, .element_size_bytes = 4, .row_inputs = 1,
                                             .addresses = {reinterpret_cast<uint64_t>(px)}, .sms = 2});
        if (misaligned && reinterpret_cast<uint64_t>(px) % 16 != 0) CHECK(p.vector_elements == 1);
        std::vector<float> y(rows * cols, std::nanf(""));
        std::vector<int> writes(rows * cols, 0);
        emulate_softmax(p, px, y.data(), rows, cols, writes);
        const Tensor expected = softmax(x, 1);
        const float* pe = expected.data_ptr<float>();
        double worst = 0;
        bool once = true;
        int64_t nan_mismatches = 0;
        for (int64_t i = 0; i < rows * cols; ++i) {
          if (std::isnan(y[i]) || std::isnan(pe[i])) {
            nan_mismatches += std::isnan(y[i]) != std::isnan(pe[i]);
          } else {
            worst = std::max(worst, static_cast<double>(std::abs(y[i] - pe[i])));
          }
          once = once && writes[i] == 1;
        }
        if (rows >= 3 && cols >= 3) CHECK(std::isnan(pe[cols - 1]));  // the reference's NaN row
        CHECK(once);
        CHECK(nan_mismatches == 0);
        CHECK(worst <= 1e-6);
      }
    }
  }
}

TEST_CASE("column sums: chunks cover the rows, enough blocks for the SMs", "[row_plan]") {
  sm::ColumnSumPlan p = sm::plan_column_sums(65536, 1024, 132);
  CHECK(p.column_tiles == 32);
  CHECK(p.chunks == 17);  // ceil(4 * 132 / 32) chunks of 3856 rows
  CHECK(p.rows_per_chunk * p.chunks >= 65536);
  CHECK(p.rows_per_chunk * (p.chunks - 1) < 65536);
  p = sm::plan_column_sums(100, 1024, 132);  // too few rows to split
  CHECK((p.chunks == 1 && p.rows_per_chunk == 100));
  p = sm::plan_column_sums(0, 10, 132);
  CHECK((p.chunks == 1 && p.rows_per_chunk == 0 && p.column_tiles == 1));
  p = sm::plan_column_sums(1 << 20, 8, 132);
  CHECK((p.column_tiles == 1 && p.chunks == 528));
}
