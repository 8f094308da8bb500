// Vector variants of libm's functions for the CPU kernels' loops. glibc's libmvec (2.35+) has
// SIMD versions of exp, log, erf, tanh, sin, cos, ... under the x86-64 vector function ABI names
// (_ZGVdN8v_expf: AVX2, 8 floats), each an IFUNC that picks its implementation for the CPU at run
// time. Declaring the scalar functions `simd` lets GCC call those from a loop marked
// `#pragma omp simd` (loops.h's contiguous paths), instead of one scalar libm call per element:
// GELU's erf, softmax's and cross-entropy's exp, ... become vector code. The vector versions are
// accurate to a few ULP (glibc's documented bounds), as the scalar ones are to one.
// Link with -lmvec (kernels/cpu/BUILD does). CPU only: CUDA code has its own math library.
// GCC's attribute only: clang (the sanitizer builds, docs/build.md) does not know it, and its loops
// call the scalar functions.
#pragma once

#include <cmath>

#if !defined(__clang__)

#define CHORUS_SIMD_DECL(name) __attribute__((simd("notinbranch"))) float name##f(float); \
  __attribute__((simd("notinbranch"))) double name(double);

extern "C" {
CHORUS_SIMD_DECL(exp)
CHORUS_SIMD_DECL(expm1)
CHORUS_SIMD_DECL(log)
CHORUS_SIMD_DECL(log1p)
CHORUS_SIMD_DECL(log2)
CHORUS_SIMD_DECL(log10)
CHORUS_SIMD_DECL(erf)
CHORUS_SIMD_DECL(erfc)
CHORUS_SIMD_DECL(tanh)
CHORUS_SIMD_DECL(sin)
CHORUS_SIMD_DECL(cos)
CHORUS_SIMD_DECL(tan)
CHORUS_SIMD_DECL(asin)
CHORUS_SIMD_DECL(acos)
CHORUS_SIMD_DECL(atan)
CHORUS_SIMD_DECL(sinh)
CHORUS_SIMD_DECL(cosh)
}

#undef CHORUS_SIMD_DECL

#endif  // !defined(__clang__)
