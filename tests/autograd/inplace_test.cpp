// In-place ops under autograd: the rules (no in-place on a leaf that requires grad in grad mode;
// in-place with history on a view rebases its base, see also view_inplace_test.cpp), the version counter
// that turns "a saved value was overwritten" into an error naming the op instead of a wrong
// gradient, and the gradients of in-place ops on non-leaves (add_, mul_, copy_, fill_, ...).
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "tests/autograd/autograd_testing.h"

namespace chorus {
namespace {

using testing::error_containing;
using testing::leaf_from;
using testing::same_values;

Tensor f64(std::vector<double> values, Shape shape) { return tensor(values, shape); }

}  // namespace

TEST_CASE("in-place ops on a leaf that requires grad are refused in grad mode, data untouched",
          "[autograd][inplace]") {
  Tensor x = leaf_from({1.0, -2.0, 3.0}, {3});
  const uint32_t version = x.version();
  const Tensor other = f64({5.0, 5.0, 5.0}, {3});
  const Tensor mask = tensor<bool>({true, false, true});
  const std::vector<std::pair<std::string, std::function<void()>>> ops = {
      {"add_", [&] { x.add_(other); }},
      {"add_", [&] { x.add_(1.0); }},
      {"sub_", [&] { x.sub_(other); }},
      {"mul_", [&] { x.mul_(2.0); }},
      {"div_", [&] { x.div_(other); }},
      {"clamp_", [&] { x.clamp_(0.0, 1.0); }},
      {"masked_fill_", [&] { x.masked_fill_(mask, 0.0); }},
      {"copy_", [&] { x.copy_(other); }},
      {"fill_", [&] { x.fill_(7.0); }},
      {"fill_", [&] { x.zero_(); }},
  };
  for (const auto& [name, op] : ops) {
    INFO(name);
    REQUIRE_THROWS_MATCHES(op(), Error, error_containing({name, "leaf tensor that requires grad", "NoGradGuard"}));
    CHECK(same_values(x, f64({1.0, -2.0, 3.0}, {3})));
  }
  CHECK(x.version() == version);
}

TEST_CASE("under NoGradGuard a leaf is updated in place and stays a leaf", "[autograd][inplace]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  (x * x).sum().backward();
  const uint32_t before = x.version();
  {
    NoGradGuard no_grad;
    x.sub_(x.grad(), 0.5);  // an SGD step
  }
  CHECK(x.version() == before + 1);
  CHECK(same_values(x, f64({0.0, 0.0}, {2})));
  CHECK(x.is_leaf());
  CHECK(x.requires_grad());
  CHECK(x.grad_fn() == nullptr);
  x.mutable_grad() = Tensor();
  (x * 3.0).sum().backward();
  CHECK(same_values(x.grad(), f64({3.0, 3.0}, {2})));
}

TEST_CASE("the version counter counts in-place writes and is shared by views", "[autograd][inplace]") {
  Tensor base = zeros({2, 3}, {.dtype = kFloat64});
  Tensor row = base.select(0, 1);
  const uint32_t v0 = base.version();
  row.add_(1.0);
  CHECK(base.version() == v0 + 1);
  CHECK(row.version() == v0 + 1);
  base.mul_(2.0);
  CHECK(row.version() == v0 + 2);
  Tensor out_of_place = base * 2.0 + row;
  CHECK(base.version() == v0 + 2);
  CHECK(out_of_place.version() == 0);
  CHECK(same_values(base, f64({0, 0, 0, 2, 2, 2}, {2, 3})));
}

TEST_CASE("overwriting a value saved for backward raises the version error naming the op", "[autograd][inplace]") {
  struct Case {
    std::string op;
    std::function<Tensor(const Tensor& x, Tensor& saved)> build;  // returns a scalar loss
  };
  const std::vector<Case> cases = {
      {"exp", [](const Tensor& x, Tensor& saved) { saved = exp(x); return (saved * 1.0).sum(); }},
      {"tanh", [](const Tensor& x, Tensor& saved) { saved = tanh(x); return saved.sum(); }},
      {"sigmoid", [](const Tensor& x, Tensor& saved) { saved = sigmoid(x); return saved.sum(); }},
      {"sqrt", [](const Tensor& x, Tensor& saved) { saved = sqrt(x); return saved.sum(); }},
      {"mul", [](const Tensor& x, Tensor& saved) { saved = x * 2.0; return (saved * x).sum(); }},
      {"div", [](const Tensor& x, Tensor& saved) { saved = x + 1.0; return (x / saved).sum(); }},
      {"pow", [](const Tensor& x, Tensor& saved) { saved = x * 1.0; return pow(saved, 3.0).sum(); }},
      {"log", [](const Tensor& x, Tensor& saved) { saved = x + 1.0; return log(saved).sum(); }},
      {"relu", [](const Tensor& x, Tensor& saved) { saved = relu(x); return saved.sum(); }},
      {"mm", [](const Tensor& x, Tensor& saved) { saved = x.view({1, 3}) * 1.0; return mm(saved, x.view({3, 1})).sum(); }},
      {"softmax", [](const Tensor& x, Tensor& saved) { saved = softmax(x, 0); return (saved * 2.0).sum(); }},
  };
  for (const Case& c : cases) {
    INFO(c.op);
    Tensor x = leaf_from({0.5, 1.0, 2.0}, {3});
    Tensor saved;
    Tensor loss = c.build(x, saved);
    saved.add_(1.0);
    REQUIRE_THROWS_MATCHES(loss.backward(), Error,
                           error_containing({"modified by an inplace operation", "saved by " + c.op, "version"}));
  }
}

TEST_CASE("writing through a detached alias is caught too", "[autograd][inplace]") {
  Tensor x = leaf_from({0.5, 1.0}, {2});
  Tensor y = exp(x);
  y.detach().mul_(0.0);  // no history, but the same storage
  REQUIRE_THROWS_MATCHES(y.sum().backward(), Error, error_containing({"saved by exp"}));

  // A leaf modified under NoGradGuard after being saved.
  Tensor w = leaf_from({1.0, 2.0}, {2});
  Tensor loss = (w * w).sum();
  {
    NoGradGuard no_grad;
    w.add_(1.0);
  }
  REQUIRE_THROWS_MATCHES(loss.backward(), Error, error_containing({"saved by mul"}));
}

TEST_CASE("an in-place op whose other operand aliases self raises instead of using overwritten values",
          "[autograd][inplace]") {
  // a.mul_(a): the gradient needs a's old value as `other`, but the write replaced it.
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor a = x * 1.0;
  a.mul_(a);
  REQUIRE_THROWS_MATCHES(a.sum().backward(), Error, error_containing({"modified by an inplace operation", "mul_"}));

  // Dividing by a detached alias of self: other needs no grad, yet self's gradient 1/other does.
  Tensor b = x + 1.0;
  b.div_(b.detach());
  REQUIRE_THROWS_MATCHES(b.sum().backward(), Error, error_containing({"modified by an inplace operation", "div_"}));
}

TEST_CASE("an index modified after the op raises instead of routing the gradient wrongly", "[autograd][inplace]") {
  SECTION("gather") {
    Tensor x = leaf_from({1.0, 2.0, 3.0, 4.0}, {2, 2});
    Tensor idx = tensor<int64_t>({1, 0}, Shape{2, 1});
    Tensor y = gather(x, 1, idx);
    idx.fill_(0);
    REQUIRE_THROWS_MATCHES(y.sum().backward(), Error, error_containing({"modified by an inplace operation", "gather"}));
  }
  SECTION("scatter") {
    Tensor x = leaf_from({1.0, 2.0, 3.0, 4.0}, {2, 2});
    Tensor src = leaf_from({9.0, 8.0}, {2, 1});
    Tensor idx = tensor<int64_t>({1, 0}, Shape{2, 1});
    Tensor y = scatter(x, 1, idx, src);
    idx.fill_(0);
    REQUIRE_THROWS_MATCHES(y.sum().backward(), Error, error_containing({"modified by an inplace operation", "scatter"}));
  }
  SECTION("max(dim) indices") {
    Tensor x = leaf_from({1.0, 5.0, 3.0, 2.0}, {2, 2});
    auto [values, indices] = max(x, 1);
    indices.fill_(0);
    REQUIRE_THROWS_MATCHES(values.sum().backward(), Error, error_containing({"modified by an inplace operation", "max"}));
  }
  SECTION("masked_fill_ mask") {
    Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
    Tensor mask = tensor<bool>({true, false, true});
    Tensor c = x * 2.0;
    c.masked_fill_(mask, 0.0);
    mask.fill_(false);
    REQUIRE_THROWS_MATCHES(c.sum().backward(), Error,
                           error_containing({"modified by an inplace operation", "masked_fill_"}));
  }
}

TEST_CASE("an in-place op with history on a view rebases the base's history", "[autograd][inplace]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0, 4.0}, {4});
  Tensor w = leaf_from({10.0, 20.0}, {2});
  SECTION("a view of a non-leaf") {
    Tensor base = x * 1.0;
    Tensor v = base.narrow(0, 1, 2);
    v.add_(w);
    CHECK(base.grad_fn()->name() == "CopySlices");
    CHECK(same_values(base, f64({1.0, 12.0, 23.0, 4.0}, {4})));
    (base * base).sum().backward();
    CHECK(same_values(w.grad(), f64({24.0, 46.0}, {2})));
    CHECK(same_values(x.grad(), f64({2.0, 24.0, 46.0, 8.0}, {4})));
  }
  SECTION("a view of a plain tensor, with an operand that requires grad") {
    Tensor base = zeros({4}, {.dtype = kFloat64});
    Tensor v = base.slice(0, 0, 4, 2);
    v.add_(w);
    CHECK(base.requires_grad());
    CHECK(same_values(base, f64({10.0, 0.0, 20.0, 0.0}, {4})));
    (base * 3.0).sum().backward();
    CHECK(same_values(w.grad(), f64({3.0, 3.0}, {2})));
  }
  SECTION("cloning the view first leaves the base alone") {
    Tensor base = x * 1.0;
    Tensor v = base.narrow(0, 1, 2).clone();
    v.add_(w);
    (v * v).sum().backward();
    CHECK(same_values(w.grad(), f64({24.0, 46.0}, {2})));
    CHECK(same_values(x.grad(), f64({0.0, 24.0, 46.0, 0.0}, {4})));
  }
  SECTION("with nothing to record, views are written through") {
    Tensor base = zeros({4}, {.dtype = kFloat64});
    Tensor v = base.slice(0, 1, 4, 2);
    v.add_(f64({1.0, 2.0}, {2}));
    CHECK(same_values(base, f64({0.0, 1.0, 0.0, 2.0}, {4})));
    {
      NoGradGuard no_grad;
      Tensor xv = x.narrow(0, 0, 2);
      xv.mul_(10.0);
    }
    CHECK(same_values(x, f64({10.0, 20.0, 3.0, 4.0}, {4})));
  }
}

TEST_CASE("in-place ops on non-leaves have the right gradients", "[autograd][inplace]") {
  Tensor x = leaf_from({1.0, -2.0, 3.0}, {3});
  Tensor w = leaf_from({0.5, 4.0, -1.0}, {3});
  SECTION("add_ with alpha records history on the same tensor") {
    Tensor c = x * 2.0;
    Tensor alias = c;  // another handle to the same tensor sees the new history
    c.add_(w, 3.0);
    CHECK(alias.grad_fn() == c.grad_fn());
    CHECK(c.grad_fn()->name() == "add_");
    (c * c).sum().backward();  // c = 2x + 3w
    Tensor cv = f64({2.0 + 1.5, -4.0 + 12.0, 6.0 - 3.0}, {3});
    CHECK(same_values(x.grad(), cv * 4.0));
    CHECK(same_values(w.grad(), cv * 6.0));
  }
  SECTION("mul_ by a tensor uses the values from before the write") {
    Tensor c = x + 1.0;  // [2, -1, 4]
    c.mul_(w);
    c.sum().backward();
    CHECK(same_values(x.grad(), f64({0.5, 4.0, -1.0}, {3})));
    CHECK(same_values(w.grad(), f64({2.0, -1.0, 4.0}, {3})));
  }
  SECTION("sub_, div_ and clamp_") {
    Tensor c = x * 1.0;
    c.sub_(w, 2.0);   // x - 2w = [0, -10, 5]
    c.div_(4.0);      // [0, -2.5, 1.25]
    c.clamp_(-1.0, 1.0);  // the last two are clamped: no gradient there
    c.sum().backward();
    CHECK(same_values(x.grad(), f64({0.25, 0.0, 0.0}, {3})));
    CHECK(same_values(w.grad(), f64({-0.5, 0.0, 0.0}, {3})));
  }
  SECTION("copy_ gives all the gradient to the source, broadcast and cast back") {
    Tensor c = zeros({2, 3}, {.dtype = kFloat64});
    Tensor src = tensor<float>({1.0f, 2.0f, 3.0f});
    src.requires_grad_();
    Tensor d = x.unsqueeze(0) * c;  // the old values of d get no gradient after the copy
    d.copy_(src);
    (d * w).sum().backward();
    REQUIRE(src.grad().defined());
    CHECK(src.grad().dtype() == kFloat32);
    CHECK(same_values(src.grad(), tensor<float>({1.0f, 8.0f, -2.0f})));
    CHECK(same_values(x.grad(), zeros({3}, {.dtype = kFloat64})));
  }
  SECTION("fill_ and masked_fill_ cut the gradient of what they overwrite") {
    Tensor c = x * 3.0;
    c.masked_fill_(tensor<bool>({false, true, false}), 0.0);
    Tensor d = x * 5.0;
    d.fill_(1.0);
    (c + d * w).sum().backward();
    CHECK(same_values(x.grad(), f64({3.0, 0.0, 3.0}, {3})));
    CHECK(same_values(w.grad(), f64({1.0, 1.0, 1.0}, {3})));
  }
  SECTION("an in-place op gives a tensor without history a grad_fn") {
    Tensor z = zeros({3}, {.dtype = kFloat64});
    CHECK_FALSE(z.requires_grad());
    z.add_(w);
    CHECK(z.requires_grad());
    CHECK_FALSE(z.is_leaf());
    (z * z).sum().backward();
    CHECK(same_values(w.grad(), f64({1.0, 8.0, -2.0}, {3})));
  }
}

TEST_CASE("dividing in place by a tensor that requires grad gives both gradients", "[autograd][inplace]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor w = leaf_from({4.0, -5.0}, {2});
  Tensor c = x * 1.0;
  c.div_(w);
  c.sum().backward();
  CHECK(same_values(x.grad(), f64({0.25, -0.2}, {2})));
  CHECK(same_values(w.grad(), f64({-1.0 / 16.0, -2.0 / 25.0}, {2})));  // -x / w^2
}

}  // namespace chorus

namespace chorus {

TEST_CASE("in-place unary methods equal their out-of-place ops, values and gradients", "[autograd][inplace]") {
  using Method = Tensor& (Tensor::*)();
  struct Row {
    const char* name;
    Method in_place;
    Tensor (*op)(const Tensor&);
    bool positive;  // inputs must be > 0 (log & co.)
  };
  const std::vector<Row> rows = {
      {"relu_", &Tensor::relu_, [](const Tensor& t) { return relu(t); }, false},
      {"exp_", &Tensor::exp_, [](const Tensor& t) { return exp(t); }, false},
      {"log_", &Tensor::log_, [](const Tensor& t) { return log(t); }, true},
      {"log1p_", &Tensor::log1p_, [](const Tensor& t) { return log1p(t); }, true},
      {"log2_", &Tensor::log2_, [](const Tensor& t) { return log2(t); }, true},
      {"sqrt_", &Tensor::sqrt_, [](const Tensor& t) { return sqrt(t); }, true},
      {"rsqrt_", &Tensor::rsqrt_, [](const Tensor& t) { return rsqrt(t); }, true},
      {"tanh_", &Tensor::tanh_, [](const Tensor& t) { return tanh(t); }, false},
      {"sigmoid_", &Tensor::sigmoid_, [](const Tensor& t) { return sigmoid(t); }, false},
      {"neg_", &Tensor::neg_, [](const Tensor& t) { return neg(t); }, false},
      {"abs_", &Tensor::abs_, [](const Tensor& t) { return abs(t); }, false},
      {"sin_", &Tensor::sin_, [](const Tensor& t) { return sin(t); }, false},
      {"cos_", &Tensor::cos_, [](const Tensor& t) { return cos(t); }, false},
      {"erf_", &Tensor::erf_, [](const Tensor& t) { return erf(t); }, false},
      {"expm1_", &Tensor::expm1_, [](const Tensor& t) { return expm1(t); }, false},
      {"floor_", &Tensor::floor_, [](const Tensor& t) { return floor(t); }, false},
      {"round_", &Tensor::round_, [](const Tensor& t) { return round(t); }, false},
  };
  Generator gen(41);
  for (const Row& r : rows) {
    INFO(r.name);
    Tensor base = randn({3, 4}, {.dtype = kFloat64}, &gen);
    if (r.positive) base = add(abs(base), 0.1);
    // Values, without autograd.
    Tensor y = base.clone();
    (y.*r.in_place)();
    CHECK(equal(y, r.op(base)));
    // Gradients through a non-leaf modified in place equal those of the out-of-place op.
    Tensor a = base.clone().requires_grad_(), b = base.clone().requires_grad_();
    Tensor h = mul(a, 1.0);
    (h.*r.in_place)();
    sum(mul(h, h)).backward();
    Tensor o = r.op(mul(b, 1.0));
    sum(mul(o, o)).backward();
    CHECK(equal(a.grad(), b.grad()));
    // A leaf that requires grad is refused.
    Tensor leaf = base.clone().requires_grad_();
    CHECK_THROWS_WITH((leaf.*r.in_place)(), Catch::Contains("leaf tensor that requires grad"));
  }
}

}  // namespace chorus
