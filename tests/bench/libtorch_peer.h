// What the benchmarks that time libtorch 1.13 beside chorus share: the peer's thread count.
#pragma once

// Only ATen/Parallel.h: each benchmark includes the libtorch headers it uses (torch/torch.h alone
// takes ~19 s of a compile).
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace chorus::bench {

// libtorch's thread count. Debian's libtorch runs its matrix products in the OpenBLAS that
// libopenblas.so.0 names, and the default alternative is the pthreads build, which ignores
// at::set_num_threads (OpenMP's count) and uses every core: "1 thread" was two on a 2-core
// machine, and "2 threads" two OpenMP threads each starting two OpenBLAS threads (issue 38). So the
// loaded OpenBLAS gets the same count, through its own call, found at run time.
inline void peer_threads(int threads) {
  at::set_num_threads(threads);
  using SetThreads = void (*)(int);
  static const auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  static const bool said = [] {
    using Config = char* (*)();
    const auto config = reinterpret_cast<Config>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
    std::fprintf(stderr, "libtorch's BLAS: %s\n",
                 config ? config() : set_blas ? "OpenBLAS" : "not OpenBLAS (its threads follow torch::set_num_threads)");
    // [Peer at its best] OPENBLAS_CORETYPE, read when OpenBLAS loads, fixes its kernels: this
    // project's machines set OPENBLAS_CORETYPE=Haswell in the environment, so on an AVX-512 CPU
    // libtorch's products ran AVX2 code beside chorus's AVX-512 oneDNN (Zen 5, 2026-11-30: the MLP
    // step 0.54 of libtorch's with it, 0.88 without; BERT-mini b8 0.52 and 0.77). On stdout, so a
    // table saved without it says so; imposing AVX2 on both sides (CHORUS_CPU_CAPABILITY=avx2) is
    // the one fair use.
    const char* core = std::getenv("OPENBLAS_CORETYPE");
    const char* capped = std::getenv("CHORUS_CPU_CAPABILITY");
    if (core != nullptr && __builtin_cpu_supports("avx512f") && !(capped != nullptr && std::string(capped) == "avx2"))
      std::printf("WARNING: OPENBLAS_CORETYPE=%s holds libtorch's OpenBLAS to those kernels while chorus runs at this "
                  "CPU's best: not a fair comparison; run with `env -u OPENBLAS_CORETYPE`, or impose AVX2 on both "
                  "sides (CHORUS_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=avx2)\n\n",
                  core);
    return true;
  }();
  (void)said;
  // CHORUS_PEER_BLAS_THREADS=n: OpenBLAS's count set apart (to look for libtorch's best setting).
  const char* blas_env = std::getenv("CHORUS_PEER_BLAS_THREADS");
  if (set_blas) set_blas(blas_env ? std::max(1, std::atoi(blas_env)) : threads);
}

}  // namespace chorus::bench
