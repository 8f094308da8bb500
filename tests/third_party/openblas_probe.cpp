// Reports what a chorus program does with the OpenBLAS the loader gave it, for openblas_build_test:
// the path the loader found it at, which build that is (openblas_get_parallel: 0 sequential, 1
// pthreads, 2 OpenMP), where the MLP's
// second weight gradient (256 x 128 x 512, A transposed) goes at 1 and at 2 threads, and that
// product's largest difference from a float64 sum at 2 threads. One "key=value" line each; exit 0.
// A cc_binary, so that a copy of it runs outside Bazel's tree as a user's program would: chorus's
// libraries are linked in, and only the system's shared libraries are looked up at run time.
#include <cblas.h>
#include <link.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "tensor/generator.h"
#include "tensor/ops.h"

// kernels/cpu/gemm.cpp defines these (gemm_test declares them the same way: [No header] there).
namespace chorus::kernels::cpu {
enum class GemmRoute : int { kOpenBlas, kOneDnn, kCopyA, kTransposeC, kSplitC };
GemmRoute sgemm_route(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_row_major, bool c_row_major,
                      bool beta_zero, int64_t ldb, bool b_aligned);
}  // namespace chorus::kernels::cpu

namespace {

const char* route_name(chorus::kernels::cpu::GemmRoute r) {
  using R = chorus::kernels::cpu::GemmRoute;
  return r == R::kOpenBlas ? "openblas" : r == R::kOneDnn ? "onednn" : r == R::kCopyA ? "copy_a"
                            : r == R::kTransposeC ? "transpose_c" : "split_c";
}

// The name the loader gave libopenblas.so.0 (the folder it found it in, links not followed).
std::string openblas_path() {
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libopenblas") != nullptr)
          *static_cast<std::string*>(out) = info->dlpi_name;
        return 0;
      },
      &path);
  return path;
}

}  // namespace

int main() {
  using namespace chorus;
  const int64_t m = 256, k = 128, n = 512;
  std::printf("path=%s\n", openblas_path().c_str());
  std::printf("parallel=%d\n", openblas_get_parallel());
  std::printf("config=%s\n", openblas_get_config());
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::printf("route_%d=%s\n", threads, route_name(kernels::cpu::sgemm_route(m, n, k, true, true, true, true, n, true)));
  }
  // The product itself at 2 threads, A a transposed view, against a float64 sum of the same floats.
  manual_seed(5);
  const Tensor at = randn({k, m}), b = randn({k, n});
  const Tensor c = mm(at.t(), b).contiguous();
  const float* pa = at.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  const float* pc = c.data_ptr<float>();
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(pa[p * m + i]) * pb[p * n + j];
      worst = std::max(worst, std::abs(sum - pc[i * n + j]));
    }
  }
  std::printf("max_error=%.9g\n", worst);
  return 0;
}
