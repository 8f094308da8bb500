// nn::Module semantics, as PyTorch's: registration and traversal order, recursive dotted names,
// train/eval propagation, to(dtype), zero_grad, apply, and state dicts (round trip, strict errors
// listing every problem at once, non-strict loading).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "tensor/ops.h"
#include "tests/nn/reference.h"

namespace chorus {
namespace {

using nn_test::check_close;
using nn_test::doubles;
using nn_test::error_message;

std::vector<std::string> names_of(const nn::NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

// A module registering its own parameters, a buffer and submodules, the way user models do.
class Block : public nn::Module {
 public:
  Block() : Module("Block") {
    scale = register_parameter("scale", ones({3}));
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
    steps = register_buffer("steps", zeros({1}, {.dtype = kInt64}));
    running = register_buffer("running", zeros({2}));
    frozen = register_parameter("frozen", zeros({2}), /*requires_grad=*/false);
    act = register_module("act", std::make_shared<nn::ReLU>());
  }
  Tensor forward(const Tensor& x) override { return act->forward(fc->forward(x * scale)); }

  Tensor scale, steps, running, frozen;
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::ReLU> act;
};

TEST_CASE("parameters, buffers and children come back in registration order, this module first",
          "[nn][module]") {
  Block b;
  CHECK(names_of(b.named_parameters()) == std::vector<std::string>{"scale", "frozen", "fc.weight", "fc.bias"});
  CHECK(names_of(b.named_parameters(/*recurse=*/false)) == std::vector<std::string>{"scale", "frozen"});
  CHECK(names_of(b.named_buffers()) == std::vector<std::string>{"steps", "running"});
  // The traversals hand back the registered tensors themselves, not copies.
  std::vector<Tensor> params = b.parameters();
  REQUIRE(params.size() == 4);
  CHECK(params[0].is_same(b.scale));
  CHECK(params[2].is_same(b.fc->weight));
  CHECK(b.buffers()[1].is_same(b.running));
  CHECK(b.scale.requires_grad());
  CHECK_FALSE(b.frozen.requires_grad());
  auto children = b.children();
  REQUIRE(children.size() == 2);
  CHECK(children[0] == b.fc);
  CHECK(children[1] == b.act);
  auto named = b.named_children();
  CHECK(named[0].first == "fc");
  CHECK(named[1].first == "act");
}

TEST_CASE("nested Sequentials give recursive dotted names like 0.1.weight", "[nn][module]") {
  auto inner = std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(),
                                                          std::make_shared<nn::Linear>(3, 3, false)});
  auto model = std::make_shared<nn::Sequential>(
      std::initializer_list<std::shared_ptr<nn::Module>>{inner, std::make_shared<nn::Linear>(3, 2)});
  CHECK(names_of(model->named_parameters()) ==
        std::vector<std::string>{"0.0.weight", "0.0.bias", "0.2.weight", "1.weight", "1.bias"});
  CHECK(names_of(model->state_dict()) == names_of(model->named_parameters()));
  std::vector<std::string> modules;
  for (const auto& [n, m] : model->named_modules()) modules.push_back(n + ":" + m->type_name());
  CHECK(modules == std::vector<std::string>{":Sequential", "0:Sequential", "0.0:Linear", "0.1:ReLU", "0.2:Linear",
                                            "1:Linear"});
  // A module-level Block inside a Sequential: its parameters, then buffers, then its children's.
  nn::Sequential with_block{std::make_shared<Block>()};
  CHECK(names_of(with_block.state_dict()) ==
        std::vector<std::string>{"0.scale", "0.frozen", "0.steps", "0.running", "0.fc.weight", "0.fc.bias"});
}

TEST_CASE("registration rejects duplicate names, dotted names and undefined tensors", "[nn][module][errors]") {
  nn::Module m("Custom");
  m.register_parameter("w", zeros({2}));
  CHECK_THAT(error_message([&] { m.register_buffer("w", zeros({2})); }),
             Catch::Contains("'w' is already registered"));
  CHECK_THAT(error_message([&] { m.register_module("w", std::make_shared<nn::ReLU>()); }),
             Catch::Contains("'w' is already registered"));
  CHECK_THAT(error_message([&] { m.register_parameter("a.b", zeros({2})); }), Catch::Contains("contain no '.'"));
  CHECK_THAT(error_message([&] { m.register_parameter("", zeros({2})); }), Catch::Contains("non-empty"));
  CHECK_THAT(error_message([&] { m.register_parameter("u", Tensor()); }), Catch::Contains("undefined"));
  CHECK_THAT(error_message([&] { m.replace_module("nope", std::make_shared<nn::ReLU>()); }),
             Catch::Contains("no submodule named 'nope'"));
  CHECK_THAT(error_message([&] { m.forward(zeros({1})); }), Catch::Contains("no single-input forward"));
}

TEST_CASE("register_parameter detaches a non-leaf and makes it a leaf that requires grad", "[nn][module]") {
  nn::Module m;
  Tensor base = ones({3}, {.requires_grad = true});
  Tensor p = m.register_parameter("p", base * 2.0);
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
  check_close(p, {2, 2, 2}, 0);
}

TEST_CASE("replace_module swaps a child in place, keeping its name and position", "[nn][module]") {
  nn::Sequential seq{std::make_shared<nn::Linear>(2, 2), std::make_shared<nn::ReLU>()};
  seq.replace_module("0", std::make_shared<nn::Linear>(2, 2, false));
  CHECK(names_of(seq.named_parameters()) == std::vector<std::string>{"0.weight"});
}

TEST_CASE("train() and eval() propagate to every descendant", "[nn][module]") {
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Sequential>(
          std::initializer_list<std::shared_ptr<nn::Module>>{std::make_shared<nn::Dropout>(0.5)}),
      std::make_shared<Block>()});
  REQUIRE(model->named_modules().size() == 6);
  auto all_training = [&](bool expected) {
    for (const auto& [n, m] : model->named_modules()) {
      INFO("module '" << n << "'");
      CHECK(m->is_training() == expected);
    }
  };
  all_training(true);
  model->eval();
  all_training(false);
  model->train();
  all_training(true);
  model->train(false);
  all_training(false);
}

TEST_CASE("named_modules on a module not held by a shared_ptr says how to fix the call", "[nn][module][errors]") {
  nn::Sequential on_stack{std::make_shared<nn::ReLU>()};
  CHECK_THAT(error_message([&] { on_stack.named_modules(); }), Catch::Contains("std::shared_ptr"));
}

TEST_CASE("to(dtype) converts floating parameters and buffers only, and layers' handles follow", "[nn][module]") {
  auto block = std::make_shared<Block>();
  Tensor w_before = block->fc->weight;
  std::vector<double> values = doubles(block->fc->weight);
  block->to(kFloat64);
  // Same tensor identity (the layer's member and the registered parameter), new dtype, same values.
  CHECK(block->fc->weight.is_same(w_before));
  CHECK(block->fc->weight.dtype() == kFloat64);
  CHECK(block->fc->weight.requires_grad());
  CHECK(block->fc->weight.is_leaf());
  check_close(block->fc->weight, values, 0);
  for (const auto& [n, t] : block->named_parameters()) {
    INFO(n);
    CHECK(t.dtype() == kFloat64);
  }
  CHECK(block->running.dtype() == kFloat64);
  CHECK(block->steps.dtype() == kInt64);  // integer buffer left alone
  // The converted model runs in float64 and its parameters receive float64 gradients.
  Tensor y = block->forward(randn({4, 3}, {.dtype = kFloat64}));
  CHECK(y.dtype() == kFloat64);
  y.sum().backward();
  CHECK(block->fc->weight.grad().dtype() == kFloat64);
  CHECK_THAT(error_message([&] { block->to(kInt32); }), Catch::Contains("floating-point dtype"));
}

TEST_CASE("to(dtype) keeps every tensor on its own device: a buffer-only module and a model split over two devices",
          "[nn][module][sim]") {
  // As PyTorch's module.to(dtype): only the dtype changes. A module without parameters (BatchNorm
  // without affine) on sim:0 keeps its running statistics there, and a model split over sim:0 and
  // sim:1 stays split, gradients included.
  auto norm = std::make_shared<nn::BatchNorm1d>(4, 1e-5, 0.1, /*affine=*/false);
  norm->to(Device::sim(0));
  norm->to(kFloat64);
  for (const auto& [n, t] : norm->named_buffers()) {
    INFO(n);
    CHECK(t.device() == Device::sim(0));
    if (is_floating(t.dtype())) CHECK(t.dtype() == kFloat64);
  }
  auto first = std::make_shared<nn::Linear>(3, 2), second = std::make_shared<nn::Linear>(2, 1);
  auto split = std::make_shared<nn::Sequential>();
  split->push_back(first);
  split->push_back(second);
  first->to(Device::sim(0));
  second->to(Device::sim(1));
  const std::vector<double> w0 = doubles(first->weight.cpu()), w1 = doubles(second->weight.cpu());
  first->weight.mutable_grad() = ones({2, 3}, {.device = Device::sim(0)});
  split->to(kFloat64);
  CHECK(first->weight.device() == Device::sim(0));
  CHECK(first->bias.device() == Device::sim(0));
  CHECK(first->weight.grad().device() == Device::sim(0));
  CHECK(first->weight.grad().dtype() == kFloat64);
  CHECK(second->weight.device() == Device::sim(1));
  CHECK(second->bias.device() == Device::sim(1));
  CHECK(second->weight.dtype() == kFloat64);
  check_close(first->weight.cpu(), w0, 0);
  check_close(second->weight.cpu(), w1, 0);
}

TEST_CASE("zero_grad sets gradients to none by default, or zeroes them in place", "[nn][module]") {
  manual_seed(1);
  nn::Linear fc(3, 2);
  auto step = [&] { fc.forward(randn({5, 3})).sum().backward(); };
  step();
  REQUIRE(fc.weight.grad().defined());
  REQUIRE(fc.bias.grad().defined());
  fc.zero_grad();
  CHECK_FALSE(fc.weight.grad().defined());
  CHECK_FALSE(fc.bias.grad().defined());

  step();
  Tensor g = fc.weight.grad();
  fc.zero_grad(/*set_to_none=*/false);
  REQUIRE(fc.weight.grad().defined());
  CHECK(fc.weight.grad().is_same(g));  // zeroed in place, same tensor
  check_close(fc.weight.grad(), std::vector<double>(6, 0.0), 0);
  check_close(fc.bias.grad(), {0, 0}, 0);
  // The next backward accumulates onto the zeros: bias grad = batch size.
  step();
  check_close(fc.bias.grad(), {5, 5}, 0);
}

TEST_CASE("apply visits children first, then the module itself, exactly once each", "[nn][module]") {
  nn::Sequential model{std::make_shared<nn::Linear>(2, 3),
                       std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
                           std::make_shared<nn::Linear>(3, 3), std::make_shared<nn::Tanh>()})};
  std::vector<std::string> order;
  model.apply([&](nn::Module& m) { order.push_back(m.type_name()); });
  CHECK(order == std::vector<std::string>{"Linear", "Linear", "Tanh", "Sequential", "Sequential"});
  // The usual use: re-initialize every Linear.
  model.apply([](nn::Module& m) {
    if (auto* fc = dynamic_cast<nn::Linear*>(&m)) {
      nn::init::constant_(fc->weight, 0.5);
      nn::init::zeros_(fc->bias);
    }
  });
  for (const auto& [n, t] : model.named_parameters()) {
    INFO(n);
    for (double v : doubles(t)) CHECK(v == (n.find("weight") != std::string::npos ? 0.5 : 0.0));
  }
}

std::shared_ptr<nn::Sequential> make_model() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::LayerNorm>(Shape{3}), std::make_shared<nn::ReLU>(),
      std::make_shared<Block>()});
}

TEST_CASE("state_dict round trip: a freshly initialized model loads another's values exactly", "[nn][module][state]") {
  manual_seed(10);
  auto a = make_model();
  // Give the buffers and the LayerNorm non-default values so that every entry is checked.
  {
    NoGradGuard no_grad;
    for (auto& [n, t] : a->state_dict()) {
      if (t.is_floating_point()) t.copy_(randn(t.sizes()));
      else t.fill_(7);
    }
  }
  manual_seed(20);
  auto b = make_model();
  auto sa = a->state_dict(), sb = b->state_dict();
  REQUIRE(names_of(sa) == names_of(sb));
  CHECK(names_of(sa) == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.scale", "3.frozen",
                                                 "3.steps", "3.running", "3.fc.weight", "3.fc.bias"});
  CHECK_FALSE(equal(sa[0].second, sb[0].second));
  b->load_state_dict(sa);
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(equal(sa[i].second, b->state_dict()[i].second));
  }
  // Loading copies values into b's own tensors: the handles the layers hold see them.
  auto b_fc = std::dynamic_pointer_cast<nn::Linear>((*b)[0]);
  CHECK(equal(b_fc->weight.detach(), sa[0].second));
  CHECK(b_fc->weight.requires_grad());
  Tensor x = randn({3, 4});
  CHECK(equal(a->forward(x), b->forward(x)));
  // ...and does not alias the source: changing a afterwards leaves b alone.
  {
    NoGradGuard no_grad;
    std::dynamic_pointer_cast<nn::Linear>((*a)[0])->weight.fill_(0);
  }
  CHECK_FALSE(equal(b_fc->weight.detach(), zeros({3, 4})));
}

TEST_CASE("state_dict entries are detached and share storage with the module", "[nn][module][state]") {
  nn::Linear fc(2, 2);
  auto sd = fc.state_dict();
  CHECK_FALSE(sd[0].second.requires_grad());
  {
    NoGradGuard no_grad;
    sd[0].second.fill_(3.0);
  }
  check_close(fc.weight, {3, 3, 3, 3}, 0);
}

TEST_CASE("strict load lists every missing key, unexpected key and shape mismatch in one error",
          "[nn][module][state][errors]") {
  auto model = make_model();
  nn::NamedTensors state = make_model()->state_dict();
  // Drop two keys, rename nothing, add two unknown keys, and give two entries the wrong shape.
  nn::NamedTensors broken;
  for (const auto& [n, t] : state) {
    if (n == "0.bias" || n == "3.steps") continue;
    if (n == "1.weight") broken.emplace_back(n, zeros({6}));
    else if (n == "3.fc.weight") broken.emplace_back(n, zeros({3, 2}));
    else broken.emplace_back(n, t);
  }
  broken.emplace_back("extra.weight", zeros({1}));
  broken.emplace_back("3.fc.gamma", zeros({1}));
  const std::vector<double> before = doubles(std::dynamic_pointer_cast<nn::Linear>((*model)[0])->weight);
  std::string msg = error_message([&] { model->load_state_dict(broken); });
  CHECK_THAT(msg, Catch::Contains("load_state_dict"));
  CHECK_THAT(msg, Catch::Contains("missing keys: 0.bias, 3.steps"));
  CHECK_THAT(msg, Catch::Contains("unexpected keys: extra.weight, 3.fc.gamma"));
  CHECK_THAT(msg, Catch::Contains("size mismatch for 1.weight: checkpoint has shape [6], the model has [3]"));
  CHECK_THAT(msg, Catch::Contains("size mismatch for 3.fc.weight: checkpoint has shape [3, 2], the model has [2, 3]"));
  {
    // Integer weights for a float parameter are refused (a float64 state for float32 is a cast).
    nn::Linear lin(3, 2);
    auto state = lin.state_dict();
    auto as_int = state;
    as_int[0].second = as_int[0].second.to(kInt32);
    CHECK_THROWS_WITH(lin.load_state_dict(as_int), Catch::Contains("dtype mismatch for weight: checkpoint has dtype int32"));
    auto as_double = state;
    as_double[0].second = as_double[0].second.to(kFloat64);
    lin.load_state_dict(as_double);
    CHECK(lin.weight.dtype() == kFloat32);
  }
  // A failed strict load leaves the model unchanged.
  check_close(std::dynamic_pointer_cast<nn::Linear>((*model)[0])->weight, before, 0);
}

TEST_CASE("non-strict load copies what matches by name and shape and skips the rest", "[nn][module][state]") {
  manual_seed(5);
  auto model = make_model();
  auto source = make_model();
  auto src = source->state_dict();
  nn::NamedTensors partial;
  for (const auto& [n, t] : src) {
    if (n == "0.weight") continue;                              // missing
    if (n == "3.fc.bias") partial.emplace_back(n, zeros({7}));  // wrong shape
    else partial.emplace_back(n, t);
  }
  partial.emplace_back("not.a.key", ones({2}));  // unexpected
  auto own_before = model->state_dict();
  const std::vector<double> w0 = doubles(own_before[0].second), fcb = doubles(own_before[9].second);
  REQUIRE_NOTHROW(model->load_state_dict(partial, /*strict=*/false));
  auto own = model->state_dict();
  for (size_t i = 0; i < own.size(); ++i) {
    INFO(own[i].first);
    if (own[i].first == "0.weight") check_close(own[i].second, w0, 0);
    else if (own[i].first == "3.fc.bias") check_close(own[i].second, fcb, 0);
    else CHECK(equal(own[i].second, src[i].second));
  }
}

TEST_CASE("load_state_dict converts a float64 checkpoint into a float32 model", "[nn][module][state]") {
  nn::Linear a(3, 2), b(3, 2);
  a.to(kFloat64);
  b.load_state_dict(a.state_dict());
  CHECK(b.weight.dtype() == kFloat32);
  check_close(b.weight, doubles(a.weight), 1e-7);
}

TEST_CASE("str() prints the module tree with each layer's options", "[nn][module]") {
  nn::Sequential model{std::make_shared<nn::Linear>(4, 2), std::make_shared<nn::ReLU>()};
  const std::string s = model.str();
  CHECK_THAT(s, Catch::Contains("Sequential("));
  CHECK_THAT(s, Catch::Contains("(0): Linear(in_features=4, out_features=2"));
  CHECK_THAT(s, Catch::Contains("(1): ReLU()"));
}

}  // namespace
}  // namespace chorus
