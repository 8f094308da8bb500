// nn::utils::checkpoint (activation recomputation, as torch.utils.checkpoint): gradients bit for
// bit those of the plain run (dropout's masks replayed from the generator's saved state, autocast's
// state restored), parameters reached when the input needs no gradient, the activations really
// not kept, the generator left where the forward left it, on the CPU and sim, and the clear error
// when the function uses a tensor needing a gradient that it was not given.
#include <catch2/catch.hpp>

#include <memory>

#include "autograd/autocast.h"
#include "nn/nn.h"
#include "nn/utils/checkpoint.h"
#include "tensor/cpu_memory.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace chorus;

namespace {

std::shared_ptr<nn::Sequential> block(int64_t width, int depth, bool dropout) {
  manual_seed(11);
  auto net = std::make_shared<nn::Sequential>();
  for (int i = 0; i < depth; ++i) {
    net->push_back(std::make_shared<nn::Linear>(width, width));
    net->push_back(std::make_shared<nn::Tanh>());
    if (dropout) net->push_back(std::make_shared<nn::Dropout>(0.3));
  }
  net->to(kFloat64);
  return net;
}

struct Grads {
  Tensor loss;
  TensorList params;
  Tensor input;
};

// A loss through head(block(x)): the block plain or checkpointed. Same seed before each run.
Grads run(const std::shared_ptr<nn::Sequential>& net, const Tensor& x0, bool checkpointed, bool input_grad,
          Device device = kCPU) {
  for (Tensor& p : net->parameters()) p.set_grad(Tensor());
  Tensor x = x0.detach().to(device);
  if (input_grad) x.requires_grad_(true);
  manual_seed(99);
  Tensor h = (x * 2.0).tanh();  // something before the block, so the block's input has history
  Tensor y = checkpointed ? nn::utils::checkpoint(net, h) : net->forward(h);
  Tensor loss = (y * y).sum() + y.sum();
  loss.backward();
  Grads g{loss.detach().cpu(), {}, input_grad ? x.grad().cpu() : Tensor()};
  for (const Tensor& p : net->parameters()) g.params.push_back(p.grad().cpu());
  return g;
}

void require_equal(const Grads& a, const Grads& b) {
  CHECK(equal(a.loss, b.loss));
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(equal(a.params[i], b.params[i]));
  }
  CHECK(a.input.defined() == b.input.defined());
  if (a.input.defined()) CHECK(equal(a.input, b.input));
}

}  // namespace

TEST_CASE("checkpoint: gradients equal the plain run's bit for bit, dropout included") {
  auto net = block(16, 3, /*dropout=*/true);
  const Tensor x = randn({8, 16}, {.dtype = kFloat64});
  const Grads plain = run(net, x, false, true);
  const Grads ckpt = run(net, x, true, true);
  require_equal(plain, ckpt);
  // The masks matter: another seed gives other gradients (so equality above is not vacuous).
  manual_seed(5);
  const Grads other = [&] {
    for (Tensor& p : net->parameters()) p.set_grad(Tensor());
    Tensor h = (x * 2.0).tanh();
    Tensor y = net->forward(h);
    ((y * y).sum() + y.sum()).backward();
    return Grads{Tensor(), {net->parameters()[0].grad().clone()}, Tensor()};
  }();
  CHECK_FALSE(equal(other.params[0], plain.params[0]));
}

TEST_CASE("checkpoint: parameters get gradients when the input needs none") {
  auto net = block(12, 2, false);
  const Tensor x = randn({4, 12}, {.dtype = kFloat64});
  require_equal(run(net, x, false, false), run(net, x, true, false));
}

TEST_CASE("checkpoint: backward leaves the generator where forward left it") {
  auto net = block(8, 2, true);
  Tensor x = randn({4, 8}, {.dtype = kFloat64});
  manual_seed(3);
  Tensor y = nn::utils::checkpoint(net, x);
  const uint64_t offset = default_generator().offset();
  y.sum().backward();
  CHECK(default_generator().offset() == offset);
}

TEST_CASE("checkpoint: the block's activations are not kept until backward") {
  // 8 layers of 256 on 64 rows in float64 (128 KiB an activation): a plain forward keeps every
  // tanh's output (each also the next Linear's saved input): 8 of them (measured: 1 MiB); the
  // checkpointed one keeps only the block's output (its input is the caller's; measured: 128 KiB).
  auto net = block(256, 8, false);
  const Tensor x = randn({64, 256}, {.dtype = kFloat64}).requires_grad_(true);
  auto held_after_forward = [&](bool checkpointed) {
    const size_t before = cpu_memory_allocated();
    Tensor y = checkpointed ? nn::utils::checkpoint(net, x) : net->forward(x);
    const size_t held = cpu_memory_allocated() - before;
    y.sum().backward();
    return held;
  };
  const size_t plain = held_after_forward(false), ckpt = held_after_forward(true);
  INFO("plain " << plain << " bytes, checkpointed " << ckpt << " bytes");
  const size_t activation = 64 * 256 * sizeof(double);
  CHECK(plain >= 8 * activation);
  CHECK(ckpt <= activation);
}

TEST_CASE("checkpoint: under autocast, gradients equal the plain autocast run's") {
  auto net = block(16, 2, false);
  net->to(kFloat32);
  const Tensor x = randn({8, 16});
  auto once = [&](bool checkpointed) {
    autocast::AutocastGuard amp(DeviceType::CPU, kBFloat16);
    return run(net, x, checkpointed, true);
  };
  require_equal(once(false), once(true));
}

TEST_CASE("checkpoint: on sim:0 as on the CPU") {
  auto net = block(16, 2, true);
  const Tensor x = randn({8, 16}, {.dtype = kFloat64});
  const Grads cpu = run(net, x, false, true);
  net->to(Device::sim(0));
  const Grads sim = run(net, x, true, true, Device::sim(0));
  require_equal(cpu, sim);
  net->to(kCPU);
}

TEST_CASE("checkpoint: a tensor that needs a gradient but was not given is an error, not a lost gradient") {
  auto net = block(6, 1, false);
  Tensor x = randn({3, 6}, {.dtype = kFloat64}).requires_grad_(true);
  nn::Module* m = net.get();
  // The module's parameters not passed: their gradients would be lost.
  TensorList y = nn::utils::checkpoint([m](const TensorList& in) { return TensorList{m->forward(in[0])}; }, {x});
  CHECK_THROWS_WITH(y[0].sum().backward(), Catch::Contains("neither its inputs nor in `params`") &&
                                               Catch::Contains("[6, 6]"));
  CHECK_THROWS_WITH(nn::utils::checkpoint(nn::utils::CheckpointFn(), {x}), Catch::Contains("no function given"));
}

// Pipeline blocks pass labels and masks along: such outputs (integer, or an input returned as it
// is that needs no gradient) come back without one; the computed output still has its gradient.
TEST_CASE("checkpoint: labels and masks passed along come back without a gradient") {
  auto net = block(4, 1, false);
  Tensor x = randn({3, 4}, {.dtype = kFloat64}).requires_grad_(true);
  Tensor mask = ones({3, 4}, {.dtype = kFloat64});
  Tensor labels = zeros({3}, {.dtype = kInt64});
  TensorList out = nn::utils::checkpoint(
      [&](const TensorList& in) { return TensorList{net->forward(in[0]) * in[1], in[1], in[2]}; }, {x, mask, labels},
      net->parameters());
  REQUIRE(out.size() == 3);
  CHECK(out[0].requires_grad());
  CHECK_FALSE(out[1].requires_grad());
  CHECK_FALSE(out[2].requires_grad());
  out[0].sum().backward();
  Tensor plain_x = x.detach().requires_grad_(true);
  (net->forward(plain_x) * mask).sum().backward();
  CHECK((x.grad() - plain_x.grad()).abs().max().item<double>() == 0);
}
