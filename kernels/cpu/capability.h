// Which instruction-set variant of chorus's own CPU loops runs, chosen once at start-up from the CPU
// (cpuid) and CHORUS_CPU_CAPABILITY, as PyTorch and oneDNN do. [ISA variants]: the library is built
// for AVX2 + FMA (its floor: every x86-64 server CPU of the last decade); the vector loops of the
// elementwise, optimizer and normalization kernels are compiled a second time for AVX-512 (a
// `#pragma GCC target` region around a template: simd_for in loops.h), and each loop picks its
// variant at run time. Only templates defined inside the region get AVX-512 code; everything they
// call that is defined outside (the shared per-element functors, std::) keeps the floor's code and is
// inlined into them, so no AVX-512 instruction can reach a machine without it through a shared
// out-of-line function (the one-definition-rule hazard of compiling whole files per ISA).
//
// CHORUS_CPU_CAPABILITY=avx512|avx2|default caps it (default: the floor, AVX2, for these loops; oneDNN
// is capped at SSE4.1 then, onednn_conv.h). Asking for AVX-512 on a CPU without it is a chorus::Error.
//
// The sanitizer builds (tools/test.sh --full's tsan and asan phases, clang-14) compile the floor's
// variant only (CHORUS_AVX512_VARIANT 0): at -O1 clang vectorizes no loop, so an AVX-512 copy would
// be the same scalar code compiled twice (kernels/cpu/pointwise.cpp under ASan: 145.5 s with it,
// 117.7 s without, 2026-12-01), and the variants are compared where they differ, in the -c opt
// build (capability_test, the isa phases). There the loops run AVX2 on every CPU, cpu_capability()
// says so, and asking for AVX-512 is a chorus::Error naming the build.
#pragma once

#include <atomic>

#include "tensor/sanitizers.h"

#if CHORUS_ASAN || CHORUS_TSAN
#define CHORUS_AVX512_VARIANT 0
#else
#define CHORUS_AVX512_VARIANT 1
#endif

namespace chorus::kernels::cpu {

enum class CpuCapability : int { kAvx2 = 0, kAvx512 = 1 };

// AVX-512 as the loops use it: F, BW, VL and DQ.
bool cpu_has_avx512();
// Whether the loops can run AVX-512 here: the CPU has it and this build compiled that variant.
inline bool avx512_variant_available() { return CHORUS_AVX512_VARIANT && cpu_has_avx512(); }
// The variant the loops run now (after the first call: one relaxed atomic load).
CpuCapability cpu_capability();
// Switches the variant at run time (tests and benchmarks compare them in one process); chorus::Error
// when the CPU lacks it.
void set_cpu_capability(CpuCapability capability);
const char* capability_name(CpuCapability capability);
// CHORUS_CPU_CAPABILITY as given ("avx512", "avx2", "default"), or "" when unset; any other value is
// a chorus::Error naming it.
const char* requested_capability();

// Which library takes the float32 products that read A transposed into a row-major C
// (kernels/cpu/gemm.cpp, use_openblas): kAuto sends those of weight-gradient size to OpenBLAS where
// oneDNN runs AVX2 code; kOneDnn keeps oneDNN's own paths (A copied row-major first, or C^T = B^T A)
// on every CPU, so that tests reach them on a machine without AVX-512.
enum class TransposedGemm : int { kAuto = 0, kOneDnn = 1 };
void set_transposed_gemm(TransposedGemm choice);
TransposedGemm transposed_gemm();

namespace detail {
extern std::atomic<int> current_capability;  // -1 until resolved
int resolve_capability();
}  // namespace detail

inline CpuCapability cpu_capability_fast() {
  int c = detail::current_capability.load(std::memory_order_relaxed);
  if (c < 0) c = detail::resolve_capability();
  return static_cast<CpuCapability>(c);
}

}  // namespace chorus::kernels::cpu

// The region whose functions get AVX-512 code ([ISA variants]). prefer-vector-width=512: GCC
// otherwise keeps 256-bit vectors even where AVX-512 is enabled. clang ignores GCC's target pragma
// (the region would silently get no AVX-512 code: isa_guard_test says so); it takes the target
// attribute over a region instead, and uses 512-bit vectors there without being asked.
#if defined(__clang__)
#define CHORUS_AVX512_BEGIN                                                                          \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c\"))), apply_to = function)")
#define CHORUS_AVX512_END _Pragma("clang attribute pop")
#else
#define CHORUS_AVX512_BEGIN                \
  _Pragma("GCC push_options")              \
  _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512\")")
#define CHORUS_AVX512_END _Pragma("GCC pop_options")
#endif
