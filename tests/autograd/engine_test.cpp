// The backward engine and the autograd front door: gradient accumulation through shared inputs
// (diamonds, repeated uses), retain_graph and the freed-graph error, seeding non-scalar roots,
// autograd::grad (no .grad side effects, allow_unused), retain_grad, detach, grad mode, and the
// error messages users see when they call these wrongly.
#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/runtime.h"
#include "tensor/test_faults.h"
#include "tests/autograd/autograd_testing.h"

namespace chorus {
namespace {

using testing::error_containing;
using testing::leaf;
using testing::leaf_from;
using testing::same_values;

Tensor f64(std::vector<double> values, Shape shape) { return tensor(values, shape); }

}  // namespace

TEST_CASE("a diamond graph sums the gradients of both branches", "[autograd][engine]") {
  Generator gen(1);
  Tensor x = leaf({4}, gen);
  // x feeds two branches that meet again: y = (2x) * exp(x); dy/dx = 2 exp(x) + 2x exp(x).
  Tensor a = x * 2.0;
  Tensor b = exp(x);
  Tensor y = (a * b).sum();
  y.backward();
  Tensor expected;
  {
    NoGradGuard no_grad;
    expected = exp(x) * 2.0 + x * exp(x) * 2.0;
  }
  CHECK(same_values(x.grad(), expected));
}

TEST_CASE("a tensor used several times gets the sum of all its uses", "[autograd][engine]") {
  Generator gen(2);
  Tensor x = leaf({3, 2}, gen);
  Tensor y = (x * x * x + x - x * 4.0).sum();  // d/dx = 3x^2 + 1 - 4
  y.backward();
  Tensor expected;
  {
    NoGradGuard no_grad;
    expected = x * x * 3.0 - 3.0;
  }
  CHECK(same_values(x.grad(), expected));

  // The same leaf twice in one op, and through a view of itself.
  Tensor z = leaf_from({1.0, 2.0, 3.0}, {3});
  (z * z + z.view({3}) * 2.0).sum().backward();
  CHECK(same_values(z.grad(), f64({4.0, 6.0, 8.0}, {3})));
}

TEST_CASE("a second backward through a freed graph raises; retain_graph keeps it and accumulates",
          "[autograd][engine]") {
  Tensor x = leaf_from({1.0, -2.0, 3.0}, {3});
  SECTION("without retain_graph the saved values are freed") {
    Tensor y = (x * x).sum();
    y.backward();
    CHECK(same_values(x.grad(), f64({2.0, -4.0, 6.0}, {3})));
    REQUIRE_THROWS_MATCHES(y.backward(), Error, error_containing({"second time", "retain_graph=true"}));
    // The failed call did not add anything.
    CHECK(same_values(x.grad(), f64({2.0, -4.0, 6.0}, {3})));
  }
  SECTION("with retain_graph the graph can be walked again and .grad accumulates") {
    Tensor y = (x * x).sum();
    y.backward(Tensor(), /*retain_graph=*/true);
    y.backward(Tensor(), /*retain_graph=*/true);
    CHECK(same_values(x.grad(), f64({4.0, -8.0, 12.0}, {3})));
    y.backward();  // the last walk may free it
    CHECK(same_values(x.grad(), f64({6.0, -12.0, 18.0}, {3})));
    REQUIRE_THROWS_MATCHES(y.backward(), Error, error_containing({"second time"}));
  }
}

TEST_CASE("backward of a non-scalar needs a gradient of its shape", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0, 4.0}, {2, 2});
  Tensor y = x * x;
  REQUIRE_THROWS_MATCHES(y.backward(), Error,
                         error_containing({"implicitly created only for scalar outputs", "[2, 2]"}));
  REQUIRE_THROWS_MATCHES(y.backward(ones({4}, {.dtype = kFloat64})), Error,
                         error_containing({"gradient of shape [4]", "[2, 2]"}));
  y.backward(f64({1.0, 0.5, -1.0, 2.0}, {2, 2}));
  CHECK(same_values(x.grad(), f64({2.0, 2.0, -6.0, 16.0}, {2, 2})));
}

TEST_CASE("a root gradient of another dtype is cast to the root's dtype", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor y = x * 2.0;
  y.retain_grad();
  y.backward(tensor<float>({1.0f, 0.5f}));
  REQUIRE(y.grad().defined());
  CHECK(y.grad().dtype() == kFloat64);
  CHECK(x.grad().dtype() == kFloat64);
  CHECK(same_values(x.grad(), f64({2.0, 1.0}, {2})));
  // A leaf as the root: what lands in .grad must have the leaf's dtype too.
  Tensor z = leaf_from({1.0, 2.0}, {2});
  z.backward(tensor<float>({3.0f, 4.0f}));
  REQUIRE(z.grad().defined());
  CHECK(z.grad().dtype() == kFloat64);
  CHECK(same_values(z.grad(), f64({3.0, 4.0}, {2})));
}

TEST_CASE("a one-element non-scalar root gets an implicit gradient of ones", "[autograd][engine]") {
  Tensor x = leaf_from({3.0}, {1, 1});
  (x * x).backward();
  CHECK(same_values(x.grad(), f64({6.0}, {1, 1})));
}

TEST_CASE("backward of a tensor that does not require grad explains why", "[autograd][engine]") {
  Tensor x = ones({2}, {.dtype = kFloat64});
  REQUIRE_THROWS_MATCHES((x * 2.0).sum().backward(), Error, error_containing({"does not require grad"}));
  Tensor w = leaf_from({1.0, 2.0}, {2});
  Tensor y;
  {
    NoGradGuard no_grad;
    y = (w * 2.0).sum();
  }
  REQUIRE_THROWS_MATCHES(y.backward(), Error, error_containing({"does not require grad", "NoGradGuard"}));
}

TEST_CASE("gradients accumulate into .grad across separate backward calls", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  (x * 3.0).sum().backward();
  CHECK(same_values(x.grad(), f64({3.0, 3.0}, {2})));
  (x * x).sum().backward();
  CHECK(same_values(x.grad(), f64({5.0, 7.0}, {2})));
  // Clearing .grad starts over.
  x.mutable_grad() = Tensor();
  (x * -1.0).sum().backward();
  CHECK(same_values(x.grad(), f64({-1.0, -1.0}, {2})));
}

TEST_CASE(".grad never aliases a gradient the caller still holds", "[autograd][engine]") {
  // clone() and view() pass the incoming gradient through unchanged; the first .grad must be a
  // copy, or the in-place accumulation of the next backward would write into the caller's tensor.
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor g = f64({1.0, 10.0, 100.0}, {3});
  x.clone().backward(g);
  x.view({3}).backward(g);
  CHECK(same_values(x.grad(), f64({2.0, 20.0, 200.0}, {3})));
  CHECK(same_values(g, f64({1.0, 10.0, 100.0}, {3})));
}

// [Sole owner of a gradient] (autograd/node.cpp): a gradient that is a view over memory nothing
// else holds (the root it views is held by the view alone, and the view covers it) becomes .grad
// as it is, as PyTorch's AccumulateGrad keeps the tensor it is given; a view of part of a larger
// buffer is copied. A leaf hook sees the incoming gradient (its address is noted, not the tensor).
TEST_CASE("a gradient viewing memory nothing else holds becomes .grad without a copy", "[autograd][engine]") {
  Generator gen(4);
  const Tensor x = leaf(Shape{5, 4}, gen).detach();
  const Tensor g = leaf(Shape{5, 3}, gen).detach();
  const Tensor want = mm(g.t(), x);  // d/dW of sum(g * (x W^T))
  SECTION("linear's weight: computed as t(mm(t(g), x)), then the t() backward") {
    Tensor w = leaf(Shape{3, 4}, gen);
    const void* seen = nullptr;
    w.register_hook([&](const Tensor& in) {
      seen = in.raw_data_ptr();
      return Tensor();
    });
    mm(x, w.t()).backward(g);
    CHECK(w.grad().raw_data_ptr() == seen);
    CHECK(w.grad().is_contiguous());
    CHECK(same_values(w.grad(), want));
    mm(x, w.t()).backward(g);  // accumulates in place into the kept tensor
    CHECK(same_values(w.grad(), mul(want, 2.0)));
  }
  SECTION("a hook's reshape of its own tensor is kept; its narrow of a larger one is copied") {
    Tensor w = leaf(Shape{3, 4}, gen);
    Tensor v = leaf(Shape{3, 4}, gen);
    const void* w_seen = nullptr;
    const void* v_seen = nullptr;
    w.register_hook([&](const Tensor& in) {
      Tensor r = in.clone().reshape({12}).reshape({3, 4});  // views of a root only r holds
      w_seen = r.raw_data_ptr();
      return r;
    });
    v.register_hook([&](const Tensor& in) {
      Tensor r = cat({in, in}, 0).narrow(0, 0, 3);  // the first half of a [6, 4] buffer
      v_seen = r.raw_data_ptr();
      return r;
    });
    (mm(x, w.t()) + mm(x, v.t())).backward(g);
    CHECK(w.grad().raw_data_ptr() == w_seen);
    CHECK(v.grad().raw_data_ptr() != v_seen);
    CHECK(same_values(w.grad(), want));
    CHECK(same_values(v.grad(), want));
  }
}

TEST_CASE("two leaves fed the same gradient tensor get independent .grad", "[autograd][engine]") {
  // add's backward hands one tensor to both inputs; at most one leaf may keep it as its .grad.
  Tensor a = leaf_from({1.0, 2.0}, {2});
  Tensor b = leaf_from({3.0, 4.0}, {2});
  ((a + b) * 2.0).sum().backward();
  CHECK(!a.grad().is_same(b.grad()));
  CHECK(a.grad().raw_data_ptr() != b.grad().raw_data_ptr());
  {
    NoGradGuard no_grad;
    a.mutable_grad().mul_(10.0);
  }
  CHECK(same_values(a.grad(), f64({20.0, 20.0}, {2})));
  CHECK(same_values(b.grad(), f64({2.0, 2.0}, {2})));
}

TEST_CASE("backward over several roots seeds each and sums into shared leaves", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor y1 = (x * x).sum();
  Tensor y2 = x * 3.0;
  autograd::backward({y1, y2}, {Tensor(), f64({1.0, -1.0}, {2})});
  CHECK(same_values(x.grad(), f64({5.0, 1.0}, {2})));

  // One root that depends on the other: the dependent one's gradient arrives before it runs.
  Tensor z = leaf_from({2.0}, {});
  Tensor a = z * z;     // da/dz = 2z
  Tensor b = a * 5.0;   // db/dz = 10z
  autograd::backward({a, b});
  CHECK(same_values(z.grad(), f64({24.0}, {})));

  REQUIRE_THROWS_MATCHES(autograd::backward({y1, y2}, {Tensor()}), Error, error_containing({"2 tensors but 1 gradients"}));
}

TEST_CASE("autograd::grad returns gradients without touching .grad", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor w = leaf_from({0.5, -1.0, 2.0}, {3});
  Tensor h = x * w;
  Tensor y = (h * h).sum();
  TensorList g = autograd::grad({y}, {x, h}, {}, /*retain_graph=*/true);
  REQUIRE(g.size() == 2);
  CHECK(same_values(g[0], f64({0.5, 4.0, 24.0}, {3})));  // 2 x w^2
  CHECK(same_values(g[1], f64({1.0, -4.0, 12.0}, {3})));  // 2 h, for a non-leaf input
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());

  // The retained graph still serves backward afterwards.
  y.backward();
  CHECK(same_values(x.grad(), f64({0.5, 4.0, 24.0}, {3})));
  CHECK(same_values(w.grad(), f64({1.0, -8.0, 36.0}, {3})));  // 2 x^2 w
}

TEST_CASE("autograd::grad with an unused input: an error, or an undefined gradient with allow_unused",
          "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor unused = leaf_from({5.0}, {1});
  Tensor y = (x * x).sum();
  REQUIRE_THROWS_MATCHES(autograd::grad({y}, {x, unused}, {}, /*retain_graph=*/true), Error,
                         error_containing({"input 1", "not used", "allow_unused"}));
  TensorList g = autograd::grad({y}, {x, unused}, {}, /*retain_graph=*/false, /*allow_unused=*/true);
  REQUIRE(g.size() == 2);
  CHECK(same_values(g[0], f64({2.0, 4.0}, {2})));
  CHECK_FALSE(g[1].defined());
  CHECK_FALSE(unused.grad().defined());

  Tensor no_grad_input = ones({2});
  REQUIRE_THROWS_MATCHES(autograd::grad({(x * 2.0).sum()}, {no_grad_input}), Error,
                         error_containing({"input 0 does not require grad"}));
}

TEST_CASE("autograd::grad of an output with respect to itself is the seed", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor y = x * 3.0;
  TensorList g = autograd::grad({y}, {y}, {f64({0.5, -1.0}, {2})});
  CHECK(same_values(g[0], f64({0.5, -1.0}, {2})));
}

TEST_CASE("backward of a leaf puts the seed in its .grad", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  x.backward(f64({3.0, 4.0}, {2}));
  CHECK(same_values(x.grad(), f64({3.0, 4.0}, {2})));
}

TEST_CASE("autograd::grad with a non-scalar output takes grad_outputs", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor y = x * x * x;
  TensorList g = autograd::grad({y}, {x}, {f64({1.0, -2.0}, {2})});
  CHECK(same_values(g[0], f64({3.0, -24.0}, {2})));
}

TEST_CASE("retain_grad keeps the gradient of a non-leaf; other non-leaves keep none", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, -2.0}, {2});
  Tensor h = x * 3.0;
  Tensor k = h + 1.0;
  h.retain_grad();
  CHECK(h.retains_grad());
  CHECK_FALSE(k.retains_grad());
  Tensor y = (h * h).sum() + k.sum();  // dy/dh = 2h + 1
  y.backward(Tensor(), /*retain_graph=*/true);
  CHECK(same_values(h.grad(), f64({7.0, -11.0}, {2})));
  CHECK_FALSE(k.grad().defined());
  CHECK(same_values(x.grad(), f64({21.0, -33.0}, {2})));
  // A second pass accumulates into the retained gradient too.
  y.backward();
  CHECK(same_values(h.grad(), f64({14.0, -22.0}, {2})));

  Tensor plain = ones({2});
  REQUIRE_THROWS_MATCHES(plain.retain_grad(), Error, error_containing({"retain_grad", "requires_grad=false"}));
}

TEST_CASE("retain_grad on the root holds the seed gradient", "[autograd][engine]") {
  Tensor x = leaf_from({2.0}, {});
  Tensor y = x * x;
  y.retain_grad();
  y.backward();
  CHECK(same_values(y.grad(), f64({1.0}, {})));
  CHECK(same_values(x.grad(), f64({4.0}, {})));
}

TEST_CASE("detach stops the gradient and shares storage", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.grad_fn() == nullptr);
  CHECK(d.raw_data_ptr() == x.raw_data_ptr());
  // x * detach(x): only the first factor carries a gradient, so d/dx = x rather than 2x.
  (x * x.detach()).sum().backward();
  CHECK(same_values(x.grad(), f64({1.0, 2.0, 3.0}, {3})));

  Tensor h = x * 2.0;
  Tensor hd = h.detach();
  CHECK_FALSE(hd.requires_grad());
  CHECK(h.requires_grad());  // detaching a copy leaves h's own history alone
  REQUIRE_THROWS_MATCHES((hd * 3.0).sum().backward(), Error, error_containing({"does not require grad"}));
}

TEST_CASE("requires_grad_ accepts only floating-point leaves", "[autograd][engine]") {
  Tensor i = tensor<int64_t>({1, 2, 3});
  REQUIRE_THROWS_MATCHES(i.requires_grad_(), Error, error_containing({"requires_grad_", "floating point", "int64"}));
  CHECK_FALSE(i.requires_grad());
  Tensor b = tensor<bool>({true});
  REQUIRE_THROWS_AS(b.requires_grad_(), Error);
  // requires_grad_(false) on an int tensor is harmless.
  CHECK_NOTHROW(i.requires_grad_(false));

  Tensor x = leaf_from({1.0}, {1});
  Tensor h = x * 2.0;
  REQUIRE_THROWS_MATCHES(h.requires_grad_(false), Error, error_containing({"leaf variables", "detach()"}));
  x.requires_grad_(false);
  CHECK_FALSE(x.requires_grad());
  CHECK_FALSE((x * 2.0).requires_grad());
}

TEST_CASE("NoGradGuard records nothing and restores grad mode", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  CHECK(autograd::GradMode::is_enabled());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(autograd::GradMode::is_enabled());
    Tensor y = exp(x * 2.0).sum();
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    CHECK(y.is_leaf());
    Tensor v = x.view({2, 1});  // views too
    CHECK_FALSE(v.requires_grad());
    {
      autograd::EnableGradGuard enable;
      CHECK((x * 2.0).requires_grad());
    }
    CHECK_FALSE((x * 2.0).requires_grad());
  }
  CHECK(autograd::GradMode::is_enabled());
  Tensor z = x * 2.0;
  CHECK(z.requires_grad());
  CHECK(z.grad_fn() != nullptr);
  CHECK(z.grad_fn()->name() == "MulBackward");
  CHECK_FALSE(z.is_leaf());
}

TEST_CASE("grad mode is off inside backward, so formulas record nothing", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  bool enabled_in_hook = true;
  Tensor h = x * x;
  h.register_hook([&](const Tensor&) {
    enabled_in_hook = autograd::GradMode::is_enabled();
    return Tensor();
  });
  h.sum().backward();
  CHECK_FALSE(enabled_in_hook);
  CHECK(autograd::GradMode::is_enabled());
  CHECK_FALSE(x.grad().requires_grad());
}

TEST_CASE("an error inside backward leaves the engine usable", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor h = x * 2.0;
  h.register_hook([](const Tensor&) -> Tensor { fail("hook: deliberate failure"); });
  REQUIRE_THROWS_MATCHES(h.sum().backward(), Error, error_containing({"deliberate failure"}));
  CHECK_FALSE(autograd::Engine::get().is_running());
  CHECK(autograd::GradMode::is_enabled());
  REQUIRE_THROWS_MATCHES(autograd::Engine::get().queue_callback([] {}), Error,
                         error_containing({"no backward pass is running"}));
  Tensor y = (x * x).sum();
  y.backward();
  CHECK(same_values(x.grad(), f64({2.0, 4.0}, {2})));
}

TEST_CASE("a very deep graph runs backward and is freed without overflowing the stack", "[autograd][engine]") {
  // 200k nodes: far deeper than a recursive destructor survives with an 8 MiB stack. Views keep it
  // fast; the node chain is the same as for any op.
  constexpr int kDepth = 200000;
  Tensor x = leaf_from({2.0}, {1});
  {
    Tensor y = x;
    for (int i = 0; i < kDepth; ++i) y = y.view({1});
    (y * 3.0).sum().backward();
  }  // the whole graph is released here
  CHECK(same_values(x.grad(), f64({3.0}, {1})));
  {
    Tensor y = x;
    for (int i = 0; i < kDepth; ++i) y = y.view({1});
  }  // and here without a backward
  CHECK(x.requires_grad());
}

TEST_CASE("integer outputs of differentiable inputs carry no history", "[autograd][engine]") {
  Tensor x = leaf_from({1.0, 5.0, 3.0}, {3});
  Tensor i = argmax(x);
  CHECK_FALSE(i.requires_grad());
  Tensor c = gt(x, 2.0);
  CHECK_FALSE(c.requires_grad());
  auto [values, indices] = max(x, 0);
  CHECK(values.requires_grad());
  CHECK_FALSE(indices.requires_grad());
}


// [Backward runs on the forward's streams] (autograd/engine.cpp), on sim:0 with the stream-order
// sanitizer (on by default for sim): a forward on a side stream and backward() called on the
// default stream. Each backward op runs on its forward's stream, after the caller's seed; the
// default stream then waits for it, so reading .grad there is ordered, and the gradients are the
// CPU's bit for bit. Removed (fault::Point::kAutogradStreams: every backward op on the caller's
// stream, as before 2026-12-04), the first backward kernel reads the forward's activations on the
// default stream with nothing ordering it after the side stream that wrote them: the sanitizer
// reports it (on a GPU: a silent race).
TEST_CASE("backward runs on the forward's stream: a forward on a side stream, backward() from the default one", "[autograd][sim]") {
  const Device dev = Device::sim(0);
  manual_seed(21);
  Tensor x = randn({6, 8}, {.dtype = kFloat64}), w = randn({8, 5}, {.dtype = kFloat64}).requires_grad_();
  (x.matmul(w).tanh() * 3.0).sum().backward();
  const Stream side = stream_from_pool(dev);
  REQUIRE_FALSE(side == current_stream(dev));
  for (const bool removed : {false, true}) {
    INFO((removed ? "removed" : "kept"));
    std::optional<fault::RemovedScope> scope;
    if (removed) scope.emplace(fault::Point::kAutogradStreams);
    Tensor xd = x.to(dev), wd = w.detach().to(dev).requires_grad_();
    synchronize(dev);  // the side stream's forward is ordered after the copies
    Tensor loss;
    {
      StreamGuard on_side(side);
      loss = (xd.matmul(wd).tanh() * 3.0).sum();
    }
    if (!removed) {
      loss.backward();
      CHECK(equal(wd.grad().cpu(), w.grad()));
    } else {
      CHECK_THROWS_WITH(loss.backward(), Catch::Contains("stream-order sanitizer"));
    }
    synchronize(dev);
  }
}

// Two branches of a forward on two side streams, joined on the default stream: in backward each
// branch's ops run on its own stream (seen by a hook on the branch's output and on its weight's
// AccumulateGrad), and the two gradients of the shared input are summed after both streams, on the
// stream of the node that takes them. The gradients equal the CPU's; the sanitizer finds nothing.
TEST_CASE("backward runs each branch on its forward's stream and sums across streams after both", "[autograd][sim]") {
  const Device dev = Device::sim(0);
  manual_seed(22);
  Tensor x = randn({4, 6}, {.dtype = kFloat64});
  Tensor w1 = randn({6, 6}, {.dtype = kFloat64}).requires_grad_(), w2 = randn({6, 3}, {.dtype = kFloat64}).requires_grad_(),
         w3 = randn({6, 3}, {.dtype = kFloat64}).requires_grad_();
  auto forward = [](const Tensor& in, const Tensor& a1, const Tensor& a2, const Tensor& a3, const Stream* s1, const Stream* s2,
                    Tensor* branch_a) {
    Tensor h = in.matmul(a1), a, b;
    Event made;
    if (s1 != nullptr) made.record(current_stream(in.device()));
    {
      std::optional<StreamGuard> g;
      if (s1 != nullptr) {
        s1->wait(made);
        g.emplace(*s1);
      }
      a = h.tanh().matmul(a2);
    }
    {
      std::optional<StreamGuard> g;
      if (s2 != nullptr) {
        s2->wait(made);
        g.emplace(*s2);
      }
      b = h.sigmoid().matmul(a3);
    }
    if (s1 != nullptr) {
      Event ea, eb;
      ea.record(*s1);
      eb.record(*s2);
      current_stream(in.device()).wait(ea);
      current_stream(in.device()).wait(eb);
    }
    if (branch_a != nullptr) *branch_a = a;
    return (a * b).sum();
  };
  forward(x, w1, w2, w3, nullptr, nullptr, nullptr).backward();
  const Stream s1 = stream_from_pool(dev), s2 = stream_from_pool(dev);
  REQUIRE_FALSE(s1 == s2);
  REQUIRE_FALSE(s1 == current_stream(dev));
  REQUIRE_FALSE(s2 == current_stream(dev));
  Tensor xd = x.to(dev), w1d = w1.detach().to(dev).requires_grad_(), w2d = w2.detach().to(dev).requires_grad_(),
         w3d = w3.detach().to(dev).requires_grad_();
  Tensor a;
  Tensor loss = forward(xd, w1d, w2d, w3d, &s1, &s2, &a);
  std::vector<Stream> seen_a, seen_w2;
  a.register_hook([&](const Tensor&) {
    seen_a.push_back(current_stream(Device::sim(0)));
    return Tensor();
  });
  w2d.register_hook([&](const Tensor&) {
    seen_w2.push_back(current_stream(Device::sim(0)));
    return Tensor();
  });
  loss.backward();
  REQUIRE(seen_a.size() == 1);
  REQUIRE(seen_w2.size() == 1);
  CHECK(seen_a[0] == s1);
  CHECK(seen_w2[0] == s1);
  CHECK(equal(w1d.grad().cpu(), w1.grad()));
  CHECK(equal(w2d.grad().cpu(), w2.grad()));
  CHECK(equal(w3d.grad().cpu(), w3.grad()));
  synchronize(dev);
}

}  // namespace chorus
