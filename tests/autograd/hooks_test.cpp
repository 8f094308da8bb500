// Hooks and engine callbacks: tensor hooks (see or replace a gradient, on leaves and non-leaves,
// in registration order, removable), post-accumulate-grad hooks (after .grad is updated, once per
// leaf per backward, earliest-ready leaf first: what data parallelism relies on to overlap
// communication with backward), and Engine::queue_callback (once, after everything else).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "tests/autograd/autograd_testing.h"

namespace chorus {
namespace {

using autograd::Engine;
using testing::error_containing;
using testing::leaf;
using testing::leaf_from;
using testing::same_values;

Tensor f64(std::vector<double> values, Shape shape) { return tensor(values, shape); }

// A 3-layer MLP whose parameters are leaves: loss = sum(tanh(tanh(x W1 + b1) W2 + b2) W3 + b3).
struct ThreeLayers {
  Tensor x, w1, b1, w2, b2, w3, b3;
  explicit ThreeLayers(Generator& gen)
      : x(testing::random_values({2, 3}, testing::Values::Any, gen)),
        w1(leaf({3, 4}, gen)),
        b1(leaf({4}, gen)),
        w2(leaf({4, 4}, gen)),
        b2(leaf({4}, gen)),
        w3(leaf({4, 2}, gen)),
        b3(leaf({2}, gen)) {}
  Tensor loss() const {
    Tensor h1 = tanh(matmul(x, w1) + b1);
    Tensor h2 = tanh(matmul(h1, w2) + b2);
    return (matmul(h2, w3) + b3).sum();
  }
};

}  // namespace

TEST_CASE("a leaf's tensor hook sees its gradient and can replace it", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, 2.0, 3.0}, {3});
  Tensor seen;
  x.register_hook([&](const Tensor& g) {
    seen = g.clone();
    return g * 2.0;
  });
  (x * x).sum().backward();
  CHECK(same_values(seen, f64({2.0, 4.0, 6.0}, {3})));
  CHECK(same_values(x.grad(), f64({4.0, 8.0, 12.0}, {3})));
}

TEST_CASE("a hook that returns nothing leaves the gradient as it was", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  int calls = 0;
  x.register_hook([&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  (x * 5.0).sum().backward();
  CHECK(calls == 1);
  CHECK(same_values(x.grad(), f64({5.0, 5.0}, {2})));
}

TEST_CASE("a non-leaf's hook replaces the gradient that flows on to its inputs", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, -2.0}, {2});
  Tensor h = x * 3.0;
  Tensor seen;
  h.register_hook([&](const Tensor& g) {
    seen = g.clone();
    return g * 10.0;
  });
  h.retain_grad();
  // h is used twice: the hook runs once, on the summed gradient 2h + 1.
  Tensor y = (h * h).sum() + h.sum();
  y.backward();
  CHECK(same_values(seen, f64({7.0, -11.0}, {2})));
  CHECK(same_values(h.grad(), f64({70.0, -110.0}, {2})));
  CHECK(same_values(x.grad(), f64({210.0, -330.0}, {2})));
}

TEST_CASE("a retained gradient is the one after the hooks, whichever was registered first",
          "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor h = x * 1.0;
  h.retain_grad();  // before the hook, as in PyTorch the retained value is still the final one
  h.register_hook([](const Tensor& g) { return g * -1.0; });
  (h * 4.0).sum().backward();
  CHECK(same_values(h.grad(), f64({-4.0, -4.0}, {2})));
  CHECK(same_values(x.grad(), f64({-4.0, -4.0}, {2})));
}

TEST_CASE("hooks run in registration order, each seeing the previous one's result", "[autograd][hooks]") {
  auto register_three = [](const Tensor& t, std::vector<std::string>& log, std::vector<Tensor>& seen) {
    t.register_hook([&log, &seen](const Tensor& g) {
      log.push_back("first");
      seen.push_back(g.clone());
      return g + 1.0;
    });
    t.register_hook([&log, &seen](const Tensor& g) {
      log.push_back("second");
      seen.push_back(g.clone());
      return g * 2.0;
    });
    t.register_hook([&log, &seen](const Tensor& g) {
      log.push_back("third");
      seen.push_back(g.clone());
      return Tensor();
    });
  };
  SECTION("on a leaf") {
    Tensor x = leaf_from({1.0, 2.0}, {2});
    std::vector<std::string> log;
    std::vector<Tensor> seen;
    register_three(x, log, seen);
    (x * 3.0).sum().backward();
    CHECK(log == std::vector<std::string>{"first", "second", "third"});
    REQUIRE(seen.size() == 3);
    CHECK(same_values(seen[1], f64({4.0, 4.0}, {2})));
    CHECK(same_values(seen[2], f64({8.0, 8.0}, {2})));
    CHECK(same_values(x.grad(), f64({8.0, 8.0}, {2})));
  }
  SECTION("on a non-leaf") {
    Tensor x = leaf_from({1.0, 2.0}, {2});
    Tensor h = x * 1.0;
    std::vector<std::string> log;
    std::vector<Tensor> seen;
    register_three(h, log, seen);
    (h * 3.0).sum().backward();
    CHECK(log == std::vector<std::string>{"first", "second", "third"});
    REQUIRE(seen.size() == 3);
    CHECK(same_values(seen[2], f64({8.0, 8.0}, {2})));
    CHECK(same_values(x.grad(), f64({8.0, 8.0}, {2})));
  }
}

TEST_CASE("HookHandle::remove stops a hook; removing twice is harmless", "[autograd][hooks]") {
  for (bool on_leaf : {true, false}) {
    INFO((on_leaf ? "leaf" : "non-leaf"));
    Tensor x = leaf_from({1.0, 2.0}, {2});
    Tensor t = on_leaf ? x : x * 1.0;
    int doubled = 0, counted = 0;
    HookHandle doubling = t.register_hook([&](const Tensor& g) {
      ++doubled;
      return g * 2.0;
    });
    HookHandle counting = t.register_hook([&](const Tensor&) {
      ++counted;
      return Tensor();
    });
    (t * 1.0).sum().backward(Tensor(), /*retain_graph=*/true);  // t's own node is walked again below
    CHECK(doubled == 1);
    CHECK(same_values(x.grad(), f64({2.0, 2.0}, {2})));
    doubling.remove();
    doubling.remove();
    x.mutable_grad() = Tensor();
    Tensor t2 = on_leaf ? x : t;
    (t2 * 1.0).sum().backward();
    CHECK(doubled == 1);
    CHECK(counted == 2);  // the other hook stays
    CHECK(same_values(x.grad(), f64({1.0, 1.0}, {2})));
    counting.remove();
  }
}

TEST_CASE("a hook can remove itself while it runs", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0}, {1});
  int calls = 0;
  HookHandle handle;
  handle = x.register_hook([&](const Tensor&) {
    ++calls;
    handle.remove();
    return Tensor();
  });
  (x * 2.0).sum().backward();
  (x * 2.0).sum().backward();
  CHECK(calls == 1);
  CHECK(same_values(x.grad(), f64({4.0}, {1})));
}

TEST_CASE("hooks need a tensor that requires grad; post-accumulate hooks need a leaf", "[autograd][hooks]") {
  Tensor plain = ones({2});
  REQUIRE_THROWS_MATCHES(plain.register_hook([](const Tensor&) { return Tensor(); }), Error,
                         error_containing({"register_hook", "doesn't require gradient"}));
  REQUIRE_THROWS_MATCHES(plain.register_post_accumulate_grad_hook([](Tensor&) {}), Error,
                         error_containing({"register_post_accumulate_grad_hook", "does not require"}));
  Tensor x = leaf_from({1.0}, {1});
  Tensor h = x * 2.0;
  REQUIRE_THROWS_MATCHES(h.register_post_accumulate_grad_hook([](Tensor&) {}), Error,
                         error_containing({"only leaf tensors", "non-leaf"}));
}

TEST_CASE("a post-accumulate hook runs once per backward, after .grad holds the new sum", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  std::vector<Tensor> grads_seen;
  std::vector<std::string> log;
  x.register_hook([&](const Tensor& g) {
    log.push_back("tensor hook");
    return g * 10.0;
  });
  x.register_post_accumulate_grad_hook([&](Tensor& leaf_tensor) {
    log.push_back("post-accumulate hook");
    CHECK(leaf_tensor.is_same(x));
    grads_seen.push_back(leaf_tensor.grad().clone());
  });
  // x is used three times; its AccumulateGrad, and so the hook, runs once per backward.
  (x * x + x * 3.0 + x).sum().backward();  // 2x + 4, then x10
  CHECK(log == std::vector<std::string>{"tensor hook", "post-accumulate hook"});
  REQUIRE(grads_seen.size() == 1);
  CHECK(same_values(grads_seen[0], f64({60.0, 80.0}, {2})));
  (x * 1.0).sum().backward();
  REQUIRE(grads_seen.size() == 2);
  CHECK(same_values(grads_seen[1], f64({70.0, 90.0}, {2})));
}

TEST_CASE("post-accumulate hooks fire as soon as each leaf's gradient is complete, last layer first",
          "[autograd][hooks]") {
  Generator gen(11);
  ThreeLayers net(gen);
  std::vector<std::string> order;
  auto watch = [&](const Tensor& p, std::string name, std::vector<const Tensor*> not_ready_yet) {
    p.register_post_accumulate_grad_hook([&order, name, not_ready_yet](Tensor& t) {
      order.push_back(name);
      CHECK(t.grad().defined());
      // Earlier layers' gradients need more of backward: they must not be there yet.
      for (const Tensor* other : not_ready_yet) {
        INFO(name << " fired after a parameter of an earlier layer");
        CHECK_FALSE(other->grad().defined());
      }
    });
  };
  watch(net.w3, "w3", {&net.w2, &net.b2, &net.w1, &net.b1});
  watch(net.b3, "b3", {&net.w2, &net.b2, &net.w1, &net.b1});
  watch(net.w2, "w2", {&net.w1, &net.b1});
  watch(net.b2, "b2", {&net.w1, &net.b1});
  watch(net.w1, "w1", {});
  watch(net.b1, "b1", {});
  net.loss().backward();
  REQUIRE(order.size() == 6);
  auto position = [&](const std::string& name) { return std::find(order.begin(), order.end(), name) - order.begin(); };
  CHECK(position("w3") < position("w2"));
  CHECK(position("b3") < position("w2"));
  CHECK(position("w2") < position("w1"));
  CHECK(position("b2") < position("w1"));
  CHECK(position("b2") < position("b1"));
}

TEST_CASE("a leaf shared by two layers fires once, when its last contribution arrives", "[autograd][hooks]") {
  Tensor x = leaf_from({0.5, -1.0}, {1, 2});
  Tensor w = leaf_from({1.0, 2.0, 3.0, 4.0}, {2, 2});   // used by layers 1 and 3
  Tensor v = leaf_from({0.5, 0.0, 0.0, 0.5}, {2, 2});   // layer 2 only
  std::vector<std::string> order;
  Tensor w_grad_at_hook;
  w.register_post_accumulate_grad_hook([&](Tensor& t) {
    order.push_back("w");
    w_grad_at_hook = t.grad().clone();
  });
  v.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back("v"); });
  Tensor y = matmul(matmul(matmul(x, w), v), w).sum();
  y.backward();
  CHECK(order == std::vector<std::string>{"v", "w"});
  CHECK(same_values(w_grad_at_hook, w.grad()));
  // Both uses are in it: compare with autograd::grad on a fresh graph.
  TensorList g = autograd::grad({matmul(matmul(matmul(x, w), v), w).sum()}, {w});
  CHECK(same_values(w.grad(), g[0]));
}

TEST_CASE("queue_callback runs once, after the whole backward and every post-accumulate hook",
          "[autograd][hooks]") {
  Generator gen(12);
  ThreeLayers net(gen);
  std::vector<std::string> log;
  int callbacks = 0;
  bool queued = false;
  // Queued by the first hook to fire (w3's); w1's hook fires later but the callback must wait.
  net.w3.register_post_accumulate_grad_hook([&](Tensor&) {
    log.push_back("w3");
    CHECK(Engine::get().is_running());
    if (!queued) {
      queued = true;
      Engine::get().queue_callback([&] {
        ++callbacks;
        log.push_back("callback");
        CHECK(Engine::get().is_running());
        for (const Tensor* p : {&net.w1, &net.b1, &net.w2, &net.b2, &net.w3, &net.b3}) CHECK(p->grad().defined());
        Engine::get().queue_callback([&] { log.push_back("callback of the callback"); });
      });
    }
  });
  net.w1.register_post_accumulate_grad_hook([&](Tensor&) { log.push_back("w1"); });
  net.loss().backward();
  CHECK(callbacks == 1);
  CHECK(log == std::vector<std::string>{"w3", "w1", "callback", "callback of the callback"});
  CHECK_FALSE(Engine::get().is_running());

  // A new backward does not replay callbacks of the previous one.
  log.clear();
  net.loss().backward();
  CHECK(callbacks == 1);
  CHECK(log == std::vector<std::string>{"w3", "w1"});
}

TEST_CASE("queue_callback from a tensor hook of a non-leaf also runs at the end", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor h = x * 2.0;
  Tensor grad_at_callback;
  h.register_hook([&](const Tensor&) {
    Engine::get().queue_callback([&] { grad_at_callback = x.grad().clone(); });
    return Tensor();
  });
  (h * h).sum().backward();
  // The hook ran before x's gradient existed; the callback after it was accumulated.
  CHECK(same_values(grad_at_callback, f64({8.0, 16.0}, {2})));
}

TEST_CASE("autograd::grad neither updates .grad nor fires post-accumulate hooks", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  int fired = 0;
  x.register_post_accumulate_grad_hook([&](Tensor&) { ++fired; });
  TensorList g = autograd::grad({(x * x).sum()}, {x});
  CHECK(same_values(g[0], f64({2.0, 4.0}, {2})));
  CHECK(fired == 0);
  CHECK_FALSE(x.grad().defined());
  (x * x).sum().backward();
  CHECK(fired == 1);
}

TEST_CASE("autograd::grad applies the tensor hooks of its inputs, leaf or not", "[autograd][hooks]") {
  Tensor x = leaf_from({1.0, 2.0}, {2});
  Tensor h = x * 1.0;
  x.register_hook([](const Tensor& g) { return g * 2.0; });
  h.register_hook([](const Tensor& g) { return g * 3.0; });
  TensorList g = autograd::grad({(h * 5.0).sum()}, {x, h});
  CHECK(same_values(g[1], f64({15.0, 15.0}, {2})));
  CHECK(same_values(g[0], f64({30.0, 30.0}, {2})));
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("queue_callback outside a backward pass throws", "[autograd][hooks]") {
  CHECK_FALSE(Engine::get().is_running());
  REQUIRE_THROWS_MATCHES(Engine::get().queue_callback([] {}), Error,
                         error_containing({"queue_callback", "no backward pass is running"}));
}

}  // namespace chorus
