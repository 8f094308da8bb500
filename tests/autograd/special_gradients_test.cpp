// Exact gradients where finite differences cannot decide or a convention does: prod over slices
// with zeros, norm at a zero vector, ties in max/min, kinks of abs/relu/clamp, pow at a zero base.
// Also what a gradient must look like beyond its values: the input's dtype after to() and mixed-
// dtype ops, the input's shape after broadcasting, and mm fed stride-0 or overlapping operands.
#include <catch2/catch.hpp>

#include <cmath>

#include "tests/autograd/autograd_testing.h"

namespace chorus {

TEST_CASE("prod's gradient at zeros: one zero gets the product of the rest, two zeros give 0",
          "[autograd][reduce]") {
  Tensor x = testing::leaf_from({2.0, 0.0, 3.0, -1.5,   // one zero: only its slot gets 2*3*-1.5
                                 0.0, 4.0, 0.0, 5.0,    // two zeros: all 0
                                 1.0, -2.0, 0.5, 4.0},  // no zero: prod / x
                                {3, 4});
  Tensor y = prod(x, 1);
  CHECK(testing::same_values(y, tensor<double>({0.0, 0.0, -4.0})));
  y.backward(tensor<double>({1.0, 1.0, 2.0}));
  Tensor expected = tensor<double>({0.0, -9.0, 0.0, 0.0,  //
                                    0.0, 0.0, 0.0, 0.0,   //
                                    -8.0, 4.0, -16.0, -2.0},
                                   Shape{3, 4});
  CHECK(testing::same_values(x.grad(), expected));

  Tensor z = testing::leaf_from({3.0, 0.0, -2.0}, {3});
  prod(z).backward();
  CHECK(testing::same_values(z.grad(), tensor<double>({0.0, -6.0, 0.0})));
}

TEST_CASE("norm p=2 at a zero vector has zero gradient, not NaN", "[autograd][reduce]") {
  Tensor x = zeros({3}, {.dtype = kFloat64});
  x.requires_grad_();
  norm(x).backward();
  CHECK(testing::same_values(x.grad(), zeros({3}, {.dtype = kFloat64})));

  // Per-row: the zero row gets 0, the other x / ||x||.
  Tensor m = testing::leaf_from({0.0, 0.0, 3.0, 4.0}, {2, 2});
  norm(m, 2.0, {1}).sum().backward();
  CHECK(testing::same_values(m.grad(), tensor<double>({0.0, 0.0, 0.6, 0.8}, Shape{2, 2})));
}

TEST_CASE("equal extremes share the gradient; max(dim) sends it to the first index", "[autograd][reduce]") {
  Tensor x = testing::leaf_from({1.0, 3.0, 3.0, -2.0}, {4});
  amax(x).backward();
  CHECK(testing::same_values(x.grad(), tensor<double>({0.0, 0.5, 0.5, 0.0})));

  Tensor y = testing::leaf_from({1.0, 3.0, 3.0, -2.0}, {4});
  auto [values, indices] = max(y, 0);
  CHECK(indices.item<int64_t>() == 1);
  values.backward();
  CHECK(testing::same_values(y.grad(), tensor<double>({0.0, 1.0, 0.0, 0.0})));

  Tensor a = testing::leaf_from({1.0, 2.0}, {2});
  Tensor b = testing::leaf_from({1.0, 5.0}, {2});
  maximum(a, b).sum().backward();
  CHECK(testing::same_values(a.grad(), tensor<double>({0.5, 0.0})));
  CHECK(testing::same_values(b.grad(), tensor<double>({0.5, 1.0})));
}

TEST_CASE("to(dtype) sends the gradient back in the input's dtype", "[autograd][view]") {
  Tensor x64 = testing::leaf_from({1.0, -2.0, 0.5}, {3});
  Tensor y32 = x64.to(kFloat32);
  CHECK(y32.dtype() == kFloat32);
  (y32 * y32).sum().backward();
  REQUIRE(x64.grad().defined());
  CHECK(x64.grad().dtype() == kFloat64);
  CHECK(testing::same_values(x64.grad(), tensor<double>({2.0, -4.0, 1.0})));

  Tensor x32 = tensor<float>({1.5f, -0.25f});
  x32.requires_grad_();
  Tensor y64 = x32.to(kFloat64);
  (y64 * 3.0).sum().backward();
  REQUIRE(x32.grad().defined());
  CHECK(x32.grad().dtype() == kFloat32);
  CHECK(testing::same_values(x32.grad(), tensor<float>({3.0f, 3.0f})));
}

TEST_CASE("a gradient reduced from a broadcast has the input's shape and the summed values",
          "[autograd][pointwise]") {
  Tensor a = testing::leaf_from({1.0, 2.0, 3.0}, {3, 1});
  Tensor b = testing::leaf_from({10.0, 20.0, 30.0, 40.0}, {4});
  Tensor c = testing::leaf_from({2.0}, {});
  (a * b * c).sum().backward();
  CHECK(testing::same_values(a.grad(), tensor<double>({200.0, 200.0, 200.0}, Shape{3, 1})));
  CHECK(testing::same_values(b.grad(), tensor<double>({12.0, 12.0, 12.0, 12.0})));
  CHECK(testing::same_values(c.grad(), full({}, 600.0, {.dtype = kFloat64})));
}

TEST_CASE("as_strided's gradient accumulates where windows overlap", "[autograd][view]") {
  Tensor x = testing::leaf_from({1, 2, 3, 4, 5, 6}, {6});
  as_strided(x, {2, 4}, {2, 1}).sum().backward();  // windows [0..3] and [2..5]
  CHECK(testing::same_values(x.grad(), tensor<double>({1, 1, 2, 2, 1, 1})));

  Tensor base = zeros({3, 2}, {.dtype = kFloat64}).t();
  base.requires_grad_();
  REQUIRE_THROWS_MATCHES(as_strided(base, {2}, {1}), Error, testing::error_containing({"as_strided", "contiguous"}));
}

TEST_CASE("mm reads expanded (stride-0) and overlapping operands as the matrices they show", "[autograd][linalg]") {
  // sum(dim 0) sends mm's backward a gradient expanded along rows: strides [0, 1].
  Tensor x = testing::leaf_from({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor w = testing::leaf_from({1, -1, 2, 0.5, 0, 3}, {2, 3});
  mm(x, w).sum({0}).backward(tensor<double>({1.0, 10.0, 100.0}));
  // d/dx[i][k] = sum_j g[j] w[k][j]: the same row for every i.
  CHECK(testing::same_values(x.grad(), tensor<double>({191, 300.5, 191, 300.5, 191, 300.5}, Shape{3, 2})));
  // d/dw[k][j] = g[j] * sum_i x[i][k].
  CHECK(testing::same_values(w.grad(), tensor<double>({9, 90, 900, 12, 120, 1200}, Shape{2, 3})));

  Tensor row = tensor<double>({1.0, 2.0}).unsqueeze(0).expand({3, 2});
  Tensor col = tensor<double>({1.0, 2.0, 3.0}).unsqueeze(1).expand({3, 2});
  Tensor windows = as_strided(tensor<double>({1, 2, 3, 4}), {3, 2}, {1, 1});  // rows [1,2] [2,3] [3,4]
  Tensor b = tensor<double>({1, 2, 3, 4}, Shape{2, 2});
  for (const Tensor& a : {row, col, windows}) {
    INFO("strides " << shape_str(a.strides()));
    CHECK(testing::same_values(mm(a, b), mm(a.contiguous(), b)));
    CHECK(testing::same_values(mm(b.t(), a.t()), mm(b.t(), a.t().contiguous())));
  }
}

TEST_CASE("scatter's src gradient when src is larger than index: zeros outside the read block",
          "[autograd][index]") {
  Tensor self = testing::leaf_from({0, 0, 0, 0, 0, 0}, {2, 3});
  Tensor src = testing::leaf_from({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor idx = tensor<int64_t>({2, 0}, Shape{2, 1});  // reads src[:, :1] only
  Tensor y = scatter(self, 1, idx, src);
  CHECK(testing::same_values(y, tensor<double>({0, 0, 1, 4, 0, 0}, Shape{2, 3})));
  y.backward(tensor<double>({1, 2, 3, 4, 5, 6}, Shape{2, 3}));
  CHECK(testing::same_values(src.grad(), tensor<double>({3, 0, 0, 4, 0, 0}, Shape{2, 3})));
  CHECK(testing::same_values(self.grad(), tensor<double>({1, 2, 0, 0, 5, 6}, Shape{2, 3})));

  Tensor src2 = testing::leaf_from({1, 2, 3, 4, 5, 6}, {2, 3});
  scatter_add(zeros({2, 3}, {.dtype = kFloat64}), 1, idx, src2).backward(ones({2, 3}, {.dtype = kFloat64}));
  CHECK(testing::same_values(src2.grad(), tensor<double>({1, 0, 0, 1, 0, 0}, Shape{2, 3})));
}

TEST_CASE("pow at a zero base: zero gradients, not NaN", "[autograd][pointwise]") {
  Tensor x = testing::leaf_from({0.0, 2.0}, {2});
  Tensor e = testing::leaf_from({2.0, 3.0}, {2});
  pow(x, e).sum().backward();
  CHECK(testing::same_values(x.grad(), tensor<double>({0.0, 12.0})));
  CHECK(testing::same_values(e.grad(), tensor<double>({0.0, 8.0 * std::log(2.0)})));
}

TEST_CASE("kinks: abs and relu have gradient 0 at 0, clamp passes it at its bounds", "[autograd][pointwise]") {
  Tensor x = testing::leaf_from({0.0, -1.0, 1.0}, {3});
  (abs(x) + relu(x) * 10.0 + clamp(x, -1.0, 1.0) * 100.0).sum().backward();
  CHECK(testing::same_values(x.grad(), tensor<double>({100.0, 99.0, 111.0})));
}

TEST_CASE("mixed dtypes: each input gets its gradient in its own dtype", "[autograd][pointwise]") {
  Tensor a = tensor<float>({1.0f, 2.0f});
  a.requires_grad_();
  Tensor b = testing::leaf_from({3.0, 4.0}, {2});
  Tensor y = a * b;
  CHECK(y.dtype() == kFloat64);
  (y + cat({a, b}).narrow(0, 1, 2) + where(tensor<bool>({true, false}), a, b)).sum().backward();
  REQUIRE(a.grad().defined());
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(b.grad().dtype() == kFloat64);
  CHECK(testing::same_values(a.grad(), tensor<float>({4.0f, 5.0f})));  // b + [0, 1] + [1, 0]
  CHECK(testing::same_values(b.grad(), tensor<double>({2.0, 3.0})));   // a + [1, 0] + [0, 1]
}

TEST_CASE("pow's gradient with respect to the base is 0 where the exponent is 0, even at base 0", "[autograd][pow]") {
  Tensor a = tensor<double>({0.0, 2.0, 0.0}).requires_grad_(true);
  Tensor b = tensor<double>({0.0, 3.0, 2.0}).requires_grad_(true);
  pow(a, b).sum().backward();
  CHECK(a.grad()[0].item<double>() == 0.0);   // 0 * 0^-1: PyTorch's 0, not NaN
  CHECK(a.grad()[1].item<double>() == 12.0);  // 3 * 2^2
  CHECK(a.grad()[2].item<double>() == 0.0);   // 2 * 0^1
  CHECK(b.grad()[0].item<double>() == 0.0);   // a^b log a at a = 0, b >= 0: 0
  CHECK(b.grad()[1].item<double>() == Approx(8.0 * std::log(2.0)));
}

}  // namespace chorus
