// Copies across dtypes and strides (the shared Cast functor), fills, ranges and random fills (the
// shared Philox draws of kernels/shared/philox.h).
#include <cstring>

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

// Fills out with n draws of `draw` (kernels/shared/philox.h), Draw::kPerBlock per Philox block:
// element i is draw(block first + i / kPerBlock, i % kPerBlock), so the result depends only on
// the generator's state, not on the thread count, and a CUDA kernel reproduces it bit for bit.
template <typename T, typename Draw>
void philox_fill(const Tensor& out, Generator& gen, const Draw& draw) {
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
    const uint64_t key = seed, base = first;
    const Draw d = draw;
    T* __restrict dst = o;
    simd_for(lo, end, [&](int64_t b) CHORUS_ELEMENT {
      sm::PhiloxBlock words;
      sm::philox4x32_10_into(key, base + static_cast<uint64_t>(b), words.w[0], words.w[1], words.w[2], words.w[3]);
#pragma GCC unroll 4
      for (int j = 0; j < per_block; ++j) dst[b * per_block + j] = convert<T>(d(words, j));
    });
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
