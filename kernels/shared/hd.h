// CHORUS_HD marks a function that both the CPU kernels (g++) and the CUDA kernels (nvcc) compile:
// `__host__ __device__` under nvcc, nothing under g++. CHORUS_INLINE asks for inlining on both sides,
// since these are per-element functions inside the hottest loops.
#pragma once

#if defined(__CUDACC__)
#define CHORUS_HD __host__ __device__
#define CHORUS_INLINE __forceinline__
#else
#define CHORUS_HD
#define CHORUS_INLINE inline __attribute__((always_inline))
#endif
