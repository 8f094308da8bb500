// RMSprop and Adagrad against libtorch 1.13's torch::optim on the same parameters and gradients
// (8 steps, every option on); Adamax against its update written out; their state through
// state_dict; the new schedulers' learning rates at chosen steps; ReduceLROnPlateau's patience,
// cooldown and state.
#include <torch/optim/adagrad.h>
#include <torch/optim/rmsprop.h>
#include "tests/libtorch_testing.h"  // after the torch headers ([Narrow torch headers])

#include <cmath>

#include "optim/optim.h"
#include "tensor/ops.h"

namespace {

using chorus::Tensor;

using chorus::testing::max_diff;
using chorus::testing::to_torch;

// 8 steps of both optimizers on the same parameter with the same gradients; the largest
// difference of the parameters after each step.
template <typename MakeChorus, typename MakeTorch>
double run_both(MakeChorus make_chorus, MakeTorch make_torch) {
  chorus::manual_seed(7);
  Tensor p = chorus::randn({5, 4}, {.dtype = chorus::kFloat64}).requires_grad_();
  torch::Tensor tp = to_torch(p).requires_grad_();
  auto opt = make_chorus(std::vector<Tensor>{p});
  auto topt = make_torch(std::vector<torch::Tensor>{tp});
  double worst = 0;
  for (int step = 0; step < 8; ++step) {
    const Tensor g = chorus::randn({5, 4}, {.dtype = chorus::kFloat64});
    p.mutable_grad() = g.clone();
    tp.mutable_grad() = to_torch(g);
    opt->step();
    topt->step();
    worst = std::max(worst, max_diff(p, tp));
  }
  return worst;
}

}  // namespace

TEST_CASE("RMSprop and Adagrad equal libtorch's", "[optim][libtorch]") {
  torch::set_num_threads(1);
  namespace o = chorus::optim;
  for (bool centered : {false, true}) {
    for (double momentum : {0.0, 0.9}) {
      INFO("RMSprop centered " << centered << " momentum " << momentum);
      const double d = run_both(
          [&](std::vector<Tensor> ps) {
            return std::make_unique<o::RMSprop>(ps, o::RMSpropOptions{.lr = 0.01, .alpha = 0.9, .eps = 1e-6,
                                                                     .weight_decay = 0.1, .momentum = momentum,
                                                                     .centered = centered});
          },
          [&](std::vector<torch::Tensor> ps) {
            return std::make_unique<torch::optim::RMSprop>(
                ps, torch::optim::RMSpropOptions(0.01).alpha(0.9).eps(1e-6).weight_decay(0.1).momentum(momentum).centered(
                        centered));
          });
      CHECK(d < 1e-13);
    }
  }
  const double d = run_both(
      [](std::vector<Tensor> ps) {
        return std::make_unique<o::Adagrad>(ps, o::AdagradOptions{.lr = 0.1, .lr_decay = 0.05, .weight_decay = 0.01,
                                                                  .initial_accumulator_value = 0.2, .eps = 1e-8});
      },
      [](std::vector<torch::Tensor> ps) {
        return std::make_unique<torch::optim::Adagrad>(
            ps, torch::optim::AdagradOptions(0.1).lr_decay(0.05).weight_decay(0.01).initial_accumulator_value(0.2).eps(1e-8));
      });
  CHECK(d < 1e-13);
}

TEST_CASE("Adamax follows its update; optimizer states round-trip", "[optim]") {
  namespace o = chorus::optim;
  chorus::manual_seed(3);
  Tensor p = chorus::randn({6}, {.dtype = chorus::kFloat64}).requires_grad_();
  const std::vector<double> p0 = {p[0].item<double>(), p[1].item<double>()};
  o::Adamax opt({p}, {.lr = 0.01, .weight_decay = 0.1});
  double m = 0, u = 0, x = p0[0];
  for (int step = 1; step <= 5; ++step) {
    const double gv = 0.3 * step - 1.0;
    p.mutable_grad() = chorus::full({6}, gv, {.dtype = chorus::kFloat64});
    opt.step();
    const double g = gv + 0.1 * x;
    m = 0.9 * m + 0.1 * g;
    u = std::max(0.999 * u, std::abs(g) + 1e-8);
    x -= 0.01 / (1 - std::pow(0.9, step)) * m / u;
    CHECK(p[0].item<double>() == Approx(x).epsilon(1e-13));
  }
  // The state goes through state_dict into a fresh optimizer, which then steps identically.
  Tensor q = p.detach().clone().requires_grad_();
  o::Adamax again({q}, {.lr = 0.01, .weight_decay = 0.1});
  again.load_state_dict(opt.state_dict());
  p.mutable_grad() = chorus::full({6}, 0.5, {.dtype = chorus::kFloat64});
  q.mutable_grad() = chorus::full({6}, 0.5, {.dtype = chorus::kFloat64});
  opt.step();
  again.step();
  CHECK(chorus::equal(p, q));
  CHECK_THROWS_WITH(o::Adamax({p}, {.beta1 = 1.0}), Catch::Contains("invalid beta1 1"));
  CHECK_THROWS_WITH(o::RMSprop({p}, {.lr = -1}), Catch::Contains("invalid lr -1"));
  o::RMSprop rms({q}, {.momentum = 0.9, .centered = true});
  q.mutable_grad() = chorus::ones({6}, {.dtype = chorus::kFloat64});
  rms.step();
  o::RMSprop rms2({q}, {.momentum = 0.9, .centered = true});
  rms2.load_state_dict(rms.state_dict());
  CHECK(rms2.state_dict().size() == rms.state_dict().size());
}

TEST_CASE("ExponentialLR, LinearLR, LambdaLR and OneCycleLR learning rates", "[optim][schedulers]") {
  namespace o = chorus::optim;
  Tensor p = chorus::zeros({1}).requires_grad_();
  o::SGD sgd({p}, {.lr = 0.5});
  o::ExponentialLR exp_lr(sgd, 0.5);
  exp_lr.step();
  exp_lr.step();
  CHECK(sgd.param_groups()[0].lr() == Approx(0.125));
  o::SGD sgd2({p}, {.lr = 1.0});
  o::LinearLR lin(sgd2, 0.25, 1.0, 3);
  CHECK(sgd2.param_groups()[0].lr() == Approx(0.25));  // applied at construction, as PyTorch
  lin.step();
  CHECK(sgd2.param_groups()[0].lr() == Approx(0.5));
  for (int i = 0; i < 5; ++i) lin.step();
  CHECK(sgd2.param_groups()[0].lr() == Approx(1.0));
  o::SGD sgd3({p}, {.lr = 2.0});
  o::LambdaLR lam(sgd3, [](int64_t epoch) { return 1.0 / (1 + epoch); });
  lam.step();
  lam.step();
  lam.step();
  CHECK(sgd3.param_groups()[0].lr() == Approx(0.5));
  // OneCycleLR, total 10, pct 0.3, max 1, div 25, final 1e4: 0.04 at 0, 0.52 at 1 (half-way up the
  // cosine), 1.0 at 2, then down to 4e-6 at 9 (half-way, step 5.5, would be ~0.5).
  o::SGD sgd4({p}, {.lr = 0.123});
  o::OneCycleLR one(sgd4, 1.0, 10);
  std::vector<double> lrs = {sgd4.param_groups()[0].lr()};
  for (int i = 1; i < 10; ++i) {
    one.step();
    lrs.push_back(sgd4.param_groups()[0].lr());
  }
  CHECK(lrs[0] == Approx(0.04));
  CHECK(lrs[1] == Approx(0.52));
  CHECK(lrs[2] == Approx(1.0));
  CHECK(lrs[9] == Approx(4e-6));
  for (int i = 3; i < 10; ++i) CHECK(lrs[i] < lrs[i - 1]);
  CHECK(lrs[5] == Approx(4e-6 + (1 - 4e-6) / 2 * (std::cos(M_PI * 3.0 / 7.0) + 1)));
  CHECK_THROWS_WITH(o::OneCycleLR(sgd4, 1.0, 10, 1.5), Catch::Contains("pct_start is 1.5"));
}

TEST_CASE("SequentialLR runs its schedulers one after another, each from its own epoch 0", "[optim][schedulers]") {
  namespace o = chorus::optim;
  Tensor p = chorus::zeros({1}).requires_grad_();
  o::SGD sgd({p}, {.lr = 0.5});
  auto warmup = std::make_shared<o::LinearLR>(sgd, 0.1, 1.0, 4);
  auto cosine = std::make_shared<o::CosineAnnealingLR>(sgd, 6, 0.01);
  auto steps = std::make_shared<o::StepLR>(sgd, 2, 0.5);
  o::SequentialLR seq(sgd, {warmup, cosine, steps}, {4, 9});
  // PyTorch 1.13 (python3-torch): the same schedulers in torch.optim.lr_scheduler.SequentialLR,
  // the lr after construction and after each of 14 steps.
  const std::vector<double> torch_lrs = {0.05, 0.1625, 0.275, 0.38750000000000007, 0.5, 0.4671762239271875, 0.3775,
                                         0.255, 0.13250000000000006, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125};
  std::vector<double> lrs = {sgd.param_groups()[0].lr()};
  for (int i = 0; i < 14; ++i) {
    seq.step();
    lrs.push_back(sgd.param_groups()[0].lr());
  }
  REQUIRE(lrs.size() == torch_lrs.size());
  for (size_t i = 0; i < lrs.size(); ++i) {
    INFO("epoch " << i);
    CHECK(lrs[i] == Approx(torch_lrs[i]).epsilon(1e-12));
  }
  // Resumed from its state, it continues where it was.
  o::SGD sgd2({p}, {.lr = 0.5});
  auto w2 = std::make_shared<o::LinearLR>(sgd2, 0.1, 1.0, 4);
  auto c2 = std::make_shared<o::CosineAnnealingLR>(sgd2, 6, 0.01);
  auto s2 = std::make_shared<o::StepLR>(sgd2, 2, 0.5);
  o::SequentialLR resumed(sgd2, {w2, c2, s2}, {4, 9});
  resumed.load_state_dict(seq.state_dict());
  seq.step();
  resumed.step();
  CHECK(sgd2.param_groups()[0].lr() == sgd.param_groups()[0].lr());
  CHECK_THROWS_WITH(o::SequentialLR(sgd, {warmup, cosine}, {4, 9}), Catch::Contains("2 schedulers need 1 milestones, got 2"));
  CHECK_THROWS_WITH(o::SequentialLR(sgd, {warmup, cosine, steps}, {5, 5}), Catch::Contains("increasing, got 5 at position 1"));
  CHECK_THROWS_WITH(o::SequentialLR(sgd, {warmup, c2}, {4}), Catch::Contains("scheduler 1 was made for another optimizer"));
}

TEST_CASE("ReduceLROnPlateau: patience, cooldown, min_lr and its state", "[optim][schedulers]") {
  namespace o = chorus::optim;
  Tensor p = chorus::zeros({1}).requires_grad_();
  o::SGD sgd({p}, {.lr = 1.0});
  o::ReduceLROnPlateau plateau(sgd, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.2});
  for (double metric : {1.0, 0.9, 0.95, 0.95}) plateau.step(metric);  // 2 bad epochs: not yet
  CHECK(sgd.param_groups()[0].lr() == 1.0);
  plateau.step(0.95);  // third bad epoch: halve
  CHECK(sgd.param_groups()[0].lr() == 0.5);
  plateau.step(0.95);  // cooldown
  for (int i = 0; i < 3; ++i) plateau.step(0.95);
  CHECK(sgd.param_groups()[0].lr() == 0.25);
  for (int i = 0; i < 8; ++i) plateau.step(0.95);
  CHECK(sgd.param_groups()[0].lr() == 0.2);  // floored at min_lr
  o::ReduceLROnPlateau copy(sgd, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.2});
  copy.load_state_dict(plateau.state_dict());
  CHECK(copy.num_bad_epochs() == plateau.num_bad_epochs());
  CHECK_THROWS_WITH(o::ReduceLROnPlateau(sgd, {.factor = 2.0}), Catch::Contains("factor is 2"));
  // A refused state (a negative counter) changes nothing; best was taken first before.
  auto bad = plateau.state_dict();
  for (auto& [name, t] : bad) {
    if (name == "best") t = chorus::full({}, -5.0, {.dtype = chorus::kFloat64});
    if (name == "num_bad_epochs") t = chorus::full({}, -1.0, {.dtype = chorus::kFloat64});
  }
  const auto before = copy.state_dict();
  CHECK_THROWS_WITH(copy.load_state_dict(bad), Catch::Contains("'num_bad_epochs' is -1, expected a whole number >= 0"));
  const auto after = copy.state_dict();
  for (size_t i = 0; i < before.size(); ++i) {
    INFO(before[i].first);
    CHECK(after[i].second.item<double>() == before[i].second.item<double>());
  }
}
