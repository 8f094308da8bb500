// tensor/cpu_memory.h: live CPU storage bytes, their peak, and the calling thread's own net count
// (another thread's free does not change it), which the pipeline runtime uses to measure
// activation memory.
#include <catch2/catch.hpp>

#include <thread>

#include "tensor/cpu_memory.h"
#include "tensor/ops.h"

using namespace chorus;

TEST_CASE("CPU memory counters follow tensors' storage, and the peak holds the most", "[tensor][memory]") {
  const size_t base = cpu_memory_allocated();
  reset_cpu_peak_memory_stats();
  CHECK(cpu_max_memory_allocated() == base);
  {
    Tensor a = zeros({1000}, {.dtype = kFloat64});  // 8000 bytes
    CHECK(cpu_memory_allocated() == base + 8000);
    Tensor v = a.narrow(0, 10, 100);  // a view: no new storage
    CHECK(cpu_memory_allocated() == base + 8000);
    {
      Tensor b = zeros({250}, {.dtype = kFloat32});  // 1000 bytes
      CHECK(cpu_memory_allocated() == base + 9000);
    }
    CHECK(cpu_memory_allocated() == base + 8000);
  }
  CHECK(cpu_memory_allocated() == base);
  CHECK(cpu_max_memory_allocated() == base + 9000);
  reset_cpu_peak_memory_stats();
  CHECK(cpu_max_memory_allocated() == base);
}

TEST_CASE("the per-thread count ignores other threads' frees", "[tensor][memory]") {
  const long long mine = cpu_memory_allocated_by_this_thread();
  Tensor a = zeros({512}, {.dtype = kFloat64});  // 4096 bytes, allocated here
  CHECK(cpu_memory_allocated_by_this_thread() == mine + 4096);
  long long theirs_before = 0, theirs_after = 0;
  std::thread t([&, held = std::move(a)]() mutable {
    theirs_before = cpu_memory_allocated_by_this_thread();
    held = Tensor();  // the last reference goes on this thread
    theirs_after = cpu_memory_allocated_by_this_thread();
  });
  t.join();
  CHECK(theirs_after == theirs_before - 4096);
  CHECK(cpu_memory_allocated_by_this_thread() == mine + 4096);  // still counted where it was allocated
}
