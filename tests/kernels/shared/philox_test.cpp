// kernels/shared/philox.h: Philox-4x32-10 equals Generator::philox (and Random123's known answer),
// the uniform mappings equal Generator's, and chorus's CPU rand/randn/randint fills are exactly
// element i = draw(philox(seed, first_block + i / per_block), i % per_block) for every dtype, so
// a CUDA kernel that evaluates the same draws reproduces them bit for bit.
// Compiled with kernels/cpu's flags (BUILD), so the draws round here as inside the CPU kernels.
#include "kernels/shared/philox.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "kernels/cpu/kernels.h"
#include "kernels/shared/pointwise_math.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace {

using namespace chorus;
namespace sm = chorus::kernels::shared;

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

TEST_CASE("philox4x32_10 gives Generator::philox's words", "[shared][philox]") {
  std::mt19937_64 rng(99);
  std::vector<std::pair<uint64_t, uint64_t>> cases = {
      {0, 0}, {~0ull, ~0ull}, {1, 0xffffffffull}, {1, 0x100000000ull}, {67280421310721ull, 12345}};
  for (int i = 0; i < 20000; ++i) cases.emplace_back(rng(), i % 3 == 0 ? rng() : rng() % 100000);
  for (const auto& [key, counter] : cases) {
    const sm::PhiloxBlock got = sm::philox4x32_10(key, counter);
    const std::array<uint32_t, 4> expected = Generator::philox(key, counter);
    for (int j = 0; j < 4; ++j) {
      if (got.w[j] != expected[j]) FAIL("key " << key << " counter " << counter << " word " << j);
    }
  }
}

TEST_CASE("philox4x32_10 is Random123's Philox-4x32-10 (known-answer vector)", "[shared][philox]") {
  // Random123 kat_vectors: counter {0, 0, 0, 0}, key {0, 0}.
  const sm::PhiloxBlock b = sm::philox4x32_10(0, 0);
  CHECK(b.w[0] == 0x6627e8d5u);
  CHECK(b.w[1] == 0xe169c58du);
  CHECK(b.w[2] == 0xbc57ac4cu);
  CHECK(b.w[3] == 0x9b00dbd8u);
}

TEST_CASE("uniform mappings equal Generator's and stay in [0, 1)", "[shared][philox]") {
  std::mt19937 rng(4);
  std::vector<uint32_t> words = {0u, 1u, 0xffu, 0x100u, 0xffffffffu, 0xfffffeffu, 0x80000000u};
  for (int i = 0; i < 20000; ++i) words.push_back(rng());
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    const uint32_t hi = words[i], lo = words[i + 1];
    const float f = sm::uniform_float(hi);
    const double d = sm::uniform_double(hi, lo);
    REQUIRE(same_bits(f, Generator::uniform_float(hi)));
    REQUIRE(same_bits(d, Generator::uniform_double(hi, lo)));
    REQUIRE((f >= 0.0f && f < 1.0f));
    REQUIRE((d >= 0.0 && d < 1.0));
  }
  CHECK(sm::uniform_float(0xffffffffu) == 1.0f - 1.0f / 16777216.0f);  // the top 24 bits, exactly
}

// The fill the CPU kernel must have produced: element i from block first + i / per_block.
template <typename T, typename Draw>
void check_fill(const Tensor& got, const Draw& draw, uint64_t seed, uint64_t first_block) {
  const Tensor dense = got.contiguous();
  const T* p = dense.data_ptr<T>();
  for (int64_t i = 0; i < dense.numel(); ++i) {
    const T expected = sm::Cast<T>{}(sm::philox_element(draw, seed, first_block, static_cast<uint64_t>(i)));
    if (!same_bits(p[i], expected)) FAIL(dtype_name(got.dtype()) << " element " << i << " differs");
  }
}

TEMPLATE_TEST_CASE("CPU rand and randn are the shared draws, block accounting included", "[shared][philox]", float,
                   double, Half, BFloat16) {
  using T = TestType;
  const DType dt = dtype_of<T>::value;
  const uint64_t seed = 0x5eed1234abcdull;
  Generator gen(seed);
  const TensorOptions opts{.dtype = dt};
  // Sizes not divisible by the draws per block: the partial last block is still consumed whole.
  // Large enough for the CPU kernel to split the blocks across threads.
  const int64_t n1 = 100003, n2 = 7, n3 = 65539;
  const Tensor u = rand({n1}, opts, &gen);
  const Tensor z = randn({n2}, opts, &gen);
  const Tensor big = empty({n3 / 13 + 1, 13}, opts);
  const Tensor zt = randn_like(big.t(), &gen);  // a non-contiguous shape: filled densely, then copied
  constexpr bool kDouble = std::is_same_v<T, double>;
  using Uniform = std::conditional_t<kDouble, sm::UniformDoubleDraw, sm::UniformFloatDraw>;
  using Normal = std::conditional_t<kDouble, sm::NormalDoubleDraw, sm::NormalFloatDraw>;
  const Uniform uniform = kDouble ? Uniform{0.0, 1.0} : Uniform{0.0f, 1.0f};
  const Normal normal = kDouble ? Normal{0.0, 1.0} : Normal{0.0f, 1.0f};
  uint64_t block = 0;
  check_fill<T>(u, uniform, seed, block);
  block += (n1 + Uniform::kPerBlock - 1) / Uniform::kPerBlock;
  check_fill<T>(z, normal, seed, block);
  block += (n2 + Normal::kPerBlock - 1) / Normal::kPerBlock;
  check_fill<T>(zt, normal, seed, block);
  block += (zt.numel() + Normal::kPerBlock - 1) / Normal::kPerBlock;
  CHECK(gen.offset() == block);
  // Not a constant fill: the values spread over the range.
  const Tensor uf = u.to(kFloat64);
  CHECK(min(uf).item<double>() < 0.01);
  CHECK(max(uf).item<double>() > 0.99);
}

TEST_CASE("CPU uniform with bounds, normal with mean and std, and randint are the shared draws",
          "[shared][philox]") {
  const uint64_t seed = 77;
  {
    Generator gen(seed);
    Tensor t = empty({5001}, TensorOptions{.dtype = kFloat32});
    kernels::cpu::uniform(t, -3.0, 5.0, gen);
    check_fill<float>(t, sm::UniformFloatDraw{-3.0f, 8.0f}, seed, 0);
    // Counters that cross 2^32 inside a register's blocks ([Philox in AVX2 registers], eight
    // blocks, four registers at a time; [Philox in AVX-512 registers], sixteen: the high word of
    // lane l is that of its own counter), and the dropout mask's draws: lo = -q, span 1. The 203
    // draws are 50 whole blocks and 3 draws of a 51st: AVX2 takes blocks 0-31 in one call of four
    // registers and 32-47 in two calls of one, AVX-512 0-47 in three calls; then blocks 48-49 by the
    // loop and the partial block. The crossing (block 3) is inside the first call either way.
    Generator late(seed);
    late.set_state(seed, 0xFFFFFFFDull);
    Tensor c = empty({203}, TensorOptions{.dtype = kFloat32});
    kernels::cpu::uniform(c, -0.1, 0.9, late);
    check_fill<float>(c, sm::UniformFloatDraw{-0.1f, static_cast<float>(0.9 - -0.1)}, seed, 0xFFFFFFFDull);
    Tensor d = empty({5001}, TensorOptions{.dtype = kFloat64});
    kernels::cpu::normal(d, 2.0, 0.5, gen);
    check_fill<double>(d, sm::NormalDoubleDraw{2.0, 0.5}, seed, (5001 + 3) / 4);
  }
  for (DType dt : {kInt64, kInt32, kUInt8, kFloat32}) {
    Generator gen(seed);
    const Tensor r = randint(3, 250, {4099}, TensorOptions{.dtype = dt}, &gen);
    const sm::RandintDraw draw{3, 247};
    switch (dt) {
      case kInt64: check_fill<int64_t>(r, draw, seed, 0); break;
      case kInt32: check_fill<int32_t>(r, draw, seed, 0); break;
      case kUInt8: check_fill<uint8_t>(r, draw, seed, 0); break;
      default: check_fill<float>(r, draw, seed, 0); break;
    }
    const Tensor r64 = r.to(kInt64);
    CHECK(min(r64).item<int64_t>() == 3);
    CHECK(max(r64).item<int64_t>() == 249);
  }
}

}  // namespace
