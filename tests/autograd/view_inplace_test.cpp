// In-place ops on views under autograd (PyTorch's CopySlices): the base's history is rebased so
// that gradients read through the base, the modified view and every other view of the same memory
// are exact; gradcheck in float64 on random inputs for each pattern (narrow/select/t/slice, views of
// views, overlapping writes, div_ by a tensor that requires grad); and the refusals for leaves and
// views of leaves, with their messages.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/gradcheck.h"
#include "tests/autograd/autograd_testing.h"

namespace chorus {
namespace {

using autograd::gradcheck;
using testing::error_containing;
using testing::leaf;
using testing::leaf_from;
using testing::same_values;
using testing::Values;
using L = const TensorList&;

Tensor f64(std::vector<double> values, Shape shape) { return tensor(values, shape); }

// Both the base and a view of it in one output, so gradcheck checks the gradients through each.
Tensor base_and_view(const Tensor& base, const Tensor& view) { return cat({base.reshape({-1}), view.reshape({-1})}); }

}  // namespace

TEST_CASE("in-place ops on views of non-leaves pass gradcheck", "[autograd][inplace][view]") {
  Generator gen(20260511);
  struct Row {
    std::string name;
    TensorList inputs;
    std::function<Tensor(L)> f;
  };
  const std::vector<Row> rows = {
      {"narrow(0).mul_(w), w requires grad", {leaf({4, 3}, gen), leaf({2, 3}, gen)},
       [](L x) {
         Tensor y = x[0] * 1.5;
         Tensor v = y.narrow(0, 1, 2);
         v.mul_(x[1]);
         return base_and_view(y * y, v);
       }},
      {"narrow(1).mul_(w) with a broadcast w", {leaf({3, 5}, gen), leaf({1, 2}, gen)},
       [](L x) {
         Tensor y = x[0] * 2.0 - 1.0;  // not exp(): it saves its result, which mul_ overwrites
         y.narrow(1, 2, 2).mul_(x[1]);
         return y;
       }},
      {"select().fill_(scalar)", {leaf({3, 4}, gen)},
       [](L x) {
         Tensor y = x[0] * 2.0;
         y.select(0, 1).fill_(3.0);
         return y * x[0];
       }},
      {"select().fill_(0-d tensor that requires grad)", {leaf({3, 4}, gen), leaf({}, gen)},
       [](L x) {
         Tensor y = x[0] * x[0];
         y.select(1, 2).fill_(x[1]);
         return y * x[0];
       }},
      {"t().add_(other, alpha)", {leaf({3, 4}, gen), leaf({4, 3}, gen)},
       [](L x) {
         Tensor y = x[0] * x[0];
         y.t().add_(x[1], -0.5);
         return y;
       }},
      {"slice with a step, copy_(src that requires grad)", {leaf({3, 6}, gen), leaf({3, 2}, gen)},
       [](L x) {
         Tensor y = x[0].sin();
         y.slice(1, 1, 6, 3).copy_(x[1]);
         return y * y;
       }},
      {"copy_ of a broadcast src into a view", {leaf({4, 3}, gen), leaf({3}, gen)},
       [](L x) {
         Tensor y = x[0] + 0.0;
         y.narrow(0, 2, 2).copy_(x[1]);
         return y.exp();
       }},
      {"masked_fill_ and clamp_ on views", {leaf({4, 4}, gen)},
       [](L x) {
         const Tensor mask = tensor<bool>({true, false, false, true, false, true, true, false}, Shape{2, 4});
         Tensor y = x[0] * 3.0;
         y.narrow(0, 1, 2).masked_fill_(mask, 0.25);
         y.select(1, 3).clamp_(-1.0, 1.0);
         return y * x[0];
       }},
      {"in-place unary methods on a view", {leaf({3, 4}, gen)},
       [](L x) {
         Tensor y = x[0] * 1.0;
         y.select(0, 2).tanh_();
         y.narrow(1, 0, 2).exp_();
         return y;
       }},
      {"a view of a view of a view", {leaf({4, 5}, gen), leaf({2}, gen)},
       [](L x) {
         Tensor y = x[0] * 1.0;
         Tensor v = y.t().narrow(0, 1, 3).select(1, 2).narrow(0, 1, 2);  // y[2, 2:4]
         v.mul_(x[1]);
         return base_and_view(y, v);
       }},
      {"two overlapping in-place ops on different views", {leaf({4, 3}, gen), leaf({2, 3}, gen), leaf({3, 2}, gen)},
       [](L x) {
         Tensor y = x[0] * 1.0;
         Tensor rows = y.narrow(0, 0, 2);
         Tensor cols = y.narrow(1, 1, 2);
         rows.mul_(x[1]);
         cols.narrow(0, 1, 3).add_(cols.narrow(0, 1, 3).clone() * x[2]);  // reads the rows' result
         // `rows` was written again through `cols`: its history is derived anew from y's.
         return cat({y.reshape({-1}), rows.reshape({-1}), cols.reshape({-1})});
       }},
      {"a view read after its base was modified in place", {leaf({3, 3}, gen), leaf({3, 3}, gen)},
       [](L x) {
         Tensor y = x[0] * 1.0;
         Tensor v = y.select(0, 1);
         y.mul_(x[1]);
         return v * 2.0;
       }},
      {"in-place on the base's clone does not touch the view", {leaf({3, 3}, gen), leaf({3, 3}, gen)},
       [](L x) {
         Tensor y = x[0] * 1.0;
         Tensor v = y.narrow(0, 0, 2);
         Tensor c = y.clone();
         c.mul_(x[1]);
         return base_and_view(c, v);
       }},
      {"div_ by a tensor that requires grad", {leaf({3, 4}, gen), leaf({3, 4}, gen, Values::AwayFromZero)},
       [](L x) {
         Tensor c = x[0] * 1.0;
         c.div_(x[1]);
         return c * x[0];
       }},
      {"div_ by a broadcast 0-d tensor that requires grad", {leaf({3, 4}, gen), leaf({}, gen, Values::Positive)},
       [](L x) {
         Tensor c = x[0] * 3.0;
         c.div_(x[1]);
         return c;
       }},
      {"div_ of a view by a tensor that requires grad", {leaf({4, 4}, gen), leaf({4}, gen, Values::AwayFromZero)},
       [](L x) {
         Tensor y = x[0] * x[0];
         Tensor v = y.select(1, 1);
         v.div_(x[1]);
         return base_and_view(y, v);
       }},
      // split's pieces share one SplitBackward: a write to one piece rebases it (and, through the
      // version counter, the pieces read afterwards) onto the base's history.
      {"chunk: mul_ on one piece, the others read after", {leaf({6, 3}, gen), leaf({2, 3}, gen)},
       [](L x) {
         Tensor y = x[0] * 2.0;
         TensorList p = chunk(y, 3, 0);
         p[1].mul_(x[1]);
         return cat({(p[0] * p[1]).reshape({-1}), p[2].exp().reshape({-1}), y.reshape({-1})});
       }},
      {"split sizes {1,3}: a piece used before the write and after it", {leaf({3, 4}, gen), leaf({3, 1}, gen)},
       [](L x) {
         Tensor y = x[0].sin();
         TensorList p = split(y, std::vector<int64_t>{1, 3}, 1);
         Tensor before = p[0] + p[1];  // add saves neither operand: the write is allowed
         p[0].add_(x[1]);
         return cat({before.reshape({-1}), (p[0] * p[1]).reshape({-1})});
       }},
  };
  for (const Row& row : rows) {
    INFO(row.name);
    CHECK(gradcheck(row.f, row.inputs));
  }
}

TEST_CASE("in-place ops on views give the sim device the CPU's gradients", "[autograd][inplace][view]") {
  Generator gen(4242);
  const Tensor x0 = testing::random_values({4, 3}, Values::Any, gen);
  const Tensor w0 = testing::random_values({2, 3}, Values::Any, gen);
  const Tensor s0 = testing::random_values({}, Values::Positive, gen);
  auto gradients = [&](Device device) {
    // clone(): to(kCPU) returns the tensor itself, which must stay without grad for the next run.
    Tensor x = x0.to(device).clone(), w = w0.to(device).clone(), s = s0.to(device).clone();
    for (Tensor* t : {&x, &w, &s}) t->requires_grad_();
    Tensor y = x * 1.0;
    Tensor rows = y.narrow(0, 1, 2);
    rows.mul_(w);
    y.t().select(0, 2).div_(s);  // column 2, overlapping the rows
    y.select(0, 0).fill_(s);
    ((y * y).sum() + (rows * rows).sum()).backward();
    return TensorList{x.grad().cpu(), w.grad().cpu(), s.grad().cpu()};
  };
  const TensorList cpu = gradients(kCPU);
  const TensorList sim = gradients(Device::sim(0));
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("input " << i);
    CHECK(same_values(sim[i], cpu[i]));
  }
}

TEST_CASE("the base's gradient after an in-place op on a view is exact", "[autograd][inplace][view]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {3, 2});
  Tensor y = x * 1.0;
  Tensor v = y.select(0, 0);
  v.mul_(2.0);
  CHECK(same_values(y, f64({2.0, 4.0, 3.0, 4.0, 5.0, 6.0}, {3, 2})));
  CHECK(y.grad_fn()->name() == "CopySlices");
  CHECK(v.grad_fn()->name() == "AsStridedBackward");
  (y * y).sum().backward();
  // d/dx sum(y^2) = 2 y dy/dx: 2 * (2x) * 2 on row 0, 2x elsewhere.
  CHECK(same_values(x.grad(), f64({8.0, 16.0, 6.0, 8.0, 10.0, 12.0}, {3, 2})));
}

TEST_CASE("a view of a tensor that does not require grad picks up an operand's history",
          "[autograd][inplace][view]") {
  Tensor w = leaf_from({10.0, 20.0}, {2});
  Tensor base = zeros({4}, {.dtype = kFloat64});
  Tensor other = base.narrow(0, 0, 3);  // made before the write; overlaps it
  Tensor v = base.slice(0, 1, 4, 2);    // elements 1 and 3
  CHECK_FALSE(other.requires_grad());
  v.add_(w);
  CHECK(same_values(base, f64({0.0, 10.0, 0.0, 20.0}, {4})));
  CHECK(base.requires_grad());
  CHECK_FALSE(base.is_leaf());
  CHECK(v.requires_grad());
  CHECK(other.requires_grad());  // re-derived from the base when read
  (other * other).sum().backward();
  CHECK(same_values(w.grad(), f64({20.0, 0.0}, {2})));

  SECTION("gradcheck of the operand") {
    CHECK(gradcheck(
        [](L x) {
          Tensor b = zeros({3, 4}, {.dtype = kFloat64});
          Tensor early = b.select(1, 0);
          b.narrow(1, 0, 2).copy_(x[0]);
          b.select(0, 2).mul_(x[1]);
          return base_and_view(b * b, early);
        },
        {leaf_from({0.5, -1.0, 2.0, 0.25, 1.5, -0.75}, {3, 2}), leaf_from({2.0, -3.0, 0.5, 4.0}, {4})}));
  }
}

TEST_CASE("in-place ops on views of leaves that require grad are refused, data untouched",
          "[autograd][inplace][view]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3});
  Tensor w = leaf_from({10.0, 20.0}, {2});
  const uint32_t version = x.version();
  const std::vector<std::pair<std::string, std::function<void()>>> ops = {
      {"mul_", [&] { x.narrow(1, 1, 2).mul_(2.0); }},
      {"add_", [&] { x.select(1, 0).add_(w); }},
      {"div_", [&] { x.select(1, 0).div_(w); }},
      {"copy_", [&] { x.t().select(0, 2).copy_(w); }},
      {"fill_", [&] { x.select(0, 1).fill_(0.0); }},
      {"fill_", [&] { x.view({6}).fill_(tensor<double>({1.0}, Shape{})); }},
      {"masked_fill_", [&] { x.select(0, 0).masked_fill_(tensor<bool>({true, false, true}), 0.0); }},
      {"clamp_", [&] { x.narrow(0, 0, 1).clamp_(0.0, 1.0); }},
      {"copy_", [&] { x.narrow(0, 0, 1).exp_(); }},
  };
  for (const auto& [name, op] : ops) {
    INFO(name);
    REQUIRE_THROWS_MATCHES(op(), Error,
                           error_containing({name, "a view of a leaf tensor that requires grad",
                                             "in-place operation", "NoGradGuard"}));
  }
  CHECK(same_values(x, f64({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3})));
  CHECK(x.version() == version);
  SECTION("the leaf itself is refused as before") {
    REQUIRE_THROWS_MATCHES(x.mul_(2.0), Error, error_containing({"mul_", "a leaf tensor that requires grad"}));
  }
  SECTION("under NoGradGuard the view is written through and the leaf stays a leaf") {
    {
      NoGradGuard no_grad;
      x.narrow(1, 0, 1).mul_(10.0);
    }
    CHECK(x.is_leaf());
    CHECK(same_values(x, f64({10.0, 2.0, 3.0, 40.0, 5.0, 6.0}, {2, 3})));
  }
}

TEST_CASE("a view detached in place stays without history after writes to its base", "[autograd][inplace][view]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor y = x * 1.0;
  Tensor v = y.narrow(0, 0, 2);
  v.detach_();
  y.mul_(2.0);
  CHECK_FALSE(v.requires_grad());
  CHECK(v.grad_fn() == nullptr);
  CHECK(same_values(v, f64({2.0, 4.0}, {2})));
}

TEST_CASE("an in-place op with history on an expanded view is refused", "[autograd][inplace][view]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor y = x * 1.0;
  Tensor e = y.narrow(0, 0, 1).expand({4});
  REQUIRE_THROWS_MATCHES(e.mul_(2.0), Error, error_containing({"mul_", "single memory location", "clone()"}));
  CHECK(same_values(y, f64({1.0, 2.0, 3.0}, {3})));
}

TEST_CASE("a custom Function cannot mark a view dirty", "[autograd][inplace][view]") {
  struct Double : autograd::Function<Double> {
    static Tensor forward(autograd::AutogradContext* ctx, Tensor t) {
      t.mul_(2.0);
      ctx->mark_dirty({t});
      return t;
    }
    static TensorList backward(autograd::AutogradContext*, TensorList g) { return {g[0] * 2.0}; }
  };
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor y = x * 1.0;
  REQUIRE_THROWS_MATCHES(Double::apply(y.narrow(0, 0, 2)), Error, error_containing({"mark_dirty", "view", "clone()"}));
}

}  // namespace chorus
