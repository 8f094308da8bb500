// Linear, Embedding, LayerNorm, Dropout, the activations, Flatten/Identity and the containers:
// forward against plain loops in double written here, gradcheck at small sizes, PyTorch's default
// initializations, and the errors bad arguments get.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "nn/nn.h"
#include "tensor/caching_allocator.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tests/nn/reference.h"

namespace chorus {
namespace {

namespace F = nn::functional;
using nn_test::check_close;
using nn_test::doubles;
using nn_test::error_message;

const TensorOptions kF64Grad{.dtype = kFloat64, .requires_grad = true};

// ------------------------------------------------------------------ Linear
// y[r, o] = b[o] + sum_i x[r, i] * w[o, i], over rows r of the flattened leading dims.
std::vector<double> reference_linear(const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>& b, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

TEST_CASE("linear matches x W^T + b for 1-D, 2-D and 3-D inputs, with and without bias", "[nn][linear]") {
  Generator gen(101);
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Shape& lead : std::vector<Shape>{{}, {5}, {2, 3}}) {
      for (bool with_bias : {true, false}) {
        INFO("dtype " << dtype_name(dt) << " leading dims " << lead.size() << " bias " << with_bias);
        Shape xs = lead;
        xs.push_back(7);
        Tensor x = randn(xs, {.dtype = dt}, &gen);
        Tensor w = randn({4, 7}, {.dtype = dt}, &gen);
        Tensor b = with_bias ? randn({4}, {.dtype = dt}, &gen) : Tensor();
        Tensor y = F::linear(x, w, b);
        Shape ys = lead;
        ys.push_back(4);
        CHECK(y.sizes() == ys);
        check_close(y, reference_linear(doubles(x), doubles(w), with_bias ? doubles(b) : std::vector<double>{},
                                        numel_of(lead), 7, 4),
                    dt == kFloat32 ? 1e-5 : 1e-12);
      }
    }
  }
}

TEST_CASE("linear gradients of input, weight and bias pass gradcheck", "[nn][linear][gradcheck]") {
  Generator gen(102);
  for (const Shape& xs : std::vector<Shape>{{3, 4}, {2, 3, 4}, {4}}) {
    Tensor x = randn(xs, kF64Grad, &gen);
    Tensor w = randn({5, 4}, kF64Grad, &gen);
    Tensor b = randn({5}, kF64Grad, &gen);
    CHECK(autograd::gradcheck([](const TensorList& in) { return F::linear(in[0], in[1], in[2]); }, {x, w, b}));
    CHECK(autograd::gradcheck([](const TensorList& in) { return F::linear(in[0], in[1]); }, {x, w}));
  }
}

TEST_CASE("Linear layer: PyTorch's default init U(+-1/sqrt(in)) for weight and bias, forward = F::linear",
          "[nn][linear]") {
  manual_seed(7);
  nn::Linear fc(64, 48);
  CHECK(fc.weight.sizes() == Shape{48, 64});
  CHECK(fc.bias.sizes() == Shape{48});
  const double bound = 1.0 / std::sqrt(64.0);
  for (const Tensor& p : {fc.weight, fc.bias}) {
    std::vector<double> v = doubles(p);
    double lo = 1, hi = -1, mean = 0;
    for (double e : v) lo = std::min(lo, e), hi = std::max(hi, e), mean += e / v.size();
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    CHECK(hi - lo > (v.size() > 100 ? 1.95 : 1.5) * bound);  // the draws fill the interval
    CHECK(std::abs(mean) < 0.1 * bound);
  }
  Tensor x = randn({3, 64});
  CHECK(equal(fc.forward(x), F::linear(x, fc.weight, fc.bias)));
  nn::Linear no_bias(3, 2, false);
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.named_parameters().size() == 1);
  // The same seed gives the same initialization.
  manual_seed(7);
  nn::Linear again(64, 48);
  CHECK(equal(again.weight.detach(), fc.weight.detach()));
}

TEST_CASE("linear rejects mismatched features and bad shapes", "[nn][linear][errors]") {
  CHECK_THAT(error_message([] { F::linear(randn({2, 3}), randn({4, 5})); }),
             Catch::Contains("does not match in_features=5") && Catch::Contains("[2, 3]"));
  CHECK_THAT(error_message([] { F::linear(randn({2, 3}), randn({3})); }), Catch::Contains("weight must be 2-D"));
  CHECK_THAT(error_message([] { F::linear(randn({2, 3}), randn({4, 3}), randn({3})); }),
             Catch::Contains("bias of shape [3] does not match out_features=4"));
  CHECK_THAT(error_message([] { nn::Linear(0, 3); }), Catch::Contains("must be positive"));
}

// ------------------------------------------------------------------ Embedding
TEST_CASE("embedding picks rows for indices of any shape; gradients accumulate per repeated index",
          "[nn][embedding]") {
  Generator gen(111);
  Tensor w = randn({6, 3}, kF64Grad, &gen);
  Tensor idx = tensor(std::vector<int64_t>{1, 4, 1, 0, 5, 1}, Shape{2, 3});
  Tensor out = F::embedding(idx, w);
  REQUIRE(out.sizes() == Shape{2, 3, 3});
  std::vector<double> wv = doubles(w), expected;
  for (int64_t i : {1, 4, 1, 0, 5, 1})
    for (int64_t d = 0; d < 3; ++d) expected.push_back(wv[i * 3 + d]);
  check_close(out, expected, 0);
  CHECK(equal(F::embedding(idx.to(kInt32), w), out));
  // d(sum(out * g))/dw[row] = sum of g over the positions that picked the row.
  Tensor g = randn({2, 3, 3}, {.dtype = kFloat64}, &gen);
  (out * g).sum().backward();
  std::vector<double> gv = doubles(g), gw(18, 0.0);
  const std::vector<int64_t> picks{1, 4, 1, 0, 5, 1};
  for (size_t p = 0; p < picks.size(); ++p)
    for (int64_t d = 0; d < 3; ++d) gw[picks[p] * 3 + d] += gv[p * 3 + d];
  check_close(w.grad(), gw, 1e-12);
  CHECK(autograd::gradcheck([&](const TensorList& in) { return F::embedding(idx, in[0]); },
                            {randn({6, 3}, kF64Grad, &gen)}));
}

// As PyTorch's: an index outside [0, num_embeddings) is refused, a negative one too. Before, -1 was
// wrapped to the last row in the forward (index_select's rule) and the backward's index_add, given
// the -1, wrote before the gradient's first row (a heap write past the allocation's start).
TEST_CASE("embedding refuses an index outside [0, num_embeddings), negative ones included", "[nn][embedding]") {
  Tensor w = randn({10, 4}, kF64Grad);
  CHECK_THROWS_WITH(F::embedding(tensor(std::vector<int64_t>{3, -1}), w),
                    Catch::Contains("embedding: index -1 is out of range for a weight of 10 embeddings") &&
                        Catch::Contains("[0, 10)"));
  CHECK_THROWS_WITH(F::embedding(tensor(std::vector<int32_t>{10}), w), Catch::Contains("index 10 is out of range"));
  const Tensor on_sim = tensor(std::vector<int64_t>{0, 1}).to(Device::sim(0));  // read back to the host
  CHECK_THROWS_WITH(F::embedding(on_sim, randn({1, 4}).to(Device::sim(0))),
                    Catch::Contains("index 1 is out of range for a weight of 1 embeddings"));
  CHECK_FALSE(w.grad().defined());
}

// BERT's and GPT's word embeddings are also their output projection: the weight gets the rows of
// the embedding's gradient and the projection's whole-table gradient.
TEST_CASE("embedding of a tied weight: its rows are added into the projection's gradient", "[nn][embedding]") {
  // Rows 0-2 of a [4, 2] table, row 1 picked three times; the projection gives row 1 a gradient of
  // exactly 1 in each column and the embedding three of 2^-24 each.
  const float tiny = std::ldexp(1.0f, -24);
  Tensor w = zeros({4, 2}, {.requires_grad = true});
  Tensor idx = tensor(std::vector<int64_t>{1, 0, 1, 1, 2});
  Tensor g = full({5, 2}, tiny);
  Tensor x = tensor(std::vector<float>{1, 1, 1, 1}, Shape{2, 2});      // [2, 2]
  Tensor gl = tensor(std::vector<float>{0, 0.5f, 0, 0, 0, 0.5f, 0, 0}, Shape{2, 4});  // picks row 1
  // Exact reference (float64): the projection's gradient gl^T x plus the picked rows of g.
  std::vector<double> want(8, 0.0);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 2; ++c) want[r * 2 + c] = r == 1 ? 1.0 : 0.0;
  for (int64_t i : {1, 0, 1, 1, 2})
    for (int64_t c = 0; c < 2; ++c) want[i * 2 + c] += std::ldexp(1.0, -24);
  // Row 1 as summed in float32: the engine runs the node recorded last first.
  double row1 = 0;
  SECTION("the embedding recorded first, so its backward runs second (as in BERT and GPT)") {
    // Its rows go into the projection's pending gradient one at a time ([Gradient into the pending
    // sum], autograd/engine.cpp): 1 + 2^-24 rounds to 1 each time.
    row1 = 1.0;
    Tensor emb = F::embedding(idx, w);
    Tensor logits = matmul(x, w.t());
    ((emb * g).sum() + (logits * gl).sum()).backward();
  }
  SECTION("the embedding recorded second, so its backward runs first") {
    // Nothing pending yet: a table of its rows (3 * 2^-24 in row 1), then the projection's gradient
    // added to it: 1 + 3 * 2^-24 rounds to 1 + 2^-22.
    row1 = 1.0 + std::ldexp(1.0, -22);
    Tensor logits = matmul(x, w.t());
    Tensor emb = F::embedding(idx, w);
    ((logits * gl).sum() + (emb * g).sum()).backward();
  }
  // Within one rounding per addition of the exact sum (row 1: 1 + 3 * 2^-24 lies between floats).
  check_close(w.grad(), want, 3e-7);
  std::vector<double> got = doubles(w.grad());
  CHECK(got[2] == row1);
  CHECK(got[3] == row1);
}

TEST_CASE("embedding of a weight whose other gradient is shared: the shared tensor is not written", "[nn][embedding]") {
  // (w + c)'s backward hands one gradient to both w and c; the embedding's rows must reach w's
  // gradient only, whichever of them holds that tensor when the embedding's backward runs.
  Generator gen(17);
  Tensor w = randn({5, 3}, {.requires_grad = true}, &gen);
  Tensor c = randn({5, 3}, {.requires_grad = true}, &gen);
  Tensor G = randn({5, 3}, {}, &gen);
  Tensor g = randn({4, 3}, {}, &gen);
  Tensor idx = tensor(std::vector<int64_t>{3, 0, 3, 1});
  Tensor emb = F::embedding(idx, w);
  (((w + c) * G).sum() + (emb * g).sum()).backward();
  check_close(c.grad(), doubles(G), 0);
  std::vector<double> want = doubles(G), gv = doubles(g);
  const std::vector<int64_t> picks{3, 0, 3, 1};
  for (size_t p = 0; p < picks.size(); ++p)
    for (int64_t d = 0; d < 3; ++d) want[picks[p] * 3 + d] += gv[p * 3 + d];
  check_close(w.grad(), want, 1e-6);
}

TEST_CASE("Embedding padding_idx: the row starts at zero and never gets a gradient", "[nn][embedding]") {
  manual_seed(3);
  nn::Embedding emb(10, 4, /*padding_idx=*/2);
  CHECK(emb.weight.sizes() == Shape{10, 4});
  check_close(emb.weight.select(0, 2), {0, 0, 0, 0}, 0);
  // The other rows are N(0, 1) draws: not zero.
  CHECK(doubles(emb.weight.select(0, 3)) != std::vector<double>(4, 0.0));
  Tensor idx = tensor(std::vector<int64_t>{2, 3, 2, 7});
  emb.forward(idx).pow(2).sum().backward();
  check_close(emb.weight.grad().select(0, 2), {0, 0, 0, 0}, 0);
  CHECK(doubles(emb.weight.grad().select(0, 3)) != std::vector<double>(4, 0.0));
  check_close(emb.weight.grad().select(0, 0), {0, 0, 0, 0}, 0);  // never picked
  // A negative padding_idx counts from the end, as PyTorch.
  nn::Embedding neg(5, 2, -1);
  REQUIRE(neg.padding_idx.has_value());
  CHECK(*neg.padding_idx == 4);
  check_close(neg.weight.select(0, 4), {0, 0}, 0);
  CHECK_THAT(error_message([] { nn::Embedding(5, 2, 5); }), Catch::Contains("padding_idx 5"));
  CHECK_THAT(error_message([] { F::embedding(tensor(std::vector<float>{1.0f}), randn({3, 2})); }),
             Catch::Contains("int64 or int32 indices"));
  CHECK_THROWS_AS(F::embedding(tensor(std::vector<int64_t>{3}), randn({3, 2})), Error);  // index out of range
}

// ------------------------------------------------------------------ LayerNorm
// Each row of `cols` trailing elements: (x - mean) / sqrt(biased var + eps) * w + b.
std::vector<double> reference_layer_norm(const std::vector<double>& x, int64_t cols, const std::vector<double>& w,
                                         const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c] / cols;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean) / cols;
    for (int64_t c = 0; c < cols; ++c) {
      double v = (x[r * cols + c] - mean) / std::sqrt(var + eps);
      y[r * cols + c] = w.empty() ? v : v * w[c] + b[c];
    }
  }
  return y;
}

TEST_CASE("layer_norm matches a reference over one or two trailing dims, with and without affine",
          "[nn][layernorm]") {
  Generator gen(121);
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Shape& ns : std::vector<Shape>{{6}, {3, 4}}) {
      for (bool affine : {true, false}) {
        INFO("dtype " << dtype_name(dt) << " normalized dims " << ns.size() << " affine " << affine);
        Shape xs{2, 3};
        xs.insert(xs.end(), ns.begin(), ns.end());
        Tensor x = randn(xs, {.dtype = dt}, &gen) * 3.0 + 1.5;
        Tensor w = affine ? randn(ns, {.dtype = dt}, &gen) : Tensor();
        Tensor b = affine ? randn(ns, {.dtype = dt}, &gen) : Tensor();
        Tensor y = F::layer_norm(x, ns, w, b, 1e-5);
        CHECK(y.sizes() == xs);
        check_close(y,
                    reference_layer_norm(doubles(x), numel_of(ns), affine ? doubles(w) : std::vector<double>{},
                                         affine ? doubles(b) : std::vector<double>{}, 1e-5),
                    dt == kFloat32 ? 2e-5 : 1e-11);
      }
    }
  }
  // eps matters for rows of (nearly) constant values: they normalize to 0, not NaN.
  Tensor flat = full({2, 4}, 3.0);
  check_close(F::layer_norm(flat, {4}), std::vector<double>(8, 0.0), 0);
  Tensor y = F::layer_norm(tensor(std::vector<double>{0, 1e-3}), {2}, Tensor(), Tensor(), 1.0);
  check_close(y, reference_layer_norm({0, 1e-3}, 2, {}, {}, 1.0), 1e-12);
}

// A row of one column normalizes to 0 whatever x is, so y = b and the input gradient is exactly 0:
// the kernel's g*w - mean(g*w) must cancel exactly (an fma would leave the product's rounding error,
// times rstd = 1/sqrt(eps): what the CPU kernel gave in float64 until 2026-11-30, against 0 on CUDA).
TEST_CASE("layer_norm's input gradient over rows of one column is exactly 0", "[nn][layernorm]") {
  Generator gen(123);
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dtype_name(dt));
    Tensor x = add(mul(randn({37, 1}, {.dtype = dt}, &gen), 3.0), 10.0).requires_grad_();
    Tensor w = randn({1}, {.dtype = dt}, &gen).requires_grad_();
    Tensor b = randn({1}, {.dtype = dt}, &gen).requires_grad_();
    Tensor r = randn({37, 1}, {.dtype = dt}, &gen);
    sum(mul(F::layer_norm(x, {1}, w, b, 1e-5), r)).backward();
    check_close(x.grad(), std::vector<double>(37, 0.0), 0);
  }
}

TEST_CASE("layer_norm gradients of input, weight and bias pass gradcheck", "[nn][layernorm][gradcheck]") {
  Generator gen(122);
  Tensor x = randn({3, 2, 4}, kF64Grad, &gen);
  Tensor w = randn({2, 4}, kF64Grad, &gen);
  Tensor b = randn({2, 4}, kF64Grad, &gen);
  CHECK(autograd::gradcheck([](const TensorList& in) { return F::layer_norm(in[0], {2, 4}, in[1], in[2]); }, {x, w, b}));
  CHECK(autograd::gradcheck([](const TensorList& in) { return F::layer_norm(in[0], {4}); }, {x}));
  // Only the weight requiring grad (input and bias constants).
  Tensor xc = randn({5, 3}, {.dtype = kFloat64}, &gen);
  Tensor bc = randn({3}, {.dtype = kFloat64}, &gen);
  CHECK(autograd::gradcheck([&](const TensorList& in) { return F::layer_norm(xc, {3}, in[0], bc); },
                            {randn({3}, kF64Grad, &gen)}));
}

TEST_CASE("LayerNorm layer: ones/zeros init, no parameters without affine, shape errors", "[nn][layernorm]") {
  nn::LayerNorm ln(Shape{4}, 1e-5);
  check_close(ln.weight, {1, 1, 1, 1}, 0);
  check_close(ln.bias, {0, 0, 0, 0}, 0);
  nn::LayerNorm plain(Shape{4}, 1e-5, false);
  CHECK(plain.parameters().empty());
  Tensor x = randn({2, 4});
  CHECK(allclose(ln.forward(x), plain.forward(x)));
  CHECK_THAT(error_message([&] { ln.forward(randn({4, 3})); }),
             Catch::Contains("normalized_shape [4] must match the trailing dims") && Catch::Contains("[4, 3]"));
  CHECK_THAT(error_message([] { F::layer_norm(randn({2, 4}), {4}, ones({3})); }),
             Catch::Contains("must have normalized_shape [4]"));
}

// ------------------------------------------------------------------ Dropout
TEST_CASE("dropout zeroes a fraction p and scales survivors by 1/(1-p); seeded and reproducible",
          "[nn][dropout]") {
  const int64_t n = 400000;
  Tensor x = rand({n}) + 1.0;  // in [1, 2): never zero before dropout
  for (double p : {0.1, 0.5, 0.8}) {
    INFO("p = " << p);
    Generator g1(5), g2(5);
    Tensor y = F::dropout(x, p, true, &g1);
    CHECK(equal(y, F::dropout(x, p, true, &g2)));
    std::vector<double> xv = doubles(x), yv = doubles(y);
    int64_t zeros_seen = 0;
    bool scaled = true;
    for (int64_t i = 0; i < n; ++i) {
      if (yv[i] == 0.0) ++zeros_seen;
      else scaled = scaled && std::abs(yv[i] - xv[i] / (1.0 - p)) <= 1e-6 * yv[i];
    }
    CHECK(scaled);
    // Binomial std of the fraction is sqrt(p(1-p)/n) < 8e-4: 0.005 is more than 6 sigma.
    CHECK(std::abs(static_cast<double>(zeros_seen) / n - p) < 0.005);
  }
  // The module draws from the default generator: manual_seed makes it reproducible.
  nn::Dropout drop(0.3);
  manual_seed(9);
  Tensor a = drop.forward(x);
  manual_seed(9);
  Tensor b = drop.forward(x);
  CHECK(equal(a, b));
  CHECK_FALSE(equal(a, drop.forward(x)));  // the stream moved on
}

// [Dropout mask in one pass] (nn/functional/basic.cpp): dropout keeps element i exactly when the
// generator's i-th uniform draw u (float32 for every input but float64) satisfies u >= p. The
// reference here draws the same numbers with rand() and compares them itself. p is set to draws
// themselves, so some elements sit exactly on the boundary (u == p keeps), besides ordinary p and
// ones at the ends; float16 and bfloat16 inputs (a mask rounded to their dtype), on cpu and sim:0.
TEST_CASE("dropout keeps exactly the elements whose uniform draw is >= p, draws equal to p included",
          "[nn][dropout]") {
  const int64_t n = 6000;
  const uint64_t seed = 21;
  Generator draw_gen(seed);
  const std::vector<double> u = doubles(rand({n}, {}, &draw_gen));
  std::vector<double> ps = {0.1, 0.5, 1.0 / 3.0, 0.999, 1e-9, 0.9999999999};
  for (int64_t i : {17, 2024, 5999}) ps.push_back(u[static_cast<size_t>(i)]);  // each is a draw of its own
  for (const Device& device : {Device::cpu(), Device::sim(0)}) {
    for (DType dtype : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
      for (double p : ps) {
        INFO(dtype_name(dtype) << " on " << device.str() << ", p = " << p);
        Generator gen(seed);
        const Tensor x = ones({n}, {.dtype = dtype, .device = device});
        const std::vector<double> y = doubles(F::dropout(x, p, true, &gen).to(Device::cpu()));
        // float64 inputs draw float64 numbers (compared in float64); every other input float32 ones.
        Generator ref_gen(seed);
        const DType draw_dtype = dtype == kFloat64 ? kFloat64 : kFloat32;
        const std::vector<double> v = doubles(rand({n}, {.dtype = draw_dtype}, &ref_gen));
        const double threshold = dtype == kFloat64 ? p : static_cast<double>(static_cast<float>(p));
        // The survivors' value: 1 / (1 - p) rounded to float32 (the mask's dtype), then to the input's.
        const double kept = doubles(ones({1}, {.dtype = dtype}) * (1.0 / (1.0 - p)))[0];
        int64_t wrong = 0, on_boundary = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double vi = v[static_cast<size_t>(i)];
          if (vi == threshold) ++on_boundary;
          if (y[static_cast<size_t>(i)] != (vi >= threshold ? kept : 0.0)) ++wrong;
        }
        CHECK(wrong == 0);
        if (p == u[17] && draw_dtype == kFloat32) CHECK(on_boundary >= 1);
      }
    }
  }
}

TEST_CASE("dropout is the identity in eval and at p = 0, zero at p = 1; its gradient is the mask",
          "[nn][dropout]") {
  Tensor x = randn({50, 40}, {.requires_grad = true});
  nn::Dropout drop(0.5);
  drop.eval();
  CHECK(equal(drop.forward(x), x));
  CHECK(equal(F::dropout(x, 0.5, /*training=*/false), x));
  CHECK(equal(F::dropout(x, 0.0, true), x));
  check_close(F::dropout(x, 1.0, true), std::vector<double>(2000, 0.0), 0);
  drop.train();
  Generator gen(3);
  Tensor y = F::dropout(x, 0.25, true, &gen);
  y.sum().backward();
  // d y / d x = y / x elementwise: 0 where dropped, 1/(1-p) where kept.
  std::vector<double> g = doubles(x.grad()), yv = doubles(y);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i);
    CHECK(g[i] == Approx(yv[i] == 0.0 ? 0.0 : 1.0 / 0.75));
  }
  CHECK_THAT(error_message([] { nn::Dropout(1.5); }), Catch::Contains("between 0 and 1, but got 1.5"));
  CHECK_THAT(error_message([&] { F::dropout(x, -0.1); }), Catch::Contains("between 0 and 1"));
}

// [Dropout's saved mask] On a device the graph keeps one byte per element between forward and
// backward (which elements were kept), not a mask in the input's dtype; the gradient is the same bits
// as the CPU's (the mask's own value, rounded to the dtype, times g where kept). The sim device's
// caching allocator counts every byte a GPU's would.
TEST_CASE("dropout on a device holds a 1-byte mask for backward; gradients equal the CPU's bit for bit",
          "[nn][dropout]") {
  const Device sim = Device::sim(0);
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    INFO(dtype_name(dt));
    const int64_t n = 1 << 16;  // a multiple of the allocator's 512-byte rounding in every dtype
    const Tensor x_cpu = randn({n}, {.dtype = dt}), g_cpu = randn({n}, {.dtype = dt});
    auto run = [&](Device device, size_t* held) {
      Tensor x = x_cpu.to(device).detach().requires_grad_();
      Generator gen(11);
      synchronize(device);
      const size_t before = device.is_cpu() ? 0 : memory_allocated(device);
      Tensor y = F::dropout(x, 0.1, true, &gen);
      if (held != nullptr) {
        synchronize(device);
        *held = memory_allocated(device) - before;
      }
      y.backward(g_cpu.to(device));
      return std::pair{y.to(kCPU), x.grad().to(kCPU)};
    };
    size_t held = 0;
    const auto [y_sim, gx_sim] = run(sim, &held);
    const auto [y_cpu, gx_cpu] = run(kCPU, nullptr);
    CHECK(equal(y_sim, y_cpu));
    CHECK(equal(gx_sim, gx_cpu));
    // The output, one byte per element for backward (a mask in the dtype would be element_size), and
    // the mask's value as a 0-d tensor (one 512-byte block of the caching allocator).
    CHECK(held == static_cast<size_t>(n) * (element_size(dt) + 1) + 512);
  }
}

// ------------------------------------------------------------------ activations
struct Activation {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
  std::shared_ptr<nn::Module> module;
  std::function<double(double)> reference;
};

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<Activation> elementwise_activations() {
  return {
      {"relu", [](const Tensor& t) { return F::relu(t); }, std::make_shared<nn::ReLU>(),
       [](double x) { return x > 0 ? x : 0.0; }},
      {"gelu", [](const Tensor& t) { return F::gelu(t); }, std::make_shared<nn::GELU>(), gelu_erf},
      {"gelu_tanh", [](const Tensor& t) { return F::gelu(t, "tanh"); }, std::make_shared<nn::GELU>("tanh"), gelu_tanh},
      {"tanh", [](const Tensor& t) { return F::tanh(t); }, std::make_shared<nn::Tanh>(),
       [](double x) { return std::tanh(x); }},
      {"sigmoid", [](const Tensor& t) { return F::sigmoid(t); }, std::make_shared<nn::Sigmoid>(), sigmoid_ref},
      {"silu", [](const Tensor& t) { return F::silu(t); }, std::make_shared<nn::SiLU>(),
       [](double x) { return x * sigmoid_ref(x); }},
  };
}

TEST_CASE("elementwise activations match their formulas in double; the modules match the functions",
          "[nn][activation]") {
  Generator gen(131);
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = randn({7, 9}, {.dtype = dt}, &gen) * 3.0;
    for (const Activation& a : elementwise_activations()) {
      INFO(a.name << " " << dtype_name(dt));
      std::vector<double> expected;
      for (double v : doubles(x)) expected.push_back(a.reference(v));
      Tensor y = a.fn(x);
      CHECK(y.dtype() == dt);
      check_close(y, expected, dt == kFloat32 ? 2e-6 : 1e-13);
      CHECK(equal(a.module->forward(x), y));
    }
  }
  // Saturation: large inputs stay finite and exact in the limits.
  Tensor big = tensor(std::vector<float>{-100.f, 100.f});
  check_close(F::sigmoid(big), {0.0, 1.0}, 0);
  check_close(F::tanh(big), {-1.0, 1.0}, 0);
  check_close(F::silu(big), {0.0, 100.0}, 0);
  check_close(F::gelu(big), {0.0, 100.0}, 0);
  check_close(F::gelu(big, "tanh"), {0.0, 100.0}, 0);
  CHECK_THAT(error_message([] { nn::GELU("fast"); }), Catch::Contains("'none' or 'tanh', got 'fast'"));
}

TEST_CASE("elementwise activations pass gradcheck", "[nn][activation][gradcheck]") {
  // Values kept away from 0, where relu has no derivative.
  Tensor x = tensor(std::vector<double>{-2.5, -1.1, -0.4, -0.05, 0.07, 0.3, 0.9, 1.7, 3.2}, Shape{3, 3});
  for (const Activation& a : elementwise_activations()) {
    INFO(a.name);
    CHECK(autograd::gradcheck([&](const TensorList& in) { return a.fn(in[0]); }, {x.clone().requires_grad_()}));
  }
}

// softmax along `dim` of a [A, B, C] tensor in double, with the max subtracted.
std::vector<double> reference_softmax(const std::vector<double>& x, const Shape& s, int64_t dim, bool log) {
  std::vector<double> y(x.size());
  const int64_t inner = dim == 2 ? 1 : (dim == 1 ? s[2] : s[1] * s[2]);
  const int64_t n = s[dim];
  for (size_t base = 0; base < x.size(); ++base) {
    // `base` is a start of a line along dim when its index along dim is 0.
    if ((static_cast<int64_t>(base) / inner) % n != 0) continue;
    double mx = -INFINITY, sum = 0;
    for (int64_t k = 0; k < n; ++k) mx = std::max(mx, x[base + k * inner]);
    for (int64_t k = 0; k < n; ++k) sum += std::exp(x[base + k * inner] - mx);
    for (int64_t k = 0; k < n; ++k) {
      double v = x[base + k * inner] - mx - std::log(sum);
      y[base + k * inner] = log ? v : std::exp(v);
    }
  }
  return y;
}

TEST_CASE("softmax and log_softmax match a reference along every dim, stay finite at 1e4", "[nn][activation]") {
  Generator gen(132);
  const Shape s{3, 4, 5};
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = randn(s, {.dtype = dt}, &gen) * 4.0;
    for (int64_t dim : {0, 1, 2}) {
      INFO("dim " << dim << " " << dtype_name(dt));
      const double tol = dt == kFloat32 ? 1e-5 : 1e-13;
      check_close(F::softmax(x, dim), reference_softmax(doubles(x), s, dim, false), tol);
      check_close(F::log_softmax(x, dim), reference_softmax(doubles(x), s, dim, true), tol);
      check_close(F::softmax(x, dim - 3), reference_softmax(doubles(x), s, dim, false), tol);  // negative dim
      CHECK(equal(nn::Softmax(dim).forward(x), F::softmax(x, dim)));
      CHECK(equal(nn::LogSoftmax(dim).forward(x), F::log_softmax(x, dim)));
    }
  }
  Tensor huge = tensor(std::vector<float>{1e4f, -1e4f, 0.f, 1e4f - 1.f}, Shape{1, 4});
  std::vector<double> expected = reference_softmax(doubles(huge), {1, 1, 4}, 2, true);
  check_close(F::log_softmax(huge, 1), expected, 1e-6);
  for (double v : doubles(F::softmax(huge, 1))) CHECK(std::isfinite(v));
}

TEST_CASE("softmax and log_softmax pass gradcheck", "[nn][activation][gradcheck]") {
  Generator gen(133);
  for (int64_t dim : {0, 1, -1}) {
    INFO("dim " << dim);
    Tensor x = randn({3, 4}, kF64Grad, &gen);
    CHECK(autograd::gradcheck([&](const TensorList& in) { return F::softmax(in[0], dim); }, {x}));
    CHECK(autograd::gradcheck([&](const TensorList& in) { return F::log_softmax(in[0], dim); }, {x}));
  }
}

// ------------------------------------------------------------------ shape layers and containers
TEST_CASE("Flatten merges start_dim..end_dim, Identity returns its input", "[nn][container]") {
  Tensor x = randn({2, 3, 4, 5});
  CHECK(nn::Flatten().forward(x).sizes() == Shape{2, 60});
  CHECK(nn::Flatten(1, 2).forward(x).sizes() == Shape{2, 12, 5});
  CHECK(nn::Flatten(0, -1).forward(x).sizes() == Shape{120});
  CHECK(equal(nn::Flatten().forward(x).reshape({2, 3, 4, 5}), x));  // values keep their order
  CHECK(nn::Identity().forward(x).is_same(x));
}

TEST_CASE("Sequential runs its modules in order; ModuleList indexes them", "[nn][container]") {
  manual_seed(4);
  auto fc1 = std::make_shared<nn::Linear>(3, 5);
  auto fc2 = std::make_shared<nn::Linear>(5, 2);
  nn::Sequential seq{fc1, std::make_shared<nn::Tanh>(), fc2, std::make_shared<nn::Flatten>(0)};
  REQUIRE(seq.size() == 4);
  CHECK(seq[0] == fc1);
  Tensor x = randn({4, 3});
  CHECK(equal(seq.forward(x), fc2->forward(F::tanh(fc1->forward(x))).flatten()));
  auto extra = std::make_shared<nn::ReLU>();
  seq.push_back(extra);
  CHECK(seq.size() == 5);
  CHECK(seq.named_children()[4].first == "4");
  CHECK_THAT(error_message([&] { (void)seq[5]; }), Catch::Contains("index 5 is out of range for 5 modules"));

  nn::ModuleList list{fc1, fc2};
  list.push_back(std::make_shared<nn::ReLU>());
  REQUIRE(list.size() == 3);
  CHECK(list.at<nn::Linear>(1) == fc2);
  CHECK(list.at<nn::Linear>(1)->weight.is_same(fc2->weight));
  int count = 0;
  for (const auto& m : list) count += m != nullptr;
  CHECK(count == 3);
  CHECK(list.named_parameters().size() == 4);
  CHECK(list.named_parameters()[2].first == "1.weight");
  CHECK_THAT(error_message([&] { list.at<nn::Linear>(2); }), Catch::Contains("element 2 is a ReLU"));
  CHECK_THAT(error_message([&] { (void)list[3]; }), Catch::Contains("out of range"));
}

}  // namespace
}  // namespace chorus
