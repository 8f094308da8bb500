#include "kernels/cpu/parallel.h"

#include <atomic>
#include <cstdlib>
#include <thread>

namespace chorus::kernels::cpu {
namespace {
std::atomic<int> g_threads{0};  // 0: not set yet, use the hardware's cores
}

int num_threads() {
  int t = g_threads.load(std::memory_order_relaxed);
  if (t > 0) return t;
  // OMP_NUM_THREADS when set (as PyTorch; chorusrun sets it to cores / workers), else the cores.
  // hardware_concurrency() reads sysfs (open/read/close) on every call: ask once.
  static const int hw = [] {
    if (const char* env = std::getenv("OMP_NUM_THREADS")) {
      const int v = std::atoi(env);
      if (v > 0) return v;
    }
    unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }();
  return hw;
}

void set_num_threads(int threads) {
  g_threads.store(threads, std::memory_order_relaxed);
  omp_set_num_threads(threads);
}

}  // namespace chorus::kernels::cpu
