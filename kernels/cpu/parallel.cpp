#include "kernels/cpu/parallel.h"

#include <Eigen/Core>

#include <atomic>
#include <cstdlib>
#include <mutex>
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

void sync_eigen_threads() {
  // Eigen keeps its thread count in a plain static int that it reads inside every product. Writing
  // it on every GEMM (as this file once did) raced with products running on other threads (the sim
  // device's stream workers; ThreadSanitizer found it), so it is written only when it changes, and
  // the release/acquire on `applied` orders that write before any product that relies on it.
  static std::atomic<int> applied{0};
  static std::mutex mutex;
  const int want = num_threads();
  if (applied.load(std::memory_order_acquire) == want) return;
  std::lock_guard<std::mutex> lock(mutex);
  if (applied.load(std::memory_order_relaxed) == want) return;
  Eigen::setNbThreads(want);
  applied.store(want, std::memory_order_release);
}

void set_num_threads(int threads) {
  g_threads.store(threads, std::memory_order_relaxed);
  omp_set_num_threads(threads);
}

}  // namespace chorus::kernels::cpu
