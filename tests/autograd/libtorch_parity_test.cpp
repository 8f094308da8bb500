// In-place ops on views (CopySlices) and div_ by a tensor that requires grad, against libtorch 1.13
// (Debian's libtorch-dev, linked here) on the same random float64 inputs: the values and the
// gradients of sum(out * g) for every input, through the base and through the views.
#include "tests/libtorch_testing.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace {

using chorus::Tensor;
using CFn = std::function<Tensor(const chorus::TensorList&)>;
using TFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

using chorus::testing::max_diff;
using chorus::testing::to_torch;

struct Case {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  CFn chorus_fn;
  TFn torch_fn;
};

void check(const Case& c) {
  INFO(c.name);
  chorus::manual_seed(77);
  chorus::TensorList in;
  std::vector<torch::Tensor> tin;
  for (const auto& s : c.shapes) {
    // In [0.5, 2) with a random sign: fine as a divisor.
    Tensor magnitude = chorus::add(chorus::mul(chorus::rand(s, {.dtype = chorus::kFloat64}), 1.5), 0.5);
    Tensor coin = chorus::lt(chorus::rand(s, {.dtype = chorus::kFloat64}), 0.5).to(chorus::kFloat64);
    Tensor sign = chorus::sub(chorus::mul(coin, 2.0), 1.0);
    Tensor x = chorus::mul(magnitude, sign);
    tin.push_back(to_torch(x).requires_grad_());
    in.push_back(x.requires_grad_());
  }
  const Tensor out = c.chorus_fn(in);
  const torch::Tensor tout = c.torch_fn(tin);
  CHECK(max_diff(out, tout) < 1e-12);
  const Tensor g = chorus::randn(out.sizes(), {.dtype = chorus::kFloat64});
  chorus::sum(chorus::mul(out, g)).backward();
  (tout * to_torch(g)).sum().backward();
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("gradient of input " << i);
    REQUIRE(tin[i].grad().defined());
    REQUIRE(in[i].grad().defined());
    CHECK(max_diff(in[i].grad(), tin[i].grad()) < 1e-12);
  }
}

}  // namespace

TEST_CASE("in-place ops on views and div_ by a tensor that requires grad equal libtorch 1.13's",
          "[autograd][inplace][view][libtorch]") {
  torch::set_num_threads(1);
  namespace c = chorus;
  using L = const c::TensorList&;
  using T = const std::vector<torch::Tensor>&;
  const std::vector<Case> cases = {
      {"narrow().mul_(w)", {{4, 3}, {2, 3}},
       [](L x) {
         Tensor y = c::mul(x[0], 2.0);
         y.narrow(0, 1, 2).mul_(x[1]);
         return c::mul(y, y);
       },
       [](T x) {
         torch::Tensor y = x[0] * 2.0;
         y.narrow(0, 1, 2).mul_(x[1]);
         return y * y;
       }},
      {"select().fill_(0-d tensor)", {{3, 4}, {}},
       [](L x) {
         Tensor y = c::mul(x[0], x[0]);
         y.select(1, 2).fill_(x[1]);
         return c::mul(y, x[0]);
       },
       [](T x) {
         torch::Tensor y = x[0] * x[0];
         y.select(1, 2).fill_(x[1]);
         return y * x[0];
       }},
      {"t().add_(y, alpha)", {{3, 4}, {4, 3}},
       [](L x) {
         Tensor y = c::mul(x[0], 1.0);
         y.t().add_(x[1], 0.75);
         return c::mul(y, x[0]);
       },
       [](T x) {
         torch::Tensor y = x[0] * 1.0;
         y.t().add_(x[1], 0.75);
         return y * x[0];
       }},
      {"slice(step).copy_(src)", {{3, 6}, {3, 2}},
       [](L x) {
         Tensor y = c::add(x[0], 1.0);
         y.slice(1, 1, 6, 3).copy_(x[1]);
         return c::mul(y, y);
       },
       [](T x) {
         torch::Tensor y = x[0] + 1.0;
         y.slice(1, 1, 6, 3).copy_(x[1]);
         return y * y;
       }},
      {"two overlapping views, an earlier view read afterwards", {{4, 3}, {2, 3}, {3, 2}},
       [](L x) {
         Tensor y = c::mul(x[0], 1.0);
         Tensor rows = y.narrow(0, 0, 2);
         Tensor cols = y.narrow(1, 1, 2);
         rows.mul_(x[1]);
         cols.narrow(0, 1, 3).add_(c::mul(cols.narrow(0, 1, 3).clone(), x[2]));
         return c::cat({c::mul(y, y).reshape({-1}), rows.reshape({-1})});
       },
       [](T x) {
         torch::Tensor y = x[0] * 1.0;
         torch::Tensor rows = y.narrow(0, 0, 2);
         torch::Tensor cols = y.narrow(1, 1, 2);
         rows.mul_(x[1]);
         cols.narrow(0, 1, 3).add_(cols.narrow(0, 1, 3).clone() * x[2]);
         return torch::cat({(y * y).reshape({-1}), rows.reshape({-1})});
       }},
      {"div_ by a tensor", {{3, 4}, {4}},
       [](L x) {
         Tensor y = c::mul(x[0], x[0]);
         y.div_(x[1]);
         return c::mul(y, x[0]);
       },
       [](T x) {
         torch::Tensor y = x[0] * x[0];
         y.div_(x[1]);
         return y * x[0];
       }},
      {"select().div_(w) on a view", {{4, 4}, {4}},
       [](L x) {
         Tensor y = c::mul(x[0], 3.0);
         Tensor v = y.select(1, 1);
         v.div_(x[1]);
         return c::cat({y.reshape({-1}), v});
       },
       [](T x) {
         torch::Tensor y = x[0] * 3.0;
         torch::Tensor v = y.select(1, 1);
         v.div_(x[1]);
         return torch::cat({y.reshape({-1}), v});
       }},
      {"a view of a tensor without grad, written with src that requires grad", {{2, 3}, {3}},
       [](L x) {
         Tensor b = c::zeros({3, 3}, {.dtype = c::kFloat64});
         Tensor early = b.select(1, 0);
         b.narrow(0, 0, 2).copy_(x[0]);
         b.select(0, 2).mul_(x[1]);
         b.select(0, 2).add_(x[1]);
         return c::cat({c::mul(b, b).reshape({-1}), early});
       },
       [](T x) {
         torch::Tensor b = torch::zeros({3, 3}, torch::kFloat64);
         torch::Tensor early = b.select(1, 0);
         b.narrow(0, 0, 2).copy_(x[0]);
         b.select(0, 2).mul_(x[1]);
         b.select(0, 2).add_(x[1]);
         return torch::cat({(b * b).reshape({-1}), early});
       }},
  };
  for (const Case& one : cases) check(one);
}
