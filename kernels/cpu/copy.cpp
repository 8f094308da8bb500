// Copies across dtypes and strides, fills, ranges and random fills.
#include <cmath>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"

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
      unary_loop<D, S>(it, [](S v) { return convert<D>(v); });
    });
  });
}

void fill(const Tensor& dst, const Scalar& value) {
  if (dst.numel() == 0) return;
  auto it = make_iter<1>(dst.sizes(), {&dst});
  CHORUS_DISPATCH_ALL(dst.dtype(), "fill_", [&]<typename T>() {
    const T v = value.to<T>();
    run_parallel<1>(it, [&](char** p, const int64_t* s, int64_t n) {
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

// Fills a contiguous buffer of n values of T, 4 per Philox block (2 for 64-bit draws), so the result
// depends only on the generator's state and not on the thread count.
template <typename T, typename Draw>
void philox_fill(const Tensor& out, Generator& gen, int per_block, const Draw& draw) {
  Tensor dense = out.is_contiguous() ? out : make_tensor(out.sizes(), out.dtype(), kCPU);
  const int64_t n = dense.numel();
  const uint64_t blocks = static_cast<uint64_t>((n + per_block - 1) / per_block);
  const uint64_t seed = gen.seed();
  const uint64_t first = gen.reserve_blocks(blocks);
  T* o = dense.data_ptr<T>();
  parallel_for(0, static_cast<int64_t>(blocks), kGrainSize / 4, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      auto words = Generator::philox(seed, first + static_cast<uint64_t>(b));
      for (int j = 0; j < per_block; ++j) {
        int64_t i = b * per_block + j;
        if (i < n) o[i] = draw(words, j);
      }
    }
  });
  if (!out.is_same(dense)) copy(out, dense);
}

}  // namespace

void uniform(const Tensor& out, double low, double high, Generator& gen) {
  CHORUS_DISPATCH_ALL(out.dtype(), "rand", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      philox_fill<T>(out, gen, 2, [&](const std::array<uint32_t, 4>& w, int j) {
        return low + (high - low) * Generator::uniform_double(w[2 * j], w[2 * j + 1]);
      });
    } else if constexpr (std::is_same_v<T, float> || is_reduced_float_v<T>) {
      const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
      philox_fill<T>(out, gen, 4, [&](const std::array<uint32_t, 4>& w, int j) {
        return convert<T>(lo + span * Generator::uniform_float(w[j]));
      });
    } else {
      fail("rand: expected a floating-point dtype, got {}", dtype_name(out.dtype()));
    }
  });
}

void normal(const Tensor& out, double mean, double std, Generator& gen) {
  // Box-Muller on pairs of uniforms; (0, 1] for the log argument so it is never log(0).
  CHORUS_DISPATCH_ALL(out.dtype(), "randn", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      philox_fill<T>(out, gen, 1, [&](const std::array<uint32_t, 4>& w, int) {
        double u1 = 1.0 - Generator::uniform_double(w[0], w[1]);
        double u2 = Generator::uniform_double(w[2], w[3]);
        return mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      });
    } else if constexpr (std::is_same_v<T, float> || is_reduced_float_v<T>) {
      philox_fill<T>(out, gen, 4, [&](const std::array<uint32_t, 4>& w, int j) {
        // Two normals per pair of words: j = 0,1 use (w0, w1), j = 2,3 use (w2, w3).
        int pair = j / 2;
        float u1 = 1.0f - Generator::uniform_float(w[2 * pair]);
        float u2 = Generator::uniform_float(w[2 * pair + 1]);
        float r = std::sqrt(-2.0f * std::log(u1));
        float theta = 2.0f * static_cast<float>(M_PI) * u2;
        float z = (j % 2 == 0) ? r * std::cos(theta) : r * std::sin(theta);
        return convert<T>(static_cast<float>(mean) + static_cast<float>(std) * z);
      });
    } else {
      fail("randn: expected a floating-point dtype, got {}", dtype_name(out.dtype()));
    }
  });
}

void random_int(const Tensor& out, int64_t low, int64_t high, Generator& gen) {
  const uint64_t range = static_cast<uint64_t>(high - low);
  CHORUS_DISPATCH_ALL(out.dtype(), "randint", [&]<typename T>() {
    philox_fill<T>(out, gen, 2, [&](const std::array<uint32_t, 4>& w, int j) {
      uint64_t bits = (static_cast<uint64_t>(w[2 * j]) << 32) | w[2 * j + 1];
      // 64 random bits modulo a range far below 2^64: the bias is below 2^-40 for ranges < 2^24.
      return convert<T>(low + static_cast<int64_t>(bits % range));
    });
  });
}

}  // namespace chorus::kernels::cpu
