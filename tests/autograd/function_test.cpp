// autograd::Function: user-defined forward/backward with a context, against chorus's own ops and
// finite differences (gradcheck in float64); non-tensor and TensorList arguments; several outputs,
// one non-differentiable; an input modified in place (mark_dirty); an input returned as is; saved
// tensors checked for in-place changes and freed after backward; backward returning the wrong count
// or shape refused with a message; InferenceMode.
#include <catch2/catch.hpp>

#include "autograd/function.h"
#include "autograd/gradcheck.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

using autograd::AutogradContext;

struct MyExp : autograd::Function<MyExp> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    Tensor y = exp(x);
    ctx->save_for_backward({y});
    return y;
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) { return {mul(g[0], ctx->get_saved_variables()[0])}; }
};

// y = k * a * b, with k a plain double (not a graph input).
struct ScaledProduct : autograd::Function<ScaledProduct> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, double k, const Tensor& b) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["k"] = k;
    return mul(mul(a, b), k);
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    const TensorList s = ctx->get_saved_variables();
    const double k = std::any_cast<double>(ctx->saved_data.at("k"));
    return {ctx->needs_input_grad(0) ? mul(mul(g[0], s[1]), k) : Tensor(), Tensor(),
            ctx->needs_input_grad(2) ? mul(mul(g[0], s[0]), k) : Tensor()};
  }
};

// Sum of a list of tensors (each an input of its own).
struct SumList : autograd::Function<SumList> {
  static Tensor forward(AutogradContext*, const TensorList& xs) {
    Tensor total = xs[0].clone();
    for (size_t i = 1; i < xs.size(); ++i) total = add(total, xs[i]);
    return total;
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    TensorList out;
    for (int i = 0; i < 3; ++i) out.push_back(ctx->needs_input_grad(i) ? g[0] : Tensor());
    return out;
  }
};

// Row-wise max value (differentiable) and its index (not).
struct MaxWithIndex : autograd::Function<MaxWithIndex> {
  static TensorList forward(AutogradContext* ctx, const Tensor& x) {
    Tensor idx = x.argmax(1, true);
    Tensor val = gather(x, 1, idx);
    ctx->mark_non_differentiable({idx});
    ctx->save_for_backward({idx});
    ctx->saved_data["shape"] = x.sizes();
    return {val, idx};
  }
  static TensorList backward(AutogradContext* ctx, TensorList g) {
    const Tensor idx = ctx->get_saved_variables()[0];
    Tensor grad = zeros(std::any_cast<Shape>(ctx->saved_data.at("shape")), {.dtype = g[0].dtype()});
    return {scatter(grad, 1, idx, g[0])};
  }
};

// x += 1 in place (x must be a non-leaf), returned.
struct AddOneInPlace : autograd::Function<AddOneInPlace> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    x.add_(1.0);
    ctx->mark_dirty({x});
    return x;
  }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0]}; }
};

struct Identity : autograd::Function<Identity> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x; }
  static TensorList backward(AutogradContext*, TensorList g) { return {mul(g[0], 2.0)}; }  // marks the path
};

struct TooMany : autograd::Function<TooMany> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x.clone(); }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0], g[0]}; }
};

struct WrongShape : autograd::Function<WrongShape> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return sum(x); }
  static TensorList backward(AutogradContext*, TensorList g) { return {g[0]}; }  // should be expanded
};

}  // namespace

TEST_CASE("autograd::Function: forward, backward and gradcheck against chorus's ops", "[autograd][function]") {
  manual_seed(1);
  Tensor x = randn({3, 4}, {.dtype = kFloat64}).requires_grad_();
  Tensor y = MyExp::apply(x);
  CHECK(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "MyExpBackward");
  CHECK(equal(y, exp(x)));
  sum(mul(y, y)).backward();
  Tensor expected = mul(exp(mul(x, 2.0)), 2.0);
  CHECK(sub(x.grad(), expected).abs().max().item<double>() < 1e-12);
  CHECK(autograd::gradcheck([](const TensorList& in) { return MyExp::apply(in[0]); }, {x}));

  Tensor a = randn({2, 5}, {.dtype = kFloat64}).requires_grad_(), b = randn({2, 5}, {.dtype = kFloat64}).requires_grad_();
  CHECK(autograd::gradcheck([](const TensorList& in) { return ScaledProduct::apply(in[0], 1.5, in[1]); }, {a, b}));
  // Only a needs a gradient: backward sees that, b gets none.
  Tensor c = randn({2, 5}, {.dtype = kFloat64});
  sum(ScaledProduct::apply(a, 3.0, c)).backward();
  CHECK(sub(a.grad(), mul(c, 3.0)).abs().max().item<double>() < 1e-12);
  CHECK_FALSE(c.grad().defined());
  // Without any input requiring grad, nothing is recorded.
  CHECK(ScaledProduct::apply(c, 2.0, c).grad_fn() == nullptr);
}

TEST_CASE("autograd::Function: TensorList inputs, several outputs, non-differentiable ones", "[autograd][function]") {
  manual_seed(2);
  Tensor p = randn({4}).requires_grad_(), q = randn({4}), r = randn({4}).requires_grad_();
  sum(mul(SumList::apply(TensorList{p, q, r}), 3.0)).backward();
  CHECK(equal(p.grad(), full({4}, 3.0)));
  CHECK(equal(r.grad(), full({4}, 3.0)));
  CHECK_FALSE(q.grad().defined());

  Tensor x = randn({3, 5}, {.dtype = kFloat64}).requires_grad_();
  TensorList out = MaxWithIndex::apply(x);
  REQUIRE(out.size() == 2);
  CHECK(out[0].requires_grad());
  CHECK_FALSE(out[1].requires_grad());
  CHECK(out[1].grad_fn() == nullptr);
  sum(out[0]).backward();
  CHECK(equal(x.grad(), scatter(zeros({3, 5}, {.dtype = kFloat64}), 1, x.argmax(1, true), ones({3, 1}, {.dtype = kFloat64}))));
  CHECK(autograd::gradcheck([](const TensorList& in) { return MaxWithIndex::apply(in[0])[0]; }, {x}));
}

TEST_CASE("autograd::Function: mark_dirty, inputs returned as is, saved tensors' checks", "[autograd][function]") {
  Tensor leaf = randn({4}).requires_grad_();
  Tensor mid = mul(leaf, 2.0);
  Tensor out = AddOneInPlace::apply(mid);
  CHECK(out.unsafe_impl() == mid.unsafe_impl());  // the same tensor, now with this function's history
  CHECK(mid.grad_fn()->name() == "AddOneInPlaceBackward");
  sum(out).backward();
  CHECK(equal(leaf.grad(), full({4}, 2.0)));
  // A leaf that requires grad cannot be modified in place under autograd.
  Tensor leaf2 = randn({4}).requires_grad_();
  CHECK_THROWS_WITH(AddOneInPlace::apply(leaf2), Catch::Contains("leaf tensor that requires grad"));

  // An input returned unchanged comes back as a new tensor with the function's history; the
  // input keeps its own.
  Tensor x = randn({3}).requires_grad_();
  Tensor y = Identity::apply(x);
  CHECK(y.unsafe_impl() != x.unsafe_impl());
  CHECK(x.is_leaf());
  sum(y).backward();
  CHECK(equal(x.grad(), full({3}, 2.0)));

  // A saved tensor modified in place before backward is refused; after a backward the saved
  // tensors are freed.
  Tensor z = randn({3}).requires_grad_();
  Tensor e = MyExp::apply(z);
  {
    NoGradGuard no_grad;
    e.mul_(2.0);
  }
  CHECK_THROWS_WITH(sum(e).backward(), Catch::Contains("modified by an inplace operation"));
  Tensor e2 = MyExp::apply(z);
  sum(e2).backward({}, true);
  sum(e2).backward();  // retained once
  CHECK_THROWS_WITH(sum(e2).backward(), Catch::Contains("freed"));
}

TEST_CASE("autograd::Function: a backward that returns the wrong gradients is refused", "[autograd][function]") {
  Tensor x = randn({2, 3}).requires_grad_();
  CHECK_THROWS_WITH(sum(TooMany::apply(x)).backward(),
                    Catch::Contains("TooManyBackward: backward returned 2 gradients, expected 1"));
  CHECK_THROWS_WITH(WrongShape::apply(x).backward(),
                    Catch::Contains("WrongShapeBackward: backward returned a gradient of shape [] for argument 0, whose "
                                    "shape is [2, 3]"));
}

TEST_CASE("InferenceMode records nothing and restores grad mode", "[autograd][function]") {
  Tensor x = randn({3}).requires_grad_();
  {
    autograd::InferenceMode guard;
    Tensor y = mul(x, 2.0);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    {
      autograd::InferenceMode off(false);
      CHECK(mul(x, 2.0).requires_grad());
    }
  }
  CHECK(mul(x, 2.0).requires_grad());
}

}  // namespace chorus
