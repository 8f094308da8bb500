// Philox-4x32-10 and the mappings from its words to uniform, normal and integer values, shared by
// the CPU random kernels (kernels/cpu/copy.cpp) and CUDA kernels, so both sides draw the same bits:
// element i of a fill of n values uses block first_block + i / per_block, word slot i % per_block.
// The generator is the one of tensor/generator.cpp (Generator::philox), restated for device code.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/shared/hd.h"

namespace chorus::kernels::shared {

// Four 32-bit random words: one Philox block.
struct PhiloxBlock {
  uint32_t w[4];
};

// Philox-4x32 with 10 rounds (Salmon et al., SC'11) keyed by the 64-bit seed, counter = block
// number, into four words passed by reference (a form the CPU's vectorizer turns into a loop over
// several blocks at once: kernels/cpu/copy.cpp); the same words as Generator::philox(key, counter).
CHORUS_HD CHORUS_INLINE void philox4x32_10_into(uint64_t key, uint64_t counter, uint32_t& c0, uint32_t& c1,
                                                uint32_t& c2, uint32_t& c3) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  c0 = static_cast<uint32_t>(counter);
  c1 = static_cast<uint32_t>(counter >> 32);
  c2 = 0;
  c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#elif !defined(__CUDACC__)
#pragma GCC unroll 10
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

CHORUS_HD CHORUS_INLINE PhiloxBlock philox4x32_10(uint64_t key, uint64_t counter) {
  PhiloxBlock b;
  philox4x32_10_into(key, counter, b.w[0], b.w[1], b.w[2], b.w[3]);
  return b;
}

// A float in [0, 1) from the top 24 bits of a word (Generator::uniform_float).
CHORUS_HD CHORUS_INLINE float uniform_float(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}
// A double in [0, 1) from 53 bits of two words (Generator::uniform_double).
CHORUS_HD CHORUS_INLINE double uniform_double(uint32_t hi, uint32_t lo) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

inline constexpr double kPi = 3.14159265358979323846;

// Draws: value number `j` (0 <= j < kPerBlock) of one Philox block. A fill of n elements reserves
// ceil(n / kPerBlock) blocks of the generator and gives element i draw(block(i / kPerBlock), i % kPerBlock).

// Uniform float32 in [lo, lo + span): four per block, one word each.
struct UniformFloatDraw {
  static constexpr int kPerBlock = 4;
  float lo, span;
  CHORUS_HD CHORUS_INLINE float operator()(const PhiloxBlock& b, int j) const {
    return lo + span * uniform_float(b.w[j]);
  }
};

// Uniform float64 in [low, high): two per block, two words each.
struct UniformDoubleDraw {
  static constexpr int kPerBlock = 2;
  double low, high;
  CHORUS_HD CHORUS_INLINE double operator()(const PhiloxBlock& b, int j) const {
    return low + (high - low) * uniform_double(b.w[2 * j], b.w[2 * j + 1]);
  }
};

// Normal float32 by Box-Muller: four per block; j = 0, 1 are the cosine and sine of the pair of
// words (w0, w1), j = 2, 3 those of (w2, w3). 1 - u keeps the log's argument in (0, 1].
struct NormalFloatDraw {
  static constexpr int kPerBlock = 4;
  float mean, std;
  CHORUS_HD CHORUS_INLINE float operator()(const PhiloxBlock& b, int j) const {
    const int pair = j / 2;
    const float u1 = 1.0f - uniform_float(b.w[2 * pair]);
    const float u2 = uniform_float(b.w[2 * pair + 1]);
    const float r = ::sqrtf(-2.0f * ::logf(u1));
    const float theta = 2.0f * static_cast<float>(kPi) * u2;
    const float z = (j % 2 == 0) ? r * ::cosf(theta) : r * ::sinf(theta);
    return mean + std * z;
  }
};

// Normal float64 by Box-Muller: one per block (the cosine of two 53-bit uniforms).
struct NormalDoubleDraw {
  static constexpr int kPerBlock = 1;
  double mean, std;
  CHORUS_HD CHORUS_INLINE double operator()(const PhiloxBlock& b, int /*j*/) const {
    const double u1 = 1.0 - uniform_double(b.w[0], b.w[1]);
    const double u2 = uniform_double(b.w[2], b.w[3]);
    return mean + std * ::sqrt(-2.0 * ::log(u1)) * ::cos(2.0 * kPi * u2);
  }
};

// Integers in [low, low + range): two per block, 64 bits each, reduced modulo the range (the bias
// is below 2^-40 for ranges < 2^24). range must be > 0.
struct RandintDraw {
  static constexpr int kPerBlock = 2;
  int64_t low;
  uint64_t range;
  CHORUS_HD CHORUS_INLINE int64_t operator()(const PhiloxBlock& b, int j) const {
    const uint64_t bits = (static_cast<uint64_t>(b.w[2 * j]) << 32) | b.w[2 * j + 1];
    return low + static_cast<int64_t>(bits % range);
  }
};

// Element i of a fill that starts at block `first_block` of the stream keyed by `seed`. A kernel
// that handles a whole block per thread calls philox4x32_10 once and `draw` kPerBlock times instead.
template <typename Draw>
CHORUS_HD CHORUS_INLINE auto philox_element(const Draw& draw, uint64_t seed, uint64_t first_block, uint64_t i) {
  const PhiloxBlock b = philox4x32_10(seed, first_block + i / Draw::kPerBlock);
  return draw(b, static_cast<int>(i % Draw::kPerBlock));
}

}  // namespace chorus::kernels::shared
