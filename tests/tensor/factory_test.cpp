// Factories: empty/zeros/ones/full (and the _like forms) in every dtype, arange and linspace
// (integer and float steps), eye, the random factories (reproducible for a seed, from the default
// generator or a Generator, with the right distribution moments), tensor() from host values, and
// from_blob over memory chorus does not own (no copy, deleter runs when the last view is gone).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <vector>

#include "tests/tensor/tensor_testing.h"

namespace chorus {
namespace {

using testing::count_of;
using testing::matches;
using testing::matches_exactly;
using testing::read;
using testing::values;

const std::vector<DType> kEveryDType = {kFloat32, kFloat64, kInt64, kInt32, kUInt8, kBool, kFloat16, kBFloat16};

std::vector<double> repeat(double v, int64_t n) { return std::vector<double>(static_cast<size_t>(n), v); }

}  // namespace

TEST_CASE("zeros, ones and full fill every element in every dtype, with contiguous strides", "[tensor][factory]") {
  for (DType dt : kEveryDType) {
    INFO(dtype_name(dt));
    const Shape shape{2, 3, 4};
    Tensor z = zeros(shape, {.dtype = dt});
    Tensor o = ones(shape, {.dtype = dt});
    Tensor f = full(shape, 7, {.dtype = dt});
    for (const Tensor& t : {z, o, f}) {
      CHECK(t.dtype() == dt);
      CHECK(t.strides() == Strides{12, 4, 1});
      CHECK(t.is_contiguous());
      CHECK(t.nbytes() == 24 * element_size(dt));
    }
    CHECK(matches_exactly(z, shape, repeat(0, 24)));
    CHECK(matches_exactly(o, shape, repeat(1, 24)));
    CHECK(matches_exactly(f, shape, repeat(dt == kBool ? 1 : 7, 24)));
  }
  CHECK(matches_exactly(full({3}, -2.5, {.dtype = kFloat64}), {3}, repeat(-2.5, 3)));
  CHECK(matches_exactly(full({2}, -2.5, {.dtype = kInt32}), {2}, repeat(-2, 2)));  // truncated toward 0
  // A 0-d full is one element with no dims.
  Tensor s = scalar_tensor(3.25, {.dtype = kFloat64});
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item<double>() == 3.25);
}

TEST_CASE("empty allocates the shape and dtype asked for, including zero-size dims", "[tensor][factory]") {
  Tensor e = empty({4, 5}, {.dtype = kFloat64});
  CHECK(e.sizes() == Shape{4, 5});
  CHECK(e.nbytes() == 160);
  CHECK(e.storage()->nbytes() >= 160);
  Tensor z = empty({2, 0, 3});
  CHECK(z.numel() == 0);
  CHECK(z.dim() == 3);
  CHECK(z.is_contiguous());
  Tensor scalar = empty({}, {.dtype = kInt32});
  CHECK(scalar.dim() == 0);
  CHECK(scalar.numel() == 1);
}

TEST_CASE("a shape whose element count overflows int64 is an error, not a wrapped count", "[tensor][factory]") {
  // Found by the fuzzer through the idx reader (tests/fuzz/corpus/idx/finding-dims-product-overflow):
  // dims [2^32-1, 2^32-1, 0] hold no elements, but the running product overflowed first (UBSan).
  CHECK(chorus::numel_of({4294967295, 4294967295, 0}) == 0);
  CHECK(chorus::empty({4294967295, 4294967295, 0}).numel() == 0);
  CHECK_THROWS_WITH(chorus::numel_of({int64_t{1} << 40, int64_t{1} << 30}),
                    Catch::Contains("shape [1099511627776, 1073741824] has more elements than an int64 can count"));
  CHECK_THROWS_WITH(chorus::empty({int64_t{1} << 40, int64_t{1} << 30}), Catch::Contains("more elements than an int64"));
}

TEST_CASE("the _like factories keep shape and dtype", "[tensor][factory]") {
  Generator gen(11);
  Tensor src = randn({3, 2}, {.dtype = kFloat64}, &gen).t();  // non-contiguous source
  for (const Tensor& t : {zeros_like(src), ones_like(src), full_like(src, 1.5), empty_like(src), rand_like(src, &gen),
                          randn_like(src, &gen)}) {
    CHECK(t.sizes() == Shape{2, 3});
    CHECK(t.dtype() == kFloat64);
    CHECK(t.is_contiguous());
  }
  CHECK(matches_exactly(zeros_like(src), {2, 3}, repeat(0, 6)));
  CHECK(matches_exactly(ones_like(src), {2, 3}, repeat(1, 6)));
  CHECK(matches_exactly(full_like(src, 1.5), {2, 3}, repeat(1.5, 6)));
  Tensor ints = tensor<int32_t>({1, 2, 3});
  CHECK(full_like(ints, 9).dtype() == kInt32);
  CHECK(matches_exactly(full_like(ints, 9), {3}, {9, 9, 9}));
}

TEST_CASE("arange: integer bounds give int64, any float bound gives float32, and float steps count right",
          "[tensor][factory]") {
  Tensor a = arange(5);
  CHECK(a.dtype() == kInt64);
  CHECK(matches_exactly(a, {5}, {0, 1, 2, 3, 4}));
  CHECK(matches_exactly(arange(2, 11, 3), {3}, {2, 5, 8}));
  CHECK(matches_exactly(arange(5, -4, -3), {3}, {5, 2, -1}));
  CHECK(arange(4.0).dtype() == kFloat32);

  // 0.1 steps: ceil((1 - 0) / 0.1) = 10 elements, the last 0.9 (not 1.0).
  Tensor tenth = arange(0.0, 1.0, 0.1);
  CHECK(tenth.dtype() == kFloat32);
  std::vector<double> expected;
  for (int i = 0; i < 10; ++i) expected.push_back(i * 0.1);
  CHECK(matches(tenth, {10}, expected, 1e-6, 1e-7));
  CHECK(matches(arange(0.0, 1.0, 0.3), {4}, {0.0, 0.3, 0.6, 0.9}, 1e-6, 1e-7));
  CHECK(matches(arange(1.0, -1.0, -0.5), {4}, {1.0, 0.5, 0.0, -0.5}));
  // An explicit dtype wins over the inferred one.
  Tensor d = arange(0, 3, 1, TensorOptions{.dtype = kFloat64});
  CHECK(d.dtype() == kFloat64);
  CHECK(matches_exactly(d, {3}, {0, 1, 2}));
  CHECK(arange(3, 3).numel() == 0);
}

TEST_CASE("linspace spaces steps evenly and ends exactly at end", "[tensor][factory]") {
  Tensor l = linspace(-1.0, 2.0, 7);
  CHECK(l.dtype() == kFloat32);
  CHECK(matches(l, {7}, {-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0}, 0, 1e-7));
  Tensor l64 = linspace(0.0, 1.0, 11, {.dtype = kFloat64});
  std::vector<double> expected;
  for (int i = 0; i <= 10; ++i) expected.push_back(i / 10.0);
  CHECK(matches(l64, {11}, expected, 1e-15, 1e-15));
  CHECK(read(l64, {10}) == 1.0);  // exactly `end`, no accumulated rounding
  CHECK(matches_exactly(linspace(3.0, 9.0, 1), {1}, {3.0}));
  CHECK(linspace(0.0, 1.0, 0).numel() == 0);
}

TEST_CASE("eye is the identity, square or rectangular, in any dtype", "[tensor][factory]") {
  CHECK(matches_exactly(eye(3), {3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1}));
  CHECK(matches_exactly(eye(2, 4), {2, 4}, {1, 0, 0, 0, 0, 1, 0, 0}));
  Tensor tall = eye(4, 2, {.dtype = kInt64});
  CHECK(tall.dtype() == kInt64);
  CHECK(matches_exactly(tall, {4, 2}, {1, 0, 0, 1, 0, 0, 0, 0}));
  CHECK(eye(0).numel() == 0);
}

TEST_CASE("random factories are reproducible for a seed and differ across seeds", "[tensor][factory][random]") {
  manual_seed(1234);
  Tensor a = rand({64});
  Tensor an = randn({3, 5}, {.dtype = kFloat64});
  Tensor ai = randint(0, 100, {32});
  manual_seed(1234);
  Tensor b = rand({64});
  Tensor bn = randn({3, 5}, {.dtype = kFloat64});
  Tensor bi = randint(0, 100, {32});
  CHECK(values(a) == values(b));
  CHECK(values(an) == values(bn));
  CHECK(values(ai) == values(bi));
  // The stream moves on: a second draw differs from the first.
  CHECK(values(rand({64})) != values(a));
  manual_seed(4321);
  CHECK(values(rand({64})) != values(a));

  // A Generator is its own stream: the same seed repeats it, and using it leaves the default alone.
  manual_seed(5);
  Tensor from_default = randn({16});
  manual_seed(5);
  Generator g1(99), g2(99);
  Tensor x1 = randn({16}, {}, &g1);
  Tensor x2 = randn({16}, {}, &g2);
  CHECK(values(x1) == values(x2));
  CHECK(g1.offset() > 0);
  CHECK(g1.offset() == g2.offset());
  CHECK(values(randn({16})) == values(from_default));
  // Restoring (seed, offset) replays the stream exactly.
  const uint64_t offset = g1.offset();
  Tensor next = rand({7}, {.dtype = kFloat64}, &g1);
  g1.set_state(99, offset);
  CHECK(values(rand({7}, {.dtype = kFloat64}, &g1)) == values(next));
}

TEST_CASE("rand is uniform on [0, 1) and randn standard normal: moments of 20000 draws",
          "[tensor][factory][random]") {
  Generator gen(2024);
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    const std::vector<double> u = values(rand({20000}, {.dtype = dt}, &gen));
    double sum = 0, sq = 0, lo = 1, hi = 0;
    int below_quarter = 0;
    for (double v : u) {
      sum += v;
      sq += v * v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      below_quarter += v < 0.25;
    }
    const double mean = sum / 20000, var = sq / 20000 - mean * mean;
    CHECK(lo >= 0.0);
    CHECK(hi < 1.0);
    CHECK(mean == Approx(0.5).margin(0.01));
    CHECK(var == Approx(1.0 / 12).margin(0.004));
    CHECK(below_quarter / 20000.0 == Approx(0.25).margin(0.015));

    const std::vector<double> n = values(randn({20000}, {.dtype = dt}, &gen));
    double nsum = 0, nsq = 0, n4 = 0;
    int within_one = 0;
    for (double v : n) {
      nsum += v;
      nsq += v * v;
      n4 += v * v * v * v;
      within_one += std::abs(v) < 1.0;
    }
    const double nmean = nsum / 20000, nvar = nsq / 20000 - nmean * nmean;
    CHECK(nmean == Approx(0.0).margin(0.03));
    CHECK(nvar == Approx(1.0).margin(0.04));
    CHECK(n4 / 20000 == Approx(3.0).margin(0.25));  // kurtosis of a normal
    CHECK(within_one / 20000.0 == Approx(0.6827).margin(0.015));
  }
  // Reduced-precision floats draw the same way and stay in range.
  Tensor h = rand({1000}, {.dtype = kFloat16}, &gen);
  CHECK(h.dtype() == kFloat16);
  for (double v : values(h)) REQUIRE((v >= 0.0 && v <= 1.0));
}

TEST_CASE("randint draws every integer of [low, high) about equally often", "[tensor][factory][random]") {
  Generator gen(7);
  Tensor r = randint(-3, 4, {7000}, {.dtype = kInt64}, &gen);
  CHECK(r.dtype() == kInt64);
  std::map<int64_t, int> counts;
  for (double v : values(r)) {
    REQUIRE((v >= -3 && v < 4));
    counts[static_cast<int64_t>(v)]++;
  }
  CHECK(counts.size() == 7);
  for (const auto& [value, count] : counts) {
    INFO("value " << value);
    CHECK(count == Approx(1000).margin(150));
  }
  Tensor small = randint(0, 10, {2, 3}, {.dtype = kInt32}, &gen);
  CHECK(small.dtype() == kInt32);
  CHECK(small.sizes() == Shape{2, 3});
  Tensor as_float = randint(5, 6, {4}, {.dtype = kFloat32}, &gen);
  CHECK(matches_exactly(as_float, {4}, {5, 5, 5, 5}));
}

TEST_CASE("tensor() copies host values into the requested dtype and shape", "[tensor][factory]") {
  std::vector<double> host = {1.5, -2.25, 3.0, 4.75, -5.5, 6.0};
  Tensor t = tensor(host, Shape{2, 3});
  CHECK(t.dtype() == kFloat64);
  CHECK(matches_exactly(t, {2, 3}, host));
  host[0] = 100.0;  // a copy: later changes to the vector are not seen
  CHECK(read(t, {0, 0}) == 1.5);

  Tensor as_int = tensor(std::vector<double>{1.9, -1.9, 2.5}, std::nullopt, {.dtype = kInt32});
  CHECK(as_int.dtype() == kInt32);
  CHECK(matches_exactly(as_int, {3}, {1, -1, 2}));
  CHECK(matches_exactly(tensor<int64_t>({7, -8, 9}), {3}, {7, -8, 9}));
  CHECK(tensor<int64_t>({7, -8, 9}).dtype() == kInt64);
  Tensor bools = tensor<bool>({true, false, true, true}, Shape{2, 2});
  CHECK(bools.dtype() == kBool);
  CHECK(matches_exactly(bools, {2, 2}, {1, 0, 1, 1}));
  Tensor u8 = tensor<uint8_t>({0, 255, 128});
  CHECK(matches_exactly(u8, {3}, {0, 255, 128}));
  Tensor f = tensor<float>({0.1f, 0.2f});
  CHECK(f.dtype() == kFloat32);
  CHECK(read(f, {0}) == static_cast<double>(0.1f));
}

TEST_CASE("from_blob wraps memory without copying and runs the deleter when the last view is gone",
          "[tensor][factory]") {
  float buffer[6] = {0, 1, 2, 3, 4, 5};
  int deleted = 0;
  void* deleted_ptr = nullptr;
  Tensor t = from_blob(buffer, {2, 3}, {}, [&](void* p) {
    ++deleted;
    deleted_ptr = p;
  });
  CHECK(t.raw_data_ptr() == buffer);
  buffer[4] = 40.0f;  // memory written behind chorus's back is seen
  CHECK(read(t, {1, 1}) == 40.0);
  Tensor row = t.select(0, 0);
  row.fill_(-1.0);  // and chorus writes land in the caller's buffer
  CHECK(buffer[0] == -1.0f);
  CHECK(buffer[2] == -1.0f);
  CHECK(buffer[3] == 3.0f);

  Tensor view = t.t();
  t = Tensor();
  row = Tensor();
  CHECK(deleted == 0);  // the transposed view still holds the storage
  CHECK(read(view, {1, 1}) == 40.0);
  view = Tensor();
  CHECK(deleted == 1);
  CHECK(deleted_ptr == buffer);

  // With explicit strides: a column-major 3x2 view over the same six floats.
  double col_major[6] = {1, 2, 3, 4, 5, 6};
  Tensor cm = from_blob(col_major, {3, 2}, {1, 3}, {.dtype = kFloat64});
  CHECK(matches_exactly(cm, {3, 2}, {1, 4, 2, 5, 3, 6}));
  CHECK_FALSE(cm.is_contiguous());
  cm = Tensor();  // no deleter: nothing to run, the stack array stays valid
  CHECK(col_major[5] == 6.0);
}

TEST_CASE("full without options takes its dtype from the value, as PyTorch's full", "[tensor][factory]") {
  CHECK(full({2}, 3).dtype() == kInt64);
  CHECK(full({2}, 3).sum().item<int64_t>() == 6);
  CHECK(full({2}, int64_t{1} << 40).max().item<int64_t>() == int64_t{1} << 40);
  CHECK(full({2}, true).dtype() == kBool);
  CHECK(full({2}, 3.0).dtype() == kFloat32);
  CHECK(full({2}, 2.5f).dtype() == kFloat32);
  // Options given: their dtype, whatever the value.
  CHECK(full({2}, 3, {.dtype = kFloat64}).dtype() == kFloat64);
  CHECK(full({2}, 3, TensorOptions{}).dtype() == kFloat32);
}

}  // namespace chorus
