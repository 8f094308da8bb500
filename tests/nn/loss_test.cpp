// Losses against references written here in double from the formulas PyTorch documents:
// cross_entropy (reductions, class weights, ignore_index, label smoothing, spatial targets, huge
// logits), nll_loss, mse_loss, binary_cross_entropy_with_logits; gradcheck of each; and the errors
// bad targets get.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/gradcheck.h"
#include "nn/nn.h"
#include "tensor/ops.h"
#include "tests/nn/reference.h"

namespace chorus {
namespace {

namespace F = nn::functional;
using F::Reduction;
using nn_test::check_close;
using nn_test::doubles;
using nn_test::error_message;

const TensorOptions kF64Grad{.dtype = kFloat64, .requires_grad = true};

std::vector<int64_t> ints(const Tensor& t) {
  Tensor c = t.to(kInt64).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// PyTorch's documented cross entropy over rows of logits x[r, c] (class dim already last):
//   l_r = (1 - eps) * w[y_r] * (-log p[r, y_r]) + eps / C * sum_c w[c] * (-log p[r, c])
// ignored rows give 0; mean divides the sum by sum_r w[y_r] over the rows not ignored.
struct CeReference {
  std::vector<double> per_row;
  double sum = 0, weight_sum = 0;
};
CeReference reference_cross_entropy(const std::vector<double>& x, const std::vector<int64_t>& y, int64_t C,
                                    const std::vector<double>& w, int64_t ignore_index, double eps) {
  CeReference ref;
  for (size_t r = 0; r < y.size(); ++r) {
    if (y[r] == ignore_index) {
      ref.per_row.push_back(0.0);
      continue;
    }
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, x[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[r * C + c] - mx);
    auto neg_logp = [&](int64_t c) { return -(x[r * C + c] - mx - std::log(s)); };
    auto wc = [&](int64_t c) { return w.empty() ? 1.0 : w[c]; };
    double l = (1 - eps) * wc(y[r]) * neg_logp(y[r]);
    for (int64_t c = 0; c < C; ++c) l += eps / C * wc(c) * neg_logp(c);
    ref.per_row.push_back(l);
    ref.sum += l;
    ref.weight_sum += wc(y[r]);
  }
  return ref;
}

// [N, C, d...] -> rows [N*d..., C] in the reference's layout (class dim last).
std::vector<double> classes_last(const Tensor& x) {
  if (x.dim() == 2) return doubles(x);
  std::vector<int64_t> perm{0};
  for (int64_t d = 2; d < x.dim(); ++d) perm.push_back(d);
  perm.push_back(1);
  return doubles(x.permute(perm));
}

TEST_CASE("cross_entropy matches the documented formula for every reduction, weight, ignore_index and smoothing",
          "[nn][loss][cross_entropy]") {
  Generator gen(201);
  const int64_t C = 5;
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Shape& xs : std::vector<Shape>{{7, C}, {3, C, 2, 3}}) {
      Tensor x = randn(xs, {.dtype = dt}, &gen) * 2.0;
      Shape ts{xs[0]};
      for (size_t d = 2; d < xs.size(); ++d) ts.push_back(xs[d]);
      Tensor y = randint(0, C, ts, {.dtype = kInt64}, &gen);
      // Make some targets the ignore_index (-100 by default, 2 in the custom case below).
      std::vector<int64_t> yv = ints(y);
      yv[1] = -100;
      Tensor y_default_ignore = tensor(yv, ts);
      yv[1] = 2;
      yv[3] = 2;
      Tensor y_custom_ignore = tensor(yv, ts);
      Tensor w = rand({C}, {.dtype = dt}, &gen) + 0.5;
      for (bool weighted : {false, true}) {
        for (int64_t ignore : {int64_t{-100}, int64_t{2}}) {
          for (double eps : {0.0, 0.1, 0.35}) {
            for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
              INFO("dtype " << dtype_name(dt) << " dims " << xs.size() << " weighted " << weighted << " ignore "
                            << ignore << " smoothing " << eps << " reduction " << static_cast<int>(red));
              const Tensor& target = ignore == -100 ? y_default_ignore : y_custom_ignore;
              Tensor loss = F::cross_entropy(
                  x, target,
                  {.weight = weighted ? w : Tensor(), .ignore_index = ignore, .label_smoothing = eps, .reduction = red});
              CeReference ref = reference_cross_entropy(classes_last(x), ints(target), C,
                                                        weighted ? doubles(w) : std::vector<double>{}, ignore, eps);
              const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
              CHECK(loss.dtype() == dt);
              if (red == Reduction::None) {
                CHECK(loss.sizes() == ts);
                check_close(loss, ref.per_row, tol);
              } else {
                CHECK(loss.dim() == 0);
                check_close(loss, {red == Reduction::Sum ? ref.sum : ref.sum / ref.weight_sum}, tol);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cross_entropy gradients pass gradcheck with weights, ignore_index and smoothing",
          "[nn][loss][cross_entropy][gradcheck]") {
  Generator gen(202);
  Tensor w = rand({4}, {.dtype = kFloat64}, &gen) + 0.5;
  Tensor y = tensor(std::vector<int64_t>{0, 3, -100, 1, 2});
  Tensor y_spatial = tensor(std::vector<int64_t>{0, 3, 1, -100, 2, 2}, Shape{2, 3});
  for (bool weighted : {false, true}) {
    for (double eps : {0.0, 0.2}) {
      for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        INFO("weighted " << weighted << " smoothing " << eps << " reduction " << static_cast<int>(red));
        F::CrossEntropyOptions opts{.weight = weighted ? w : Tensor(), .label_smoothing = eps, .reduction = red};
        CHECK(autograd::gradcheck([&](const TensorList& in) { return F::cross_entropy(in[0], y, opts); },
                                  {randn({5, 4}, kF64Grad, &gen)}));
        CHECK(autograd::gradcheck([&](const TensorList& in) { return F::cross_entropy(in[0], y_spatial, opts); },
                                  {randn({2, 4, 3}, kF64Grad, &gen)}));
      }
    }
  }
}

TEST_CASE("cross_entropy stays finite and exact with logits of magnitude 1e4", "[nn][loss][cross_entropy]") {
  std::vector<float> xs{1e4f, -1e4f, 0.0f, 9999.0f, -1e4f, 1e4f, 5e3f, -5e3f, -1e4f, -9999.5f, -1e4f, -1e4f};
  Tensor x = tensor(xs, Shape{3, 4}).requires_grad_();
  Tensor y = tensor(std::vector<int64_t>{3, 2, 1});
  Tensor loss = F::cross_entropy(x, y, {.label_smoothing = 0.1, .reduction = Reduction::None});
  std::vector<double> xd(xs.begin(), xs.end());
  CeReference ref = reference_cross_entropy(xd, {3, 2, 1}, 4, {}, -100, 0.1);
  for (double v : doubles(loss)) CHECK(std::isfinite(v));
  check_close(loss, ref.per_row, 1e-5);
  loss.sum().backward();
  for (double g : doubles(x.grad())) CHECK(std::isfinite(g));
  // Row 0's target is 1 logit below the max: -log p = log(1 + e) exactly, not rounded to 0 or 1.
  CHECK(doubles(F::cross_entropy(x.detach().narrow(0, 0, 1), y.narrow(0, 0, 1)))[0] ==
        Approx(std::log1p(std::exp(1.0))).epsilon(1e-5));
}

TEST_CASE("cross_entropy mean over all-ignored targets is NaN, as PyTorch", "[nn][loss][cross_entropy]") {
  Tensor x = randn({2, 3});
  Tensor y = full({2}, -100, {.dtype = kInt64});
  CHECK(std::isnan(F::cross_entropy(x, y).item<double>()));
  CHECK(F::cross_entropy(x, y, {.reduction = Reduction::Sum}).item<double>() == 0.0);
}

TEST_CASE("cross_entropy and nll_loss reject bad targets, shapes and options with clear errors",
          "[nn][loss][errors]") {
  Tensor x = randn({3, 4});
  CHECK_THAT(error_message([&] { F::cross_entropy(x, tensor(std::vector<int64_t>{0, 4, 1})); }),
             Catch::Contains("target 4 is out of bounds for 4 classes"));
  CHECK_THAT(error_message([&] { F::cross_entropy(x, tensor(std::vector<int64_t>{0, -1, 1})); }),
             Catch::Contains("target -1 is out of bounds"));
  CHECK_THAT(error_message([&] { F::nll_loss(x, tensor(std::vector<int64_t>{0, 1, 9})); }),
             Catch::Contains("nll_loss: target 9 is out of bounds"));
  CHECK_THAT(error_message([&] { F::cross_entropy(x, tensor(std::vector<float>{0, 1, 2})); }),
             Catch::Contains("dtype int64") && Catch::Contains("float32"));
  CHECK_THAT(error_message([&] { F::cross_entropy(x, tensor(std::vector<int64_t>{0, 1})); }),
             Catch::Contains("target of shape [2] does not match input of shape [3, 4]"));
  CHECK_THAT(error_message([&] { F::cross_entropy(randn({4}), tensor(std::vector<int64_t>{0})); }),
             Catch::Contains("expected input of shape [N, C]"));
  CHECK_THAT(error_message([&] { F::cross_entropy(x, tensor(std::vector<int64_t>{0, 1, 2}), {.weight = ones({3})}); }),
             Catch::Contains("one entry per class (4)"));
  CHECK_THAT(error_message([&] {
               F::cross_entropy(x, tensor(std::vector<int64_t>{0, 1, 2}), {.label_smoothing = 1.5});
             }),
             Catch::Contains("label_smoothing must be in [0, 1]"));
  CHECK_THAT(error_message([&] { F::mse_loss(x, randn({4, 3})); }), Catch::Contains("must have the same shape"));
  CHECK_THAT(error_message([&] { F::binary_cross_entropy_with_logits(x, rand({3})); }),
             Catch::Contains("target size [3] must be the same as input size [3, 4]"));
}

// ------------------------------------------------------------------ nll_loss
TEST_CASE("nll_loss picks -w[y] * input[y], mean over the summed weights; equals cross_entropy of log_softmax",
          "[nn][loss][nll]") {
  Generator gen(211);
  Tensor logp = F::log_softmax(randn({6, 4}, {.dtype = kFloat64}, &gen), 1);
  Tensor y = tensor(std::vector<int64_t>{1, 0, 3, -100, 3, 2});
  Tensor w = tensor(std::vector<double>{0.5, 2.0, 1.0, 1.5});
  std::vector<double> lp = doubles(logp), wv = doubles(w), per;
  double s = 0, ws = 0;
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t t = ints(y)[r];
    double l = t == -100 ? 0.0 : -wv[t] * lp[r * 4 + t];
    per.push_back(l);
    s += l;
    ws += t == -100 ? 0.0 : wv[t];
  }
  check_close(F::nll_loss(logp, y, {.weight = w, .reduction = Reduction::None}), per, 1e-14);
  check_close(F::nll_loss(logp, y, {.weight = w, .reduction = Reduction::Sum}), {s}, 1e-14);
  check_close(F::nll_loss(logp, y, {.weight = w}), {s / ws}, 1e-14);
  Tensor logits = randn({2, 4, 3}, {.dtype = kFloat64}, &gen);
  Tensor ys = tensor(std::vector<int64_t>{0, 1, 2, 3, -100, 1}, Shape{2, 3});
  check_close(F::nll_loss(F::log_softmax(logits, 1), ys), doubles(F::cross_entropy(logits, ys)), 1e-13);
  CHECK(F::nll_loss(F::log_softmax(logits, 1), ys, {.reduction = Reduction::None}).sizes() == Shape{2, 3});
  CHECK(autograd::gradcheck(
      [&](const TensorList& in) { return F::nll_loss(in[0], y, {.weight = w}); }, {randn({6, 4}, kF64Grad, &gen)}));
  CHECK(autograd::gradcheck([&](const TensorList& in) { return F::nll_loss(in[0], ys); },
                            {randn({2, 4, 3}, kF64Grad, &gen)}));
}

// ------------------------------------------------------------------ mse_loss
TEST_CASE("mse_loss matches (x - y)^2 for each reduction and passes gradcheck", "[nn][loss][mse]") {
  Generator gen(221);
  Tensor x = randn({3, 5}, {.dtype = kFloat64}, &gen), y = randn({3, 5}, {.dtype = kFloat64}, &gen);
  std::vector<double> xv = doubles(x), yv = doubles(y), sq;
  double s = 0;
  for (size_t i = 0; i < xv.size(); ++i) sq.push_back((xv[i] - yv[i]) * (xv[i] - yv[i])), s += sq.back();
  check_close(F::mse_loss(x, y, Reduction::None), sq, 1e-14);
  check_close(F::mse_loss(x, y, Reduction::Sum), {s}, 1e-14);
  check_close(F::mse_loss(x, y), {s / 15}, 1e-14);
  CHECK(autograd::gradcheck([](const TensorList& in) { return F::mse_loss(in[0], in[1]); },
                            {x.clone().requires_grad_(), y.clone().requires_grad_()}));
}

// ------------------------------------------------------------------ binary_cross_entropy_with_logits
// -[pw y log s(x) + (1 - y) log(1 - s(x))], with log s(x) = -log1p(exp(-x)) written stably.
double reference_bce(double x, double y, double pw) {
  auto log_sigmoid = [](double v) { return v >= 0 ? -std::log1p(std::exp(-v)) : v - std::log1p(std::exp(v)); };
  return -(pw * y * log_sigmoid(x) + (1 - y) * log_sigmoid(-x));
}

TEST_CASE("binary_cross_entropy_with_logits matches the reference, with pos_weight, for each reduction",
          "[nn][loss][bce]") {
  Generator gen(231);
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = randn({4, 3}, {.dtype = dt}, &gen) * 3.0;
    Tensor y = rand({4, 3}, {.dtype = dt}, &gen);  // soft targets in [0, 1)
    Tensor pw = tensor(std::vector<double>{0.5, 1.0, 3.0}).to(dt);
    for (bool with_pw : {false, true}) {
      INFO("dtype " << dtype_name(dt) << " pos_weight " << with_pw);
      std::vector<double> xv = doubles(x), yv = doubles(y), expected;
      double s = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        expected.push_back(reference_bce(xv[i], yv[i], with_pw ? doubles(pw)[i % 3] : 1.0));
        s += expected.back();
      }
      const Tensor p = with_pw ? pw : Tensor();
      const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
      check_close(F::binary_cross_entropy_with_logits(x, y, Reduction::None, p), expected, tol);
      check_close(F::binary_cross_entropy_with_logits(x, y, Reduction::Sum, p), {s}, tol);
      check_close(F::binary_cross_entropy_with_logits(x, y, Reduction::Mean, p), {s / 12}, tol);
    }
  }
}

TEST_CASE("binary_cross_entropy_with_logits is stable at large logits", "[nn][loss][bce]") {
  Tensor x = tensor(std::vector<float>{100.f, -100.f, 100.f, -100.f, 1e4f, -1e4f, 0.f}).requires_grad_();
  Tensor y = tensor(std::vector<float>{1.f, 0.f, 0.f, 1.f, 1.f, 1.f, 1.f});
  Tensor loss = F::binary_cross_entropy_with_logits(x, y, Reduction::None);
  // Confident and right: ~exp(-100), not 0 - 0 = NaN; confident and wrong: exactly |x|.
  check_close(loss, {std::exp(-100.0), std::exp(-100.0), 100.0, 100.0, 0.0, 1e4, std::log(2.0)}, 1e-6);
  loss.sum().backward();
  // d/dx = sigmoid(x) - y.
  check_close(x.grad(), {0.0, 0.0, 1.0, -1.0, 0.0, -1.0, -0.5}, 1e-6);
}

TEST_CASE("binary_cross_entropy_with_logits gradients of input and target pass gradcheck", "[nn][loss][bce][gradcheck]") {
  Generator gen(232);
  Tensor pw = tensor(std::vector<double>{0.5, 2.0, 1.5});
  for (bool with_pw : {false, true}) {
    for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      INFO("pos_weight " << with_pw << " reduction " << static_cast<int>(red));
      Tensor x = randn({4, 3}, kF64Grad, &gen);
      Tensor y = rand({4, 3}, kF64Grad, &gen);
      CHECK(autograd::gradcheck(
          [&](const TensorList& in) {
            return F::binary_cross_entropy_with_logits(in[0], in[1], red, with_pw ? pw : Tensor());
          },
          {x, y}));
    }
  }
  // At x = 0 exactly (where |x| has a kink inside the stable formula), the gradient is s(0) - y.
  Tensor x0 = zeros({2}, kF64Grad);
  F::binary_cross_entropy_with_logits(x0, tensor(std::vector<double>{0.0, 1.0}), Reduction::Sum).backward();
  check_close(x0.grad(), {0.5, -0.5}, 1e-15);
}

}  // namespace
}  // namespace chorus
