// What the benchmarks that time libtorch 1.13 beside chorus share: the peer's thread count.
#pragma once

#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace chorus::bench {

// libtorch's thread count. Debian's libtorch runs its matrix products in the OpenBLAS that
// libopenblas.so.0 names, and the default alternative is the pthreads build, which ignores
// torch::set_num_threads (OpenMP's count) and uses every core: "1 thread" was two on a 2-core
// machine, and "2 threads" two OpenMP threads each starting two OpenBLAS threads (issue 38). So the
// loaded OpenBLAS gets the same count, through its own call, found at run time.
inline void peer_threads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  static const auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  static const bool said = [] {
    using Config = char* (*)();
    const auto config = reinterpret_cast<Config>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
    std::fprintf(stderr, "libtorch's BLAS: %s\n",
                 config ? config() : set_blas ? "OpenBLAS" : "not OpenBLAS (its threads follow torch::set_num_threads)");
    return true;
  }();
  (void)said;
  // CHORUS_PEER_BLAS_THREADS=n: OpenBLAS's count set apart (to look for libtorch's best setting).
  const char* blas_env = std::getenv("CHORUS_PEER_BLAS_THREADS");
  if (set_blas) set_blas(blas_env ? std::max(1, std::atoi(blas_env)) : threads);
}

}  // namespace chorus::bench
