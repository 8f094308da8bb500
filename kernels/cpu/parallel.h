// parallel_for over an index range with OpenMP threads. Ranges smaller than `grain` run inline on
// the calling thread, so tiny tensors never pay for waking a thread team; a call from inside a
// parallel region also runs inline (no nested teams).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace chorus::kernels::cpu {

// Elements per thread below which splitting does not pay for itself (about 10 us of simple work).
inline constexpr int64_t kGrainSize = 32768;

int num_threads();
void set_num_threads(int threads);
// Tells Eigen's GEMM num_threads() (written only when it changed: Eigen's setting is a plain global).
void sync_eigen_threads();

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  int64_t n = end - begin;
  if (n <= 0) return;
  int threads = num_threads();
  if (n <= grain || threads <= 1 || omp_in_parallel()) {
    f(begin, end);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
#ifdef _OPENMP  // translation units built without -fopenmp (outside kernels/) run chunks in turn
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static, 1)
#endif
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t lo = begin + n * c / chunks;
    int64_t hi = begin + n * (c + 1) / chunks;
    f(lo, hi);
  }
}

}  // namespace chorus::kernels::cpu
