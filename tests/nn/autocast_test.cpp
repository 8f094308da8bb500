// Autocast (autograd/autocast.h): which ops run in bfloat16/float16 and which in float32 inside a
// guard, float32 master weights with float32 gradients, the weight-cast cache (reused, but never
// stale or cut out of the graph), the backward pass unaffected by the guard, guards scoped to one
// device type, and an MLP's and a transformer block's training step under bf16 and fp16 close to
// float32.
#include <catch2/catch.hpp>

#include <memory>
#include <utility>

#include "autograd/autocast.h"
#include "nn/nn.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus {
namespace {

namespace F = nn::functional;
using autocast::AutocastGuard;

// ||a - b|| / ||b|| (Frobenius), in float64. Not the largest elementwise difference: a ReLU whose
// input is within rounding of 0 flips in low precision and zeroes (or not) a whole row of a
// gradient, which is a legitimate low-precision difference of one unit.
double relative_difference(const Tensor& a, const Tensor& b) {
  const Tensor a64 = a.detach().to(kFloat64), b64 = b.detach().to(kFloat64);
  return norm(sub(a64, b64)).item<double>() / std::max(norm(b64).item<double>(), 1e-300);
}

// GELU, not ReLU: smooth, so a pre-activation within rounding of 0 does not flip a whole gradient
// row between float32 and low precision (ReLU MLPs show 5-6% differences in one layer from that alone).
std::shared_ptr<nn::Sequential> make_mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(32, 64), std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(64, 64),
      std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(64, 10)});
}

}  // namespace

TEST_CASE("autocast: matrix products run in the low dtype, sensitive ops in float32", "[nn][autocast]") {
  manual_seed(1);
  Tensor x = randn({4, 8}), w = randn({6, 8}), b = randn({6});
  Tensor a3 = randn({2, 4, 8}), b3 = randn({2, 8, 3});
  for (DType low : {kBFloat16, kFloat16}) {
    INFO(dtype_name(low));
    AutocastGuard amp(DeviceType::CPU, low);
    CHECK(autocast::is_enabled(DeviceType::CPU));
    CHECK(autocast::get_dtype(DeviceType::CPU) == low);
    Tensor y = F::linear(x, w, b);
    CHECK(y.dtype() == low);
    CHECK(mm(x, w.t()).dtype() == low);
    CHECK(matmul(x, w.t()).dtype() == low);
    CHECK(bmm(a3, b3).dtype() == low);
    CHECK(addmm(b, x, w.t()).dtype() == low);
    CHECK(F::conv2d(randn({1, 2, 5, 5}), randn({3, 2, 3, 3})).dtype() == low);
    // Sensitive ops: float32 whatever the input.
    CHECK(softmax(y, 1).dtype() == kFloat32);
    CHECK(log_softmax(y, 1).dtype() == kFloat32);
    CHECK(sum(y).dtype() == kFloat32);
    CHECK(mean(y).dtype() == kFloat32);
    CHECK(F::layer_norm(y, {6}).dtype() == kFloat32);
    CHECK(F::cross_entropy(y, randint(0, 6, {4})).dtype() == kFloat32);
    CHECK(F::mse_loss(y, randn({4, 6})).dtype() == kFloat32);
    // Others keep their input's dtype; mixing promotes to float32.
    CHECK(relu(y).dtype() == low);
    CHECK(add(y, randn({4, 6})).dtype() == kFloat32);
    // float64 is never lowered.
    CHECK(mm(x.to(kFloat64), w.t().to(kFloat64)).dtype() == kFloat64);
    // The low-precision product is the float32 one rounded: close, not equal.
    const double diff = relative_difference(y.to(kFloat32), add(mm(x, w.t()).to(kFloat32), b));
    CHECK(diff > 0);
    CHECK(diff < (low == kBFloat16 ? 3e-2 : 3e-3));
  }
  CHECK_FALSE(autocast::is_enabled(DeviceType::CPU));
  // Outside the guard nothing changes.
  CHECK(F::linear(x, w, b).dtype() == kFloat32);
  CHECK(softmax(x.to(kBFloat16), 1).dtype() == kBFloat16);
}

TEST_CASE("autocast: float32 weights get float32 gradients close to float32 training's", "[nn][autocast]") {
  manual_seed(2);
  auto net = make_mlp();
  Tensor x = randn({16, 32}), y = randint(0, 10, {16});
  Tensor loss32 = F::cross_entropy(net->forward(x), y);
  loss32.backward();
  std::vector<Tensor> grads32;
  for (const Tensor& p : net->parameters()) grads32.push_back(p.grad().clone());
  for (DType low : {kBFloat16, kFloat16}) {
    INFO(dtype_name(low));
    for (Tensor& p : net->parameters()) p.mutable_grad() = Tensor();
    Tensor loss;
    {
      AutocastGuard amp(DeviceType::CPU, low);
      loss = F::cross_entropy(net->forward(x), y);
    }
    CHECK(loss.dtype() == kFloat32);
    const double loss_diff = relative_difference(loss, loss32);
    INFO("loss " << loss.item<float>() << " vs float32 " << loss32.item<float>() << ", relative difference " << loss_diff);
    CHECK(loss_diff < (low == kBFloat16 ? 1e-2 : 2e-3));
    loss.backward();
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      REQUIRE(params[i].dtype() == kFloat32);
      REQUIRE(params[i].grad().dtype() == kFloat32);
      const double d = relative_difference(params[i].grad(), grads32[i]);
      INFO("parameter " << i << " gradient relative difference " << d);
      CHECK(d > 0);  // it did run in low precision
      CHECK(d < (low == kBFloat16 ? 5e-2 : 1e-2));
    }
  }
}

TEST_CASE("autocast: backward inside the guard equals backward outside it", "[nn][autocast]") {
  manual_seed(3);
  auto net = make_mlp();
  Tensor x = randn({8, 32}), y = randint(0, 10, {8});
  auto grads = [&](bool backward_inside) {
    for (Tensor& p : net->parameters()) p.mutable_grad() = Tensor();
    Tensor loss;
    {
      AutocastGuard amp(DeviceType::CPU);
      loss = F::cross_entropy(net->forward(x), y);
      if (backward_inside) loss.backward();
    }
    if (!backward_inside) loss.backward();
    std::vector<Tensor> g;
    for (const Tensor& p : net->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto outside = grads(false), inside = grads(true);
  for (size_t i = 0; i < outside.size(); ++i) CHECK(relative_difference(inside[i], outside[i]) == 0.0);
}

TEST_CASE("autocast: the weight cache is reused, refreshed after in-place updates, and keeps the graph",
          "[nn][autocast]") {
  manual_seed(4);
  Tensor w = randn({5, 7}).requires_grad_();
  Tensor x = randn({3, 7});
  AutocastGuard amp(DeviceType::CPU);
  // Two uses of the weight in one scope share one cast; the gradient still sums both uses.
  Tensor out = add(F::linear(x, w), F::linear(x, w));
  sum(out).backward();
  Tensor expected = mul(sum(x, {0}, true).expand({5, 7}), 2.0);
  CHECK(relative_difference(w.grad(), expected) < 2e-2);
  // An in-place update of the weight (as an optimizer step) is seen by the next forward.
  {
    NoGradGuard no_grad;
    w.fill_(1.0);
  }
  Tensor y = F::linear(x, w);
  CHECK(relative_difference(y.to(kFloat32), sum(x, {1}, true).expand({3, 5})) < 2e-2);
  // A forward under NoGradGuard (evaluation) does not leave a cast without history behind.
  Tensor w2 = randn({5, 7}).requires_grad_();
  {
    NoGradGuard no_grad;
    (void)F::linear(x, w2);
  }
  sum(F::linear(x, w2)).backward();
  REQUIRE(w2.grad().defined());
  CHECK(w2.grad().dtype() == kFloat32);
}

// autograd/autocast.cpp, [A cast per stream]: one weight used by forwards on two streams of sim:0
// under one guard. Each stream gets its own low-precision copy, made and read on it; with one copy
// shared (the cache keyed by the weight alone, as until 2026-12-04), the second stream's product read
// the first stream's cast with nothing ordering them, which sim's stream-order sanitizer reports.
// The weight's gradient is the CPU's under the same autocast within one bfloat16 rounding (2^-8:
// on the CPU the two uses share one cast, whose bfloat16 gradient sums both before the float32
// cast; here each cast's gradient is cast, then summed in float32).
TEST_CASE("autocast on sim: a weight used on two streams gets a cast on each", "[nn][autocast][sim]") {
  manual_seed(5);
  const Device sim0 = Device::sim(0);
  Tensor w = randn({5, 7}).requires_grad_();
  Tensor x = randn({3, 7});
  {
    AutocastGuard amp(DeviceType::CPU, kBFloat16);
    sum(add(F::linear(x, w), F::linear(x, w))).backward();
  }
  Tensor wd = w.detach().to(sim0).requires_grad_();
  Tensor xd = x.to(sim0);
  const Stream caller = current_stream(sim0), s1 = stream_from_pool(sim0), s2 = stream_from_pool(sim0);
  REQUIRE_FALSE(s1 == s2);
  REQUIRE_FALSE(s1 == caller);
  REQUIRE_FALSE(s2 == caller);
  {
    AutocastGuard amp(DeviceType::Sim, kBFloat16);
    Event inputs;
    inputs.record(caller);
    Tensor a, b;
    for (const auto& [stream, out] : {std::pair<Stream, Tensor*>{s1, &a}, std::pair<Stream, Tensor*>{s2, &b}}) {
      stream.wait(inputs);
      StreamGuard on(stream);
      *out = F::linear(xd, wd);
    }
    for (const Stream& s : {s1, s2}) {
      Event done;
      done.record(s);
      caller.wait(done);
    }
    sum(add(a, b)).backward();
  }
  REQUIRE(wd.grad().defined());
  CHECK(relative_difference(wd.grad().cpu(), w.grad()) < 0.0039);
}

TEST_CASE("autocast: guards nest, disable, and apply to one device type", "[nn][autocast]") {
  Tensor x = randn({4, 4});
  {
    AutocastGuard amp(DeviceType::CPU, kBFloat16);
    {
      AutocastGuard off(DeviceType::CPU, std::nullopt, false);
      CHECK(mm(x, x).dtype() == kFloat32);
    }
    {
      AutocastGuard fp16(DeviceType::CPU, kFloat16);
      CHECK(mm(x, x).dtype() == kFloat16);
    }
    CHECK(mm(x, x).dtype() == kBFloat16);
    // A guard for the sim device does not touch CPU tensors, and a CPU guard not sim tensors.
    Tensor xs = x.to(Device::sim());
    CHECK(mm(xs, xs).dtype() == kFloat32);
    {
      AutocastGuard sim(DeviceType::Sim);
      CHECK(autocast::get_dtype(DeviceType::Sim) == kFloat16);
      CHECK(mm(xs, xs).dtype() == kFloat16);
      CHECK(relative_difference(mm(xs, xs).to(kCPU).to(kFloat32), mm(x, x).to(kFloat32)) < 1e-2);
    }
  }
  CHECK(autocast::default_dtype(DeviceType::CPU) == kBFloat16);
  CHECK(autocast::default_dtype(DeviceType::CUDA) == kFloat16);
  CHECK_THROWS_WITH(AutocastGuard(DeviceType::CPU, kFloat32),
                    Catch::Contains("got dtype float32 for CPU, expected bfloat16 or float16"));
}

TEST_CASE("autocast: a transformer encoder layer's training step in bf16 is close to float32", "[nn][autocast]") {
  manual_seed(5);
  nn::TransformerEncoderLayer layer(32, 4, {.dim_feedforward = 64, .dropout = 0.0, .batch_first = true});
  Tensor x = randn({2, 6, 32}), target = randn({2, 6, 32});
  Tensor loss32 = F::mse_loss(layer.forward(x), target);
  loss32.backward();
  std::vector<Tensor> grads32;
  for (const Tensor& p : layer.parameters()) grads32.push_back(p.grad().clone());
  for (Tensor& p : layer.parameters()) p.mutable_grad() = Tensor();
  Tensor loss;
  {
    AutocastGuard amp(DeviceType::CPU, kBFloat16);
    loss = F::mse_loss(layer.forward(x), target);
  }
  loss.backward();
  INFO("loss " << loss.item<float>() << " vs float32 " << loss32.item<float>());
  CHECK(relative_difference(loss, loss32) < 1e-2);
  const auto params = layer.parameters();
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    REQUIRE(params[i].grad().dtype() == kFloat32);
    worst = std::max(worst, relative_difference(params[i].grad(), grads32[i]));
  }
  INFO("worst parameter-gradient relative difference " << worst);
  CHECK(worst > 0);
  CHECK(worst < 2e-2);
}

}  // namespace chorus
