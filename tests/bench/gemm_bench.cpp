// SGEMM GFLOP/s of chorus's CPU matmul against OpenBLAS 0.3.21 (OpenMP build) and oneDNN 2.6's
// dnnl_sgemm in the same run, square 256..2048 and 4096x768x768 (a BERT-base projection), on 1 and 2 threads; and
// elementwise add GB/s on 16M floats against memcpy (the memory-bandwidth ceiling).
//
//   bazel run -c opt //tests/bench:gemm_bench
#include <cblas.h>
#include <dnnl.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "tensor/ops.h"
#include "tests/bench/bench_util.h"

extern "C" void openblas_set_num_threads(int);

using namespace chorus;

int main() {
  struct Size {
    int64_t m, k, n;
  };
  // Square sizes, a BERT-base projection, and the medium shapes of train_step_bench's MLP (128 x 784
  // x 512) and BERT-mini (1024 x 256 x 256, 1024 x 256 x 1024).
  const Size sizes[] = {{256, 256, 256},   {512, 512, 512},  {1024, 1024, 1024}, {2048, 2048, 2048},
                        {4096, 768, 768},  {128, 784, 512},  {1024, 256, 256},   {1024, 256, 1024}};
  {  // Half a second of work first: the CPU leaves its idle clock before anything is timed.
    Tensor a = randn({512, 512}), b = randn({512, 512});
    const double until = bench::now_s() + 0.5;
    while (bench::now_s() < until) a = matmul(a, b).mul(1e-3);
  }
  std::printf("SGEMM C[m,n] = A[m,k] B[k,n], float32, GFLOP/s (median after warm-up)\n\n");
  std::printf("| m x k x n | threads | chorus | OpenBLAS | oneDNN sgemm | chorus / OpenBLAS |\n|---|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    openblas_set_num_threads(threads);
    for (Size s : sizes) {
      manual_seed(1);
      Tensor a = randn({s.m, s.k}), b = randn({s.k, s.n}), c = empty({s.m, s.n});
      const double flop = 2.0 * s.m * s.k * s.n;
      const int reps = flop > 4e9 ? 5 : 25;
      const double tc = bench::median_time([&] { c = matmul(a, b); }, 5, reps);
      const double to = bench::median_time(
          [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data_ptr<float>(), s.k,
                        b.data_ptr<float>(), s.n, 0.0f, c.data_ptr<float>(), s.n);
          },
          5, reps);
      const double td = bench::median_time(
          [&] {
            dnnl_sgemm('N', 'N', s.m, s.n, s.k, 1.0f, a.data_ptr<float>(), s.k, b.data_ptr<float>(), s.n, 0.0f,
                       c.data_ptr<float>(), s.n);
          },
          5, reps);
      std::printf("| %lld x %lld x %lld | %d | %.1f | %.1f | %.1f | %.2f |\n", (long long)s.m, (long long)s.k,
                  (long long)s.n, threads, flop / tc / 1e9, flop / to / 1e9, flop / td / 1e9, to / tc);
      std::fflush(stdout);
    }
  }
  std::printf("\nElementwise add c = a + b on 16M float32 (3 x 64 MiB touched), GB/s\n\n");
  std::printf("| threads | chorus add | memcpy 64 MiB (2 x 64 MiB touched) |\n|---|---|---|\n");
  const int64_t n = 16 << 20;
  Tensor a = randn({n}), b = randn({n}), c = empty({n});
  std::vector<float> src(n, 1.0f), dst(n);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const double ta = bench::median_time([&] { c = add(a, b); }, 3, 15);
    const double tm = bench::median_time([&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); }, 3, 15);
    std::printf("| %d | %.1f | %.1f |\n", threads, 3.0 * n * 4 / ta / 1e9, 2.0 * n * 4 / tm / 1e9);
  }
  return 0;
}
