// The composite ops (autograd/ops/composite.cpp) against hand-computed results, their gradients
// against finite differences (gradcheck, float64), and the same ops on the sim device equal to the
// CPU's. Bad arguments get a message naming what was given and what was expected.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_testing.h"

namespace chorus {
namespace {

using testing::matches;
using testing::matches_exactly;

Tensor f64(std::vector<double> v, Shape s) { return tensor(v, s); }
Tensor rnd(Shape s, uint64_t seed) {
  Generator g(seed);
  return randn(s, {.dtype = kFloat64}, &g);
}
bool grad_ok(const std::function<Tensor(const TensorList&)>& f, TensorList in) {
  for (Tensor& t : in) t.requires_grad_();
  return autograd::gradcheck(f, in);
}

}  // namespace

TEST_CASE("tril, triu, flip, roll, repeat, tile, repeat_interleave", "[tensor][composite]") {
  const Tensor m = f64({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  CHECK(matches_exactly(tril(m), {3, 4}, {1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0}));
  CHECK(matches_exactly(tril(m, 1), {3, 4}, {1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12}));
  CHECK(matches_exactly(triu(m), {3, 4}, {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}));
  CHECK(matches_exactly(triu(m, -1), {3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12}));
  CHECK(matches_exactly(flip(m, {0}), {3, 4}, {9, 10, 11, 12, 5, 6, 7, 8, 1, 2, 3, 4}));
  CHECK(matches_exactly(flip(m, {0, -1}), {3, 4}, {12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}));
  CHECK(matches_exactly(roll(m, {1}, {1}), {3, 4}, {4, 1, 2, 3, 8, 5, 6, 7, 12, 9, 10, 11}));
  CHECK(matches_exactly(roll(m, {-1, 5}, {0, 1}), {3, 4}, {8, 5, 6, 7, 12, 9, 10, 11, 4, 1, 2, 3}));
  CHECK(matches_exactly(roll(m, {2}), {3, 4}, {11, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  const Tensor v = f64({1, 2, 3}, {3});
  CHECK(matches_exactly(repeat(v, {2}), {6}, {1, 2, 3, 1, 2, 3}));
  CHECK(matches_exactly(repeat(v, {2, 2}), {2, 6}, {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}));
  CHECK(matches_exactly(tile(f64({1, 2, 3, 4}, {2, 2}), {2}), {2, 4}, {1, 2, 1, 2, 3, 4, 3, 4}));
  CHECK(matches_exactly(repeat_interleave(v, 2), {6}, {1, 1, 2, 2, 3, 3}));
  CHECK(matches_exactly(repeat_interleave(f64({1, 2, 3, 4}, {2, 2}), 2, 0), {4, 2}, {1, 2, 1, 2, 3, 4, 3, 4}));
  CHECK_THROWS_WITH(flip(m, {0, 0}), Catch::Contains("dim 0 appears more than once"));
  CHECK_THROWS_WITH(roll(m, {1, 2}, {0}), Catch::Contains("got 2 shifts and 1 dims"));
  CHECK_THROWS_WITH(repeat(m, {2}), Catch::Contains("got 1 repeats for a tensor of 2 dims"));
  CHECK_THROWS_WITH(tril(v), Catch::Contains("expected a tensor of at least 2 dimensions"));

  const Tensor a = rnd({3, 4}, 1);
  CHECK(grad_ok([](const TensorList& x) { return tril(x[0], 1); }, {a.clone()}));
  CHECK(grad_ok([](const TensorList& x) { return triu(x[0]); }, {a.clone()}));
  CHECK(grad_ok([](const TensorList& x) { return flip(x[0], {0, 1}); }, {a.clone()}));
  CHECK(grad_ok([](const TensorList& x) { return roll(x[0], {1, -3}, {0, 1}); }, {a.clone()}));
  CHECK(grad_ok([](const TensorList& x) { return repeat(x[0], {2, 1, 3}); }, {a.clone()}));
  CHECK(grad_ok([](const TensorList& x) { return repeat_interleave(x[0], 3, 1); }, {a.clone()}));
}

TEST_CASE("cumsum and cumprod", "[tensor][composite]") {
  CHECK(matches_exactly(cumsum(f64({1, 2, 3, 4, 5}, {5}), 0), {5}, {1, 3, 6, 10, 15}));
  CHECK(matches_exactly(cumprod(f64({1, 2, 3, 4, 5}, {5}), 0), {5}, {1, 2, 6, 24, 120}));
  CHECK(matches_exactly(cumsum(f64({1, 2, 3, 4, 5, 6}, {2, 3}), 1), {2, 3}, {1, 3, 6, 4, 9, 15}));
  CHECK(matches_exactly(cumsum(f64({1, 2, 3, 4, 5, 6}, {2, 3}), 0), {2, 3}, {1, 2, 3, 5, 7, 9}));
  Tensor ints = tensor<int32_t>({1, 2, 3});
  CHECK(cumsum(ints, 0).dtype() == kInt64);
  CHECK(matches_exactly(cumsum(tensor<bool>({true, false, true}), 0), {3}, {1, 1, 2}));
  // 1000 elements: ten doubling passes, against a running sum.
  const Tensor x = rnd({1000}, 2);
  std::vector<double> run(1000);
  const std::vector<double> xv = testing::values(x);
  double acc = 0;
  for (int i = 0; i < 1000; ++i) run[i] = acc += xv[i];
  CHECK(matches(cumsum(x, -1), {1000}, run, 1e-12, 1e-12));
  CHECK(grad_ok([](const TensorList& t) { return cumsum(t[0], 1); }, {rnd({3, 7}, 3)}));
  CHECK(grad_ok([](const TensorList& t) { return cumprod(t[0], 0); }, {rnd({6, 2}, 4)}));
}

TEST_CASE("dot, outer, addcmul, addcdiv, lerp, clamp with tensor bounds", "[tensor][composite]") {
  const Tensor a = f64({1, 2, 3}, {3}), b = f64({4, 5, 6}, {3});
  CHECK(dot(a, b).item<double>() == 32);
  CHECK(matches_exactly(outer(a, f64({1, -1}, {2})), {3, 2}, {1, -1, 2, -2, 3, -3}));
  CHECK(matches_exactly(addcmul(a, a, b, 0.5), {3}, {3, 7, 12}));
  CHECK(matches(addcdiv(a, a, b, 2.0), {3}, {1.5, 2.8, 4}, 1e-15, 0));
  CHECK(matches_exactly(lerp(a, b, 0.5), {3}, {2.5, 3.5, 4.5}));
  CHECK(matches_exactly(lerp(a, b, f64({0, 1, 0.5}, {3})), {3}, {1, 5, 4.5}));
  CHECK(matches_exactly(clamp(f64({-3, 0, 3}, {3}), f64({-1, 1, 1}, {3}), f64({2, 2, 2}, {3})), {3}, {-1, 1, 2}));
  CHECK(matches_exactly(clamp(f64({-3, 0, 3}, {3}), Tensor(), f64({0}, {1})), {3}, {-3, 0, 0}));
  CHECK_THROWS_WITH(dot(a, f64({1, 2}, {2})), Catch::Contains("expected two 1-D tensors of the same length"));
  CHECK(grad_ok([](const TensorList& t) { return dot(t[0], t[1]); }, {rnd({5}, 5), rnd({5}, 6)}));
  CHECK(grad_ok([](const TensorList& t) { return outer(t[0], t[1]); }, {rnd({3}, 7), rnd({4}, 8)}));
  CHECK(grad_ok([](const TensorList& t) { return addcdiv(t[0], t[1], add(abs(t[2]), 1.0), -0.5); },
                {rnd({4}, 9), rnd({4}, 10), rnd({4}, 11)}));
  CHECK(grad_ok([](const TensorList& t) { return lerp(t[0], t[1], t[2]); }, {rnd({4}, 12), rnd({4}, 13), rnd({4}, 14)}));
}

TEST_CASE("remainder, fmod and floor_divide follow Python's and C's signs", "[tensor][composite]") {
  const Tensor a = f64({5, -5, 5, -5, 5.5}, {5}), b = f64({3, 3, -3, -3, 2}, {5});
  CHECK(matches_exactly(remainder(a, b), {5}, {2, 1, -1, -2, 1.5}));
  CHECK(matches_exactly(fmod(a, b), {5}, {2, -2, 2, -2, 1.5}));
  CHECK(matches_exactly(floor_divide(a, b), {5}, {1, -2, -2, 1, 2}));
  const Tensor ia = tensor<int64_t>({7, -7, 7}), ib = tensor<int64_t>({2, 2, -2});
  CHECK(remainder(ia, ib).dtype() == kInt64);
  CHECK(matches_exactly(remainder(ia, ib), {3}, {1, 1, -1}));
  CHECK(matches_exactly(fmod(ia, ib), {3}, {1, -1, 1}));
  CHECK(matches_exactly(floor_divide(ia, ib), {3}, {3, -4, -4}));
  CHECK(matches_exactly(remainder(ia, Scalar(int64_t{3})), {3}, {1, 2, 1}));
  CHECK_THROWS_WITH(remainder(ia, tensor<int64_t>({1, 0, 1})), Catch::Contains("integer division by zero"));
  CHECK(grad_ok([](const TensorList& t) { return remainder(t[0], 0.7); }, {f64({0.3, 1.1, -2.2, 5.05}, {4})}));
}

TEST_CASE("any, all, isnan, isinf, isfinite, nonzero, masked_select", "[tensor][composite]") {
  const Tensor x = f64({0, 1, NAN, INFINITY, -INFINITY, 2}, {2, 3});
  CHECK(any(x).item<bool>());
  CHECK_FALSE(all(x).item<bool>());
  CHECK(matches_exactly(any(eq(x, 0), 1), {2}, {1, 0}));
  CHECK(matches_exactly(all(ne(x, 0), 1, true), {2, 1}, {0, 1}));
  CHECK(all(ones({0})).item<bool>());  // empty: all true, any false
  CHECK_FALSE(any(ones({0})).item<bool>());
  CHECK(matches_exactly(isnan(x), {2, 3}, {0, 0, 1, 0, 0, 0}));
  CHECK(matches_exactly(isinf(x), {2, 3}, {0, 0, 0, 1, 1, 0}));
  CHECK(matches_exactly(isfinite(x), {2, 3}, {1, 1, 0, 0, 0, 1}));
  CHECK(matches_exactly(isfinite(tensor<int64_t>({1, 2})), {2}, {1, 1}));
  CHECK(matches_exactly(nonzero(f64({0, 3, 0, 4, 5, 0}, {2, 3})), {3, 2}, {0, 1, 1, 0, 1, 1}));
  CHECK(nonzero(zeros({4})).sizes() == Shape{0, 1});
  const Tensor m = tensor<bool>({true, false, true}, Shape{3});
  CHECK(matches_exactly(masked_select(f64({1, 2, 3, 4, 5, 6}, {2, 3}), m), {4}, {1, 3, 4, 6}));
  CHECK(grad_ok([m](const TensorList& t) { return masked_select(t[0], m); }, {rnd({2, 3}, 15)}));
}

TEST_CASE("sort, argsort and topk: stable, NaN last, gradients through the values", "[tensor][composite]") {
  const Tensor x = f64({3, 1, NAN, 2, 1}, {5});
  auto [v, i] = sort(x);
  CHECK(matches(v, {5}, {1, 1, 2, 3, NAN}));
  CHECK(matches_exactly(i, {5}, {1, 4, 3, 0, 2}));  // the two 1s keep their order
  auto [vd, id] = sort(x, 0, true);
  CHECK(matches(vd, {5}, {NAN, 3, 2, 1, 1}));
  CHECK(matches_exactly(id, {5}, {2, 0, 3, 1, 4}));
  const Tensor m = f64({5, 1, 4, 2, 8, 3}, {2, 3});
  CHECK(matches_exactly(argsort(m, 0), {2, 3}, {1, 0, 1, 0, 1, 0}));
  auto [tv, ti] = topk(m, 2, 1);
  CHECK(matches_exactly(tv, {2, 2}, {5, 4, 8, 3}));
  CHECK(matches_exactly(ti, {2, 2}, {0, 2, 1, 2}));
  auto [sv, si] = topk(m, 1, 1, false);
  CHECK(matches_exactly(sv, {2, 1}, {1, 2}));
  CHECK_THROWS_WITH(topk(m, 4, 1), Catch::Contains("k = 4 is out of range for a dimension of size 3"));
  CHECK(grad_ok([](const TensorList& t) { return sort(t[0], 1).first; }, {rnd({3, 5}, 16)}));
  CHECK(grad_ok([](const TensorList& t) { return topk(t[0], 2, 0).first; }, {rnd({4, 3}, 17)}));
}

TEST_CASE("bernoulli and multinomial draw as their probabilities say", "[tensor][composite]") {
  Generator g(5);
  const Tensor p = full({20000}, 0.3, {.dtype = kFloat64});
  const double mean_draw = mean(bernoulli(p, &g)).item<double>();
  CHECK(std::abs(mean_draw - 0.3) < 0.015);
  CHECK(matches_exactly(bernoulli(f64({0, 1, 0, 1}, {4}), &g), {4}, {0, 1, 0, 1}));
  CHECK_THROWS_WITH(bernoulli(f64({1.5}, {1})), Catch::Contains("probabilities must be in [0, 1]"));
  const Tensor w = f64({1, 0, 3}, {3});
  const Tensor draws = multinomial(w, 8000, true, &g);
  CHECK(draws.sizes() == Shape{8000});
  CHECK(sum(eq(draws, 1)).item<int64_t>() == 0);  // zero weight: never drawn
  const double share2 = sum(eq(draws, 2)).item<int64_t>() / 8000.0;
  CHECK(std::abs(share2 - 0.75) < 0.03);
  // Without replacement: every category once.
  const Tensor perm = multinomial(f64({1, 1, 1, 1}, {4}), 4, false, &g);
  CHECK(matches_exactly(sort(perm).first, {4}, {0, 1, 2, 3}));
  CHECK_THROWS_WITH(multinomial(w, 3, false), Catch::Contains("row 0 has no positive probability left"));
  CHECK_THROWS_WITH(multinomial(w, 4, false), Catch::Contains("cannot draw 4 samples without replacement from 3"));
}

TEST_CASE("the composite ops on the sim device equal the CPU's", "[tensor][composite][sim]") {
  const Device sim = Device::sim();
  const Tensor a = rnd({4, 5}, 20), b = add(abs(rnd({4, 5}, 21)), 0.5);
  auto same = [&](const std::function<Tensor(const Tensor&, const Tensor&)>& f) {
    return equal(f(a.to(sim), b.to(sim)).to(kCPU), f(a, b));
  };
  CHECK(same([](const Tensor& x, const Tensor&) { return tril(x, -1); }));
  CHECK(same([](const Tensor& x, const Tensor&) { return flip(x, {1}); }));
  CHECK(same([](const Tensor& x, const Tensor&) { return roll(x, {2}, {1}); }));
  CHECK(same([](const Tensor& x, const Tensor&) { return cumsum(x, 1); }));
  CHECK(same([](const Tensor& x, const Tensor& y) { return remainder(x, y); }));
  CHECK(same([](const Tensor& x, const Tensor&) { return sort(x, 1).first; }));
  CHECK(same([](const Tensor& x, const Tensor&) { return topk(x, 2, 0).second; }));
  CHECK(same([](const Tensor& x, const Tensor&) { return masked_select(x, gt(x, 0)); }));
  CHECK(same([](const Tensor& x, const Tensor&) { return nonzero(gt(x, 0)); }));
}

// An in-place op whose operand is another view of self's memory reads the operand as it was before
// the op (NumPy's rule, and copy_'s), on the CPU and on sim alike. Before, the kernel read what it
// had already written: the CPU's loop gave x.add_(x[0])'s second row 12, 24, 36 and a.add_(a.t())
// [[2, 5], [8, 8]], while a GPU's threads, reading before writing, gave other values.
TEST_CASE("an in-place op whose operand overlaps self as another view reads the operand from before the op",
          "[tensor][composite][sim]") {
  for (const Device d : {kCPU, Device::sim(0)}) {
    INFO(d.str());
    Tensor x = f64({1, 2, 3, 10, 20, 30}, {2, 3}).to(d);
    x.add_(x.select(0, 0));
    CHECK(matches_exactly(x.cpu(), {2, 3}, {2, 4, 6, 11, 22, 33}));
    Tensor a = f64({1, 2, 3, 4}, {2, 2}).to(d);
    a.add_(a.t());
    CHECK(matches_exactly(a.cpu(), {2, 2}, {2, 5, 5, 8}));
    Tensor b = f64({1, 2, 3, 4}, {4}).to(d);
    b.narrow(0, 1, 3).mul_(b.narrow(0, 0, 3));  // shifted by one element
    CHECK(matches_exactly(b.cpu(), {4}, {1, 2, 6, 12}));
    Tensor c = f64({1, 2, 3}, {3}).to(d);
    c.mul_(c);  // the same view: no copy needed, each element read before it is written
    CHECK(matches_exactly(c.cpu(), {3}, {1, 4, 9}));
  }
}

// one_hot's checks read the labels on the host: device labels are copied there (before, their
// device pointer was read on the host).
TEST_CASE("one_hot of labels on sim equals the CPU's and refuses bad classes", "[tensor][index][sim]") {
  const Tensor labels = tensor(std::vector<int64_t>{2, 0, 1});
  const Tensor got = one_hot(labels.to(Device::sim(0)), 4);
  CHECK(got.device() == Device::sim(0));
  CHECK(equal(got.cpu(), one_hot(labels, 4)));
  CHECK(one_hot(labels.to(Device::sim(0))).size(1) == 3);
  CHECK_THROWS_WITH(one_hot(tensor(std::vector<int64_t>{1, -2}).to(Device::sim(0)), 3),
                    Catch::Contains("one_hot: class values must be non-negative, got -2"));
  CHECK_THROWS_WITH(one_hot(labels.to(Device::sim(0)), 2), Catch::Contains("class value 2 is out of range for num_classes 2"));
}

// Tensor.uniform_/normal_/bernoulli_: the values' range and moments over 200,000 draws (bounds
// of more than 5 standard errors), non-contiguous targets filled everywhere, the same draws as
// the sim device's for one seed, and autograd's rules for in-place ops.
TEST_CASE("uniform_, normal_ and bernoulli_ fill a tensor in place", "[tensor][composite]") {
  const int64_t n = 200000;
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO(dtype_name(dtype));
    Generator g(21);
    Tensor u = empty({n}, {.dtype = dtype});
    u.uniform_(-2.0, 3.0, &g);
    CHECK(min(u).item<double>() >= -2.0);
    CHECK(max(u).item<double>() < 3.0);
    CHECK(std::abs(mean(u).item<double>() - 0.5) < 5 * 5.0 / std::sqrt(12.0 * n));
    Tensor z = empty({n}, {.dtype = dtype});
    z.normal_(1.5, 0.5, &g);
    CHECK(std::abs(mean(z).item<double>() - 1.5) < 5 * 0.5 / std::sqrt(double(n)));
    CHECK(std::abs(z.std().item<double>() - 0.5) < 0.01);
    Tensor b = empty({n}, {.dtype = dtype});
    b.bernoulli_(0.3, &g);
    CHECK(sum(logical_and(ne(b, 0), ne(b, 1))).item<int64_t>() == 0);
    CHECK(std::abs(mean(b).item<double>() - 0.3) < 5 * std::sqrt(0.3 * 0.7 / n));
  }
  // A transposed (non-contiguous) view is filled everywhere, and through the view its base.
  Tensor base = full({40, 30}, 100.0, {.dtype = kFloat64});
  Tensor view = base.t();
  view.uniform_(0.0, 1.0);
  CHECK(max(base).item<double>() < 1.0);
  // The same generator state draws the same values again, and on the sim device.
  Generator g1(5), g3(5);
  Tensor a = empty({1000}, {.dtype = kFloat32}), c = empty({1000}, {.dtype = kFloat32});
  a.normal_(0.0, 2.0, &g1);
  c.normal_(0.0, 2.0, &g3);
  CHECK(equal(a, c));
  CHECK(!equal(a, empty({1000}, {.dtype = kFloat32}).normal_(0.0, 2.0, &g3)));
  Generator g4(5);
  Tensor on_sim = empty({1000}, {.dtype = kFloat32, .device = Device::sim(0)});
  on_sim.normal_(0.0, 2.0, &g4);
  CHECK(equal(on_sim.cpu(), a));
  // Probabilities as a tensor, broadcast: 0 and 1 are certain.
  Tensor p = f64({0, 1, 1, 0}, {4});
  Tensor m = empty({3, 4}, {.dtype = kFloat32});
  m.bernoulli_(p);
  CHECK(equal(m, p.to(kFloat32).expand({3, 4})));
}

TEST_CASE("random in-place fills follow autograd's rules and refuse bad arguments", "[tensor][composite]") {
  Tensor leaf = randn({4}, {.dtype = kFloat64}).requires_grad_();
  CHECK_THROWS_WITH(leaf.normal_(), Catch::Contains("a leaf tensor that requires grad"));
  {
    NoGradGuard no_grad;
    leaf.uniform_(0.0, 1.0);  // as nn::init does
  }
  CHECK(max(leaf.detach()).item<double>() < 1.0);
  // A tensor with history: the overwritten values carry no gradient back.
  Tensor y = mul(leaf, 3.0);
  y.normal_();
  sum(mul(y, y)).backward();
  REQUIRE(leaf.grad().defined());
  CHECK(equal(leaf.grad(), zeros({4}, {.dtype = kFloat64})));
  Tensor ints = zeros({3}, {.dtype = kInt64});
  CHECK_THROWS_WITH(ints.uniform_(), Catch::Contains("uniform_: expected a floating-point tensor, got int64"));
  Tensor f = zeros({3});
  CHECK_THROWS_WITH(f.uniform_(1.0, 0.0), Catch::Contains("from <= to, got from=1 to=0"));
  CHECK_THROWS_WITH(f.normal_(0.0, -1.0), Catch::Contains("std must be non-negative"));
  CHECK_THROWS_WITH(f.bernoulli_(1.5), Catch::Contains("probability p in [0, 1], got 1.5"));
  CHECK_THROWS_WITH(f.bernoulli_(f64({2, 0, 0}, {3})), Catch::Contains("probabilities p must be in [0, 1]"));
  ints.bernoulli_(1.0);  // integer targets take 0/1 too, as PyTorch's
  CHECK(equal(ints, ones({3}, {.dtype = kInt64})));
}

}  // namespace chorus
