// GradScaler (optim/grad_scaler.h): the loss scaled, gradients unscaled exactly (a power-of-two
// scale), a step with an injected inf or NaN skipped and the scale backed off, growth after
// growth_interval good steps, misuse refused, the state through a checkpoint, and float16 autocast
// training with the scaler close to float32 training.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "autograd/autocast.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/grad_scaler.h"
#include "optim/optim.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace F = nn::functional;

std::shared_ptr<nn::Sequential> make_mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(20, 32), std::make_shared<nn::GELU>(), std::make_shared<nn::Linear>(32, 5)});
}

std::vector<Tensor> snapshot(nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (sub(a[i], b[i]).abs().max().item<float>() != 0.0f) return false;
  return true;
}

}  // namespace

TEST_CASE("GradScaler: scaled loss, exact unscaling, and the step it takes", "[optim][amp]") {
  manual_seed(1);
  auto net = make_mlp();
  auto twin = make_mlp();
  twin->load_state_dict(net->state_dict());
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD twin_opt(twin->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  Tensor x = randn({8, 20}), y = randint(0, 5, {8});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    Tensor loss = F::cross_entropy(net->forward(x), y);
    Tensor scaled = scaler.scale(loss);
    CHECK(scaled.item<float>() == loss.item<float>() * 65536.0f);
    scaled.backward();
    CHECK(scaler.step(opt));
    CHECK_FALSE(scaler.found_inf(opt));
    scaler.update();
    // The same step without scaling: a power-of-two scale unscales exactly, so the parameters agree
    // bit for bit.
    twin_opt.zero_grad();
    F::cross_entropy(twin->forward(x), y).backward();
    twin_opt.step();
    CHECK(same(snapshot(*net), snapshot(*twin)));
  }
  CHECK(scaler.growth_tracker() == 3);
}

TEST_CASE("GradScaler: a step with inf or NaN is skipped, the scale backs off, then recovers", "[optim][amp]") {
  manual_seed(2);
  auto net = make_mlp();
  optim::SGD opt(net->parameters(), {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2});
  Tensor x = randn({8, 20}), y = randint(0, 5, {8});
  auto backward = [&](double poison) {
    opt.zero_grad();
    scaler.scale(F::cross_entropy(net->forward(x), y)).backward();
    if (poison != 0.0) {
      NoGradGuard no_grad;
      Tensor g = net->parameters()[2].grad();  // the second layer's weight
      g.view({-1})[3].fill_(poison);
    }
  };
  for (double poison : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::quiet_NaN()}) {
    INFO("injected " << poison);
    const double before = scaler.get_scale();
    const auto params = snapshot(*net);
    backward(poison);
    CHECK_FALSE(scaler.step(opt));
    CHECK(scaler.found_inf(opt));
    CHECK(same(snapshot(*net), params));  // nothing moved
    scaler.update();
    CHECK(scaler.get_scale() == before * 0.5);
    CHECK(scaler.growth_tracker() == 0);
  }
  CHECK(scaler.get_scale() == 128.0);
  // Recovers: good steps train again, and growth_interval = 2 of them double the scale.
  const auto params = snapshot(*net);
  backward(0.0);
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK_FALSE(same(snapshot(*net), params));
  CHECK(scaler.get_scale() == 128.0);
  CHECK(scaler.growth_tracker() == 1);
  backward(0.0);
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 256.0);
  CHECK(scaler.growth_tracker() == 0);
  // unscale_ before clipping: the clip sees true gradients, and step() does not unscale again.
  backward(0.0);
  scaler.unscale_(opt);
  const double norm = optim::clip_grad_norm_(net->parameters(), 1e9);
  CHECK(norm < 100.0);  // scaled by 256 it would be hundreds of times larger than the loss's gradient
  const Tensor g = net->parameters()[0].grad().clone();
  CHECK(scaler.step(opt));
  CHECK(sub(net->parameters()[0].grad(), g).abs().max().item<float>() == 0.0f);
  scaler.update(512.0);
  CHECK(scaler.get_scale() == 512.0);
}

// update(new_scale) sets the scale and leaves the count of good steps alone, as PyTorch's does
// (until 2026-12-04 it reset the count, so a scale set by hand grew growth_interval steps later).
TEST_CASE("GradScaler: update(new_scale) keeps counting good steps toward the next growth", "[optim][amp]") {
  manual_seed(2);
  auto net = make_mlp();
  optim::SGD opt(net->parameters(), {.lr = 0.01});
  optim::GradScaler scaler({.init_scale = 256.0, .growth_interval = 3});
  Tensor x = randn({8, 20}), y = randint(0, 5, {8});
  auto good_step = [&] {
    opt.zero_grad();
    scaler.scale(F::cross_entropy(net->forward(x), y)).backward();
    REQUIRE(scaler.step(opt));
    scaler.update();
  };
  good_step();
  good_step();
  scaler.update(1024.0);  // the scale set by hand; not a step
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.growth_tracker() == 2);
  good_step();  // the third good step in a row: growth
  CHECK(scaler.get_scale() == 2048.0);
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("GradScaler: misuse and bad options are refused with what was expected", "[optim][amp]") {
  auto net = make_mlp();
  optim::SGD opt(net->parameters(), {.lr = 0.1});
  optim::GradScaler scaler;
  CHECK_THROWS_WITH(scaler.update(), Catch::Contains("no step() or unscale_() since the last update()"));
  scaler.scale(F::cross_entropy(net->forward(randn({4, 20})), randint(0, 5, {4}))).backward();
  scaler.unscale_(opt);
  CHECK_THROWS_WITH(scaler.unscale_(opt), Catch::Contains("already called for this optimizer"));
  scaler.step(opt);
  CHECK_THROWS_WITH(scaler.step(opt), Catch::Contains("called twice for this optimizer"));
  CHECK_THROWS_WITH(scaler.update(-1.0), Catch::Contains("new_scale is -1; expected a finite number > 0"));
  CHECK_THROWS_WITH(optim::GradScaler({.init_scale = 0}), Catch::Contains("init_scale is 0"));
  CHECK_THROWS_WITH(optim::GradScaler({.growth_factor = 1.0}), Catch::Contains("growth_factor is 1; expected a finite number > 1"));
  CHECK_THROWS_WITH(optim::GradScaler({.backoff_factor = 1.5}), Catch::Contains("backoff_factor is 1.5; expected a number in (0, 1)"));
  CHECK_THROWS_WITH(optim::GradScaler({.growth_interval = 0}), Catch::Contains("growth_interval is 0"));
  CHECK_THROWS_WITH(scaler.scale(randint(0, 5, {2})), Catch::Contains("expected a floating-point tensor"));
  // Disabled: a plain optimizer step, scale 1.
  optim::GradScaler off({.enabled = false});
  Tensor loss = F::cross_entropy(net->forward(randn({4, 20})), randint(0, 5, {4}));
  CHECK(off.scale(loss).item<float>() == loss.item<float>());
  CHECK(off.get_scale() == 1.0);
}

TEST_CASE("GradScaler: its state goes through a checkpoint", "[optim][amp]") {
  optim::GradScaler scaler({.init_scale = 4096.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 10});
  auto net = make_mlp();
  optim::SGD opt(net->parameters(), {.lr = 0.1});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    scaler.scale(F::cross_entropy(net->forward(randn({4, 20})), randint(0, 5, {4}))).backward();
    scaler.step(opt);
    scaler.update();
  }
  nn::Checkpoint c;
  c.model = net->state_dict();
  c.grad_scaler = scaler.state_dict();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/grad_scaler_checkpoint.safetensors";
  c.save(path);
  optim::GradScaler restored;
  restored.load_state_dict(nn::Checkpoint::load(path).grad_scaler);
  CHECK(restored.get_scale() == 4096.0);
  CHECK(restored.growth_tracker() == 3);
  CHECK(restored.state_dict().size() == 5);
  // The factors came back too: 7 more good steps grow the scale by 4.
  for (int i = 0; i < 7; ++i) {
    opt.zero_grad();
    restored.scale(F::cross_entropy(net->forward(randn({4, 20})), randint(0, 5, {4}))).backward();
    restored.step(opt);
    restored.update();
  }
  CHECK(restored.get_scale() == 16384.0);
  // A state missing a key, or with a tracker past the interval, is refused.
  nn::NamedTensors partial = scaler.state_dict();
  partial.pop_back();
  CHECK_THROWS_WITH(restored.load_state_dict(partial), Catch::Contains("the state has no 'growth_tracker'"));
  nn::NamedTensors lying = scaler.state_dict();
  lying.back().second = full({}, int64_t{99}, {.dtype = kInt64});
  CHECK_THROWS_WITH(restored.load_state_dict(lying), Catch::Contains("growth_tracker is 99; expected a count in [0, growth_interval 10)"));
}

TEST_CASE("GradScaler with float16 autocast trains an MLP like float32", "[optim][amp]") {
  manual_seed(5);
  auto net = make_mlp();
  auto ref = make_mlp();
  ref->load_state_dict(net->state_dict());
  optim::Adam opt(net->parameters(), {.lr = 1e-2});
  optim::Adam ref_opt(ref->parameters(), {.lr = 1e-2});
  optim::GradScaler scaler;
  // A fixed random classification task: the first 3 features decide the class.
  Tensor x = randn({64, 20});
  Tensor y = argmax(x.narrow(1, 0, 5), 1);
  double loss16 = 0, loss32 = 0;
  int skipped = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      autocast::AutocastGuard amp(DeviceType::CPU, kFloat16);
      loss = F::cross_entropy(net->forward(x), y);
    }
    scaler.scale(loss).backward();
    skipped += scaler.step(opt) ? 0 : 1;
    scaler.update();
    loss16 = loss.item<float>();
    ref_opt.zero_grad();
    Tensor l32 = F::cross_entropy(ref->forward(x), y);
    l32.backward();
    ref_opt.step();
    loss32 = l32.item<float>();
  }
  INFO("after 60 steps: float16 autocast loss " << loss16 << ", float32 " << loss32 << ", skipped steps " << skipped);
  CHECK(loss32 < 0.5);  // the task is learnt
  CHECK(std::abs(loss16 - loss32) < 0.05 * loss32 + 0.01);
  CHECK(skipped == 0);  // 65536 x these gradients stays within float16's range
}

}  // namespace chorus
