// Copies across dtypes and strides (the shared Cast functor), fills, ranges and random fills (the
// shared Philox draws of kernels/shared/philox.h).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/cpu/loops.h"
#include "kernels/shared/philox.h"

namespace chorus::kernels::cpu {

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  // Same dtype, both dense in the same layout: one memcpy (parallel for large copies).
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.sizes() == src.sizes()) {
    char* d = static_cast<char*>(dst.raw_data_ptr());
    const char* s = static_cast<const char*>(src.raw_data_ptr());
    const int64_t bytes = static_cast<int64_t>(dst.nbytes());
    parallel_for(0, bytes, kGrainSize * 8, [&](int64_t lo, int64_t hi) {
      std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo));
    });
    return;
  }
  auto it = make_iter<2>(dst.sizes(), {&dst, &src});
  CHORUS_DISPATCH_ALL(dst.dtype(), "copy", [&]<typename D>() {
    CHORUS_DISPATCH_ALL(src.dtype(), "copy", [&]<typename S>() {
      unary_loop<D, S>(it, shared::Cast<D>{});
    });
  });
}

void fill(const Tensor& dst, const Scalar& value) {
  if (dst.numel() == 0) return;
  auto it = make_iter<1>(dst.sizes(), {&dst});
  CHORUS_DISPATCH_ALL(dst.dtype(), "fill_", [&]<typename T>() {
    const T v = value.to<T>();
    bool zero_bits = true;
    for (size_t b = 0; b < sizeof(T); ++b) zero_bits = zero_bits && reinterpret_cast<const unsigned char*>(&v)[b] == 0;
    run_parallel<1>(it, [&](char** p, const int64_t* s, int64_t n) {
      if (s[0] == static_cast<int64_t>(sizeof(T))) {
        // A dense run (zeros() and the like): a vector loop (the strided loop below is scalar),
        // and memset for an all-zero-bits value.
        T* o = reinterpret_cast<T*>(p[0]);
        if (zero_bits) std::memset(static_cast<void*>(o), 0, static_cast<size_t>(n) * sizeof(T));
        else simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { o[i] = v; });
        return;
      }
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

void arange(const Tensor& out, double start, double step) {
  CHORUS_DISPATCH_ALL(out.dtype(), "arange", [&]<typename T>() {
    T* o = out.data_ptr<T>();
    for (int64_t i = 0; i < out.numel(); ++i) {
      o[i] = convert<T>(start + static_cast<double>(i) * step);
    }
  });
}

namespace {

namespace sm = ::chorus::kernels::shared;

// [Philox in AVX2 registers] Eight Philox-4x32-10 blocks per register, lane l holding block
// counter + l, written as uniform float32 draws lo + span * u (the fused multiply-add the compiled
// draw uses) to dst[4 l + j] for word j: the words of philox4x32_10_into, bit for bit. GCC's own
// vectorization of that function widened every lane to 64 bits around each product and kept the
// rand() of a dropout mask at ~2.9 ns a value (1M draws: 2.9 ms, 1 thread, Zen 3); here the 32 x 32
// -> 64 products of the even and the odd lanes are taken separately and their halves blended back
// into place. A round's multiply, shifts, blends and xors depend each on the last, so one group of
// eight blocks leaves the core waiting: Groups independent groups (blocks counter .. counter + 8
// Groups - 1) go through each round together: four, then one at a time for what is left.
// pointwise_bench's rand, 1 thread, Zen 5 with chorus's loops capped at AVX2, ns a value: 1.12 with
// one group; in trial builds two 1.15, three 0.90, four 0.89-0.90; this form 0.94-0.96
// (docs/benchmarks.md, session 51).
template <int Groups>
void philox_uniform_avx2(uint64_t key, uint64_t counter, float lo, float span, float* dst) {
  __m256i c0[Groups], c1[Groups], c2[Groups], c3[Groups];
  for (int g = 0; g < Groups; ++g) {
    alignas(32) uint32_t low[8], high[8];
    for (int l = 0; l < 8; ++l) {
      const uint64_t c = counter + static_cast<uint64_t>(8 * g + l);
      low[l] = static_cast<uint32_t>(c);
      high[l] = static_cast<uint32_t>(c >> 32);
    }
    c0[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(low));
    c1[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(high));
    c2[g] = _mm256_setzero_si256();
    c3[g] = _mm256_setzero_si256();
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0)), key1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int g = 0; g < Groups; ++g) {
      // The 64-bit products of lanes 0, 2, 4, 6 (mul_epu32 reads the low half of each 64-bit pair)
      // and of lanes 1, 3, 5, 7 (shifted down first); high and low words blended back per lane.
      const __m256i even0 = _mm256_mul_epu32(c0[g], m0), odd0 = _mm256_mul_epu32(_mm256_srli_epi64(c0[g], 32), m0);
      const __m256i even1 = _mm256_mul_epu32(c2[g], m1), odd1 = _mm256_mul_epu32(_mm256_srli_epi64(c2[g], 32), m1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(even0, 32), odd0, 0xAA);
      const __m256i lo0 = _mm256_blend_epi32(even0, _mm256_slli_epi64(odd0, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(even1, 32), odd1, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(even1, _mm256_slli_epi64(odd1, 32), 0xAA);
      c0[g] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[g]), key0);
      c1[g] = lo1;
      c2[g] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[g]), key1);
      c3[g] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // uniform_float: the top 24 bits as a float, times 2^-24; then lo + span * u.
  const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f), vlo = _mm256_set1_ps(lo), vspan = _mm256_set1_ps(span);
  auto draw = [&](__m256i w) {
    return _mm256_fmadd_ps(vspan, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w, 8)), unit), vlo);
  };
  for (int g = 0; g < Groups; ++g) {
    const __m256 f0 = draw(c0[g]), f1 = draw(c1[g]), f2 = draw(c2[g]), f3 = draw(c3[g]);
    // Transpose to block order: dst[4 l + j] = f_j[l].
    const __m256 t0 = _mm256_unpacklo_ps(f0, f1), t1 = _mm256_unpackhi_ps(f0, f1);
    const __m256 t2 = _mm256_unpacklo_ps(f2, f3), t3 = _mm256_unpackhi_ps(f2, f3);
    const __m256 b04 = _mm256_shuffle_ps(t0, t2, 0x44), b15 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 b26 = _mm256_shuffle_ps(t1, t3, 0x44), b37 = _mm256_shuffle_ps(t1, t3, 0xEE);
    float* out = dst + 32 * g;
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(b04, b15, 0x20));
    _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(b26, b37, 0x20));
    _mm256_storeu_ps(out + 16, _mm256_permute2f128_ps(b04, b15, 0x31));
    _mm256_storeu_ps(out + 24, _mm256_permute2f128_ps(b26, b37, 0x31));
  }
}

#if CHORUS_AVX512_VARIANT
CHORUS_AVX512_BEGIN
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() (a self-initialized variable), which
// -Wuninitialized reports inside a target("avx512f") region: not a fault of this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
// In isa_avx512, as every function with AVX-512 instructions must be ([ISA variants],
// capability.h; tests/kernels/cpu:isa_guard_test).
namespace isa_avx512 {
// [Philox in AVX-512 registers] As [Philox in AVX2 registers], sixteen blocks in one register (lane
// l: block counter + l), the same words and the same fused draw; the 4 x 16 results go back to block
// order through 128-bit lane shuffles. Before, the AVX-512 capability ran the compiler's
// vectorization of the scalar function: pointwise_bench's rand, 1 thread, Zen 5, 0.77 ns a value
// then, 0.50-0.52 with this (two or three registers at a time, as the AVX2 code does, were slower:
// 0.62-0.66).
void philox_uniform_avx512(uint64_t key, uint64_t counter, float lo, float span, float* dst) {
  alignas(64) uint32_t low[16], high[16];
  for (int l = 0; l < 16; ++l) {
    const uint64_t c = counter + static_cast<uint64_t>(l);
    low[l] = static_cast<uint32_t>(c);
    high[l] = static_cast<uint32_t>(c >> 32);
  }
  __m512i c0 = _mm512_load_si512(low), c1 = _mm512_load_si512(high);
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  constexpr __mmask16 kOdd = 0xAAAA;
  for (int round = 0; round < 10; ++round) {
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0)), key1 = _mm512_set1_epi32(static_cast<int>(k1));
    const __m512i even0 = _mm512_mul_epu32(c0, m0), odd0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
    const __m512i even1 = _mm512_mul_epu32(c2, m1), odd1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
    const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even0, 32), odd0);
    const __m512i lo0 = _mm512_mask_blend_epi32(kOdd, even0, _mm512_slli_epi64(odd0, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even1, 32), odd1);
    const __m512i lo1 = _mm512_mask_blend_epi32(kOdd, even1, _mm512_slli_epi64(odd1, 32));
    c0 = _mm512_ternarylogic_epi32(hi1, c1, key0, 0x96);  // hi1 ^ c1 ^ key0
    c1 = lo1;
    c2 = _mm512_ternarylogic_epi32(hi0, c3, key1, 0x96);
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const __m512 unit = _mm512_set1_ps(1.0f / 16777216.0f), vlo = _mm512_set1_ps(lo), vspan = _mm512_set1_ps(span);
  auto draw = [&](__m512i w) {
    return _mm512_fmadd_ps(vspan, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 8)), unit), vlo);
  };
  const __m512 f0 = draw(c0), f1 = draw(c1), f2 = draw(c2), f3 = draw(c3);
  // Per 128-bit lane k: b04 holds block 4k's four words, b15 block 4k + 1, b26 4k + 2, b37 4k + 3.
  const __m512 t0 = _mm512_unpacklo_ps(f0, f1), t1 = _mm512_unpackhi_ps(f0, f1);
  const __m512 t2 = _mm512_unpacklo_ps(f2, f3), t3 = _mm512_unpackhi_ps(f2, f3);
  const __m512 b04 = _mm512_shuffle_ps(t0, t2, 0x44), b15 = _mm512_shuffle_ps(t0, t2, 0xEE);
  const __m512 b26 = _mm512_shuffle_ps(t1, t3, 0x44), b37 = _mm512_shuffle_ps(t1, t3, 0xEE);
  // Then the 4 x 4 transpose of 128-bit lanes: store q holds blocks 4q .. 4q + 3.
  const __m512 u0 = _mm512_shuffle_f32x4(b04, b15, 0x44), u1 = _mm512_shuffle_f32x4(b26, b37, 0x44);
  const __m512 u2 = _mm512_shuffle_f32x4(b04, b15, 0xEE), u3 = _mm512_shuffle_f32x4(b26, b37, 0xEE);
  _mm512_storeu_ps(dst, _mm512_shuffle_f32x4(u0, u1, 0x88));
  _mm512_storeu_ps(dst + 16, _mm512_shuffle_f32x4(u0, u1, 0xDD));
  _mm512_storeu_ps(dst + 32, _mm512_shuffle_f32x4(u2, u3, 0x88));
  _mm512_storeu_ps(dst + 48, _mm512_shuffle_f32x4(u2, u3, 0xDD));
}
}  // namespace isa_avx512
#pragma GCC diagnostic pop
CHORUS_AVX512_END
#endif

// One whole block of draws, out of line: the loop that calls it stays scalar (see philox_fill).
template <typename T, typename Draw>
[[gnu::noinline]] void philox_block_scalar(const Draw& draw, uint64_t key, uint64_t counter, T* dst) {
  const sm::PhiloxBlock words = sm::philox4x32_10(key, counter);
  for (int j = 0; j < Draw::kPerBlock; ++j) dst[j] = convert<T>(draw(words, j));
}

// Fills out with n draws of `draw` (kernels/shared/philox.h), Draw::kPerBlock per Philox block:
// element i is draw(block first + i / kPerBlock, i % kPerBlock), so the result depends only on
// the generator's state, not on the thread count, and a CUDA kernel reproduces it bit for bit.
template <typename T, typename Draw>
void philox_fill(const Tensor& out, Generator& gen, const Draw& draw) {
  // [Scalar libm in the normal draws] Box-Muller's log, cos and sin stay libm's scalar
  // functions: in a vector loop GCC calls libmvec's variants (vector_math.h declares them), whose
  // AVX-512 log and cos differ from the scalar ones in the last bits (2026-11-29, Zen 5: philox_test's
  // float64 normals), so randn's values would depend on the CPU's vector width and on where each
  // thread's share of the blocks begins. The uniform and integer draws are exact arithmetic.
  constexpr bool kScalarMath = std::is_same_v<Draw, sm::NormalFloatDraw> || std::is_same_v<Draw, sm::NormalDoubleDraw>;
  constexpr int per_block = Draw::kPerBlock;
  Tensor dense = out.is_contiguous() ? out : make_tensor(out.sizes(), out.dtype(), kCPU);
  const int64_t n = dense.numel();
  const uint64_t blocks = static_cast<uint64_t>((n + per_block - 1) / per_block);
  const uint64_t seed = gen.seed();
  const uint64_t first = gen.reserve_blocks(blocks);
  T* o = dense.data_ptr<T>();
  const int64_t full = n / per_block;  // blocks whose every draw lands in `out`
  parallel_for(0, static_cast<int64_t>(blocks), kGrainSize / 4, [&](int64_t lo, int64_t hi) {
    // Whole blocks: a vector loop (several Philox blocks per instruction; the same words).
    // (Locals, not the lambda's captures: the vectorizer must see they cannot alias `out`.)
    const int64_t end = std::min(hi, full);
    int64_t from = lo;
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Draw, sm::UniformFloatDraw>) {
      // [Philox in AVX2 registers], [Philox in AVX-512 registers]; what is left, the loop below.
      if (cpu_capability_fast() == CpuCapability::kAvx2) {
        for (; from + 32 <= end; from += 32) {
          philox_uniform_avx2<4>(seed, first + static_cast<uint64_t>(from), draw.lo, draw.span, o + from * per_block);
        }
        for (; from + 8 <= end; from += 8) {
          philox_uniform_avx2<1>(seed, first + static_cast<uint64_t>(from), draw.lo, draw.span, o + from * per_block);
        }
      }
#if CHORUS_AVX512_VARIANT
      else if (cpu_capability_fast() == CpuCapability::kAvx512) {
        for (; from + 16 <= end; from += 16) {
          isa_avx512::philox_uniform_avx512(seed, first + static_cast<uint64_t>(from), draw.lo, draw.span, o + from * per_block);
        }
      }
#endif
    }
    if constexpr (kScalarMath) {
      for (; from < end; ++from) {
        philox_block_scalar<T>(draw, seed, first + static_cast<uint64_t>(from), o + from * per_block);
      }
    } else {
      const uint64_t key = seed, base = first;
      const Draw d = draw;
      T* __restrict dst = o;
      simd_for(from, end, [&](int64_t b) CHORUS_ELEMENT {
        sm::PhiloxBlock words;
        sm::philox4x32_10_into(key, base + static_cast<uint64_t>(b), words.w[0], words.w[1], words.w[2], words.w[3]);
#pragma GCC unroll 4
        for (int j = 0; j < per_block; ++j) dst[b * per_block + j] = convert<T>(d(words, j));
      });
    }
    for (int64_t b = std::max(lo, full); b < hi; ++b) {  // the last, partial block
      const sm::PhiloxBlock words = sm::philox4x32_10(seed, first + static_cast<uint64_t>(b));
      for (int j = 0; j < per_block; ++j) {
        const int64_t i = b * per_block + j;
        if (i < n) o[i] = convert<T>(draw(words, j));
      }
    }
  });
  if (!out.is_same(dense)) copy(out, dense);
}

}  // namespace

void uniform(const Tensor& out, double low, double high, Generator& gen) {
  CHORUS_DISPATCH_ALL(out.dtype(), "rand", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      philox_fill<T>(out, gen, sm::UniformDoubleDraw{low, high});
    } else if constexpr (std::is_same_v<T, float> || is_reduced_float_v<T>) {
      philox_fill<T>(out, gen, sm::UniformFloatDraw{static_cast<float>(low), static_cast<float>(high - low)});
    } else {
      fail("rand: expected a floating-point dtype, got {}", dtype_name(out.dtype()));
    }
  });
}

void normal(const Tensor& out, double mean, double std, Generator& gen) {
  // Box-Muller on pairs of uniforms (see NormalFloatDraw / NormalDoubleDraw).
  CHORUS_DISPATCH_ALL(out.dtype(), "randn", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      philox_fill<T>(out, gen, sm::NormalDoubleDraw{mean, std});
    } else if constexpr (std::is_same_v<T, float> || is_reduced_float_v<T>) {
      philox_fill<T>(out, gen, sm::NormalFloatDraw{static_cast<float>(mean), static_cast<float>(std)});
    } else {
      fail("randn: expected a floating-point dtype, got {}", dtype_name(out.dtype()));
    }
  });
}

void random_int(const Tensor& out, int64_t low, int64_t high, Generator& gen) {
  const sm::RandintDraw draw{low, static_cast<uint64_t>(high - low)};
  CHORUS_DISPATCH_ALL(out.dtype(), "randint", [&]<typename T>() { philox_fill<T>(out, gen, draw); });
}

}  // namespace chorus::kernels::cpu
