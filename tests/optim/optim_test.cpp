// Optimizers against the update rules written out here in double for 3 steps on random parameters
// and gradients; parameter groups; zero_grad; state_dict round trips; schedulers against their
// closed forms; gradient clipping; option errors.
#include <catch2/catch.hpp>

#include <limits>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <numbers>
#include <vector>

#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

std::vector<double> doubles(const Tensor& t) {
  Tensor c = t.detach().to(kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// A float64 parameter and three fixed random gradients for it.
struct Problem {
  Tensor param;
  std::vector<Tensor> grads;
  explicit Problem(uint64_t seed) {
    Generator gen(seed);
    param = randn({3, 4}, {.dtype = kFloat64}, &gen).requires_grad_();
    for (int i = 0; i < 3; ++i) grads.push_back(randn({3, 4}, {.dtype = kFloat64}, &gen));
  }
  void set_grad(int step) { param.mutable_grad() = grads[step].clone(); }
};

void check_vec(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(tol).margin(tol));
  }
}

TEST_CASE("SGD variants match the update rule for 3 steps", "[optim][sgd]") {
  struct V {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (V v : {V{0, 0, 0, false}, V{0.9, 0, 0, false}, V{0.9, 0.1, 0.01, false}, V{0.8, 0, 0.05, true}}) {
    INFO("momentum " << v.momentum << " dampening " << v.dampening << " wd " << v.wd << " nesterov " << v.nesterov);
    Problem pr(1);
    std::vector<double> w = doubles(pr.param), buf(w.size());
    optim::SGD opt({pr.param}, {.lr = 0.1, .momentum = v.momentum, .dampening = v.dampening, .weight_decay = v.wd,
                                .nesterov = v.nesterov});
    for (int s = 0; s < 3; ++s) {
      pr.set_grad(s);
      opt.step();
      std::vector<double> g = doubles(pr.grads[s]);
      for (size_t i = 0; i < w.size(); ++i) {
        double d = g[i] + v.wd * w[i];
        if (v.momentum != 0) {
          buf[i] = s == 0 ? d : v.momentum * buf[i] + (1 - v.dampening) * d;
          d = v.nesterov ? d + v.momentum * buf[i] : buf[i];
        }
        w[i] -= 0.1 * d;
      }
      check_vec(doubles(pr.param), w);
    }
  }
}

TEST_CASE("Adam, Adam with amsgrad and L2, and AdamW match the update rules for 3 steps", "[optim][adam]") {
  struct V {
    bool decoupled, amsgrad;
    double wd;
  };
  for (V v : {V{false, false, 0}, V{false, true, 0.1}, V{true, false, 0.01}, V{true, true, 0.1}}) {
    INFO("decoupled " << v.decoupled << " amsgrad " << v.amsgrad << " wd " << v.wd);
    Problem pr(2);
    const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-8;
    std::vector<double> w = doubles(pr.param), m(w.size()), s2(w.size()), vmax(w.size());
    optim::AdamOptions o{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = v.wd, .amsgrad = v.amsgrad};
    std::unique_ptr<optim::Optimizer> opt;
    if (v.decoupled) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{pr.param}, o);
    else opt = std::make_unique<optim::Adam>(std::vector<Tensor>{pr.param}, o);
    for (int s = 0; s < 3; ++s) {
      pr.set_grad(s);
      opt->step();
      std::vector<double> g = doubles(pr.grads[s]);
      const double t = s + 1;
      for (size_t i = 0; i < w.size(); ++i) {
        double gi = g[i];
        if (v.decoupled) w[i] *= 1 - lr * v.wd;
        else gi += v.wd * w[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        s2[i] = b2 * s2[i] + (1 - b2) * gi * gi;
        vmax[i] = std::max(vmax[i], s2[i]);
        const double mhat = m[i] / (1 - std::pow(b1, t));
        const double vhat = (v.amsgrad ? vmax[i] : s2[i]) / (1 - std::pow(b2, t));
        w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      }
      check_vec(doubles(pr.param), w, 1e-10);
    }
  }
  CHECK(optim::AdamW::default_options().weight_decay == 0.01);
}

TEST_CASE("parameter groups keep their own options; parameters without grad are skipped", "[optim]") {
  Problem a(3), b(4);
  std::vector<double> wa = doubles(a.param), wb = doubles(b.param);
  optim::SGD opt({optim::ParamGroup{{a.param}, {}}, optim::ParamGroup{{b.param}, {{"lr", 0.5}}}}, {.lr = 0.1});
  CHECK(opt.param_groups()[0].lr() == 0.1);
  CHECK(opt.param_groups()[1].lr() == 0.5);
  a.set_grad(0);
  b.set_grad(0);
  opt.step();
  std::vector<double> ga = doubles(a.grads[0]), gb = doubles(b.grads[0]);
  for (size_t i = 0; i < wa.size(); ++i) wa[i] -= 0.1 * ga[i], wb[i] -= 0.5 * gb[i];
  check_vec(doubles(a.param), wa);
  check_vec(doubles(b.param), wb);
  opt.zero_grad();
  CHECK_FALSE(a.param.grad().defined());
  a.set_grad(1);
  std::vector<double> before_b = doubles(b.param);
  opt.step();  // b has no grad: untouched
  check_vec(doubles(b.param), before_b, 0);
  opt.zero_grad(false);
  REQUIRE(a.param.grad().defined());
  CHECK(a.param.grad().abs().sum().item<double>() == 0.0);
  CHECK_THROWS_WITH(optim::SGD({optim::ParamGroup{{a.param}, {{"lrr", 1.0}}}}, {}), Catch::Contains("unknown option 'lrr'"));
  CHECK_THROWS_WITH(optim::SGD({optim::ParamGroup{{a.param}, {}}, optim::ParamGroup{{a.param}, {}}}, {}),
                    Catch::Contains("more than one parameter group"));
}

TEST_CASE("bad options are rejected with the value given", "[optim][errors]") {
  Problem p(5);
  CHECK_THROWS_WITH(optim::SGD({p.param}, {.lr = -1}), Catch::Contains("invalid learning rate -1"));
  CHECK_THROWS_WITH(optim::SGD({p.param}, {.lr = 0.1, .nesterov = true}), Catch::Contains("nesterov momentum requires"));
  CHECK_THROWS_WITH(optim::Adam({p.param}, {.beta1 = 1.0}), Catch::Contains("invalid beta1 1"));
  CHECK_THROWS_WITH(optim::Adam({p.param}, {.eps = -1e-8}), Catch::Contains("invalid epsilon"));
  // Non-finite values train to NaN silently: refused too.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(optim::SGD({p.param}, {.lr = inf}), Catch::Contains("invalid learning rate inf"));
  CHECK_THROWS_WITH(optim::SGD({p.param}, {.lr = nan}), Catch::Contains("invalid learning rate nan"));
  CHECK_THROWS_WITH(optim::AdamW({p.param}, {.lr = inf}), Catch::Contains("invalid learning rate inf"));
  CHECK_THROWS_WITH(optim::Adam({p.param}, {.beta2 = nan}), Catch::Contains("invalid beta2"));
  CHECK_THROWS_WITH(optim::SGD({p.param}, {.lr = 0.1, .momentum = nan}), Catch::Contains("invalid momentum"));
  // A state whose parameter index is not a number: a clear error, not std::stoll's "stoll".
  {
    optim::SGD opt({p.param}, {.lr = 0.1, .momentum = 0.9});
    auto state = opt.state_dict();
    std::vector<std::pair<std::string, Tensor>> bad = state;
    bad.push_back({"state.x1.momentum_buffer", zeros({5})});
    CHECK_THROWS_WITH(opt.load_state_dict(bad), Catch::Contains("'x1' is not an index"));
    // The same for a parameter group's index (it reached std::stoul's bare "stoul").
    std::vector<std::pair<std::string, Tensor>> bad_group = state;
    bad_group.push_back({"param_groups.g0.lr", zeros({})});
    CHECK_THROWS_WITH(opt.load_state_dict(bad_group),
                      Catch::Contains("'param_groups.g0.lr' should be param_groups.<group index>.<option>, and 'g0'"));
  }
  // A state missing a buffer the update needs is refused at load, naming it (not map::at in step()).
  {
    optim::Adam opt({p.param}, {});
    optim::NamedTensors state = {{"param_groups.0.lr", tensor(std::vector<double>{1e-3}).reshape({})},
                                 {"param_groups.0.beta1", tensor(std::vector<double>{0.9}).reshape({})},
                                 {"param_groups.0.beta2", tensor(std::vector<double>{0.999}).reshape({})},
                                 {"param_groups.0.eps", tensor(std::vector<double>{1e-8}).reshape({})},
                                 {"param_groups.0.weight_decay", tensor(std::vector<double>{0.0}).reshape({})},
                                 {"param_groups.0.amsgrad", tensor(std::vector<double>{0.0}).reshape({})},
                                 {"state.0.step", tensor(std::vector<double>{3}).reshape({})},
                                 {"state.0.exp_avg", zeros(p.param.sizes())}};
    CHECK_THROWS_WITH(opt.load_state_dict(state), Catch::Contains("has no 'exp_avg_sq'"));
    state.push_back({"state.0.exp_avg_sq", zeros(p.param.sizes())});
    state[6].second = tensor(std::vector<double>{-2}).reshape({});
    CHECK_THROWS_WITH(opt.load_state_dict(state), Catch::Contains("step -2"));
    state[6].second = tensor(std::vector<double>{3}).reshape({});
    opt.load_state_dict(state);  // complete and in range: loads
  }
  Tensor frozen = randn({2});
  CHECK_THROWS_WITH(optim::SGD({frozen}, {}), Catch::Contains("require grad"));
}

TEST_CASE("state_dict round trip: a fresh optimizer continues exactly like the original", "[optim][state]") {
  for (int kind = 0; kind < 2; ++kind) {
    Problem a(6), b(6);
    auto make = [kind](Tensor p) -> std::unique_ptr<optim::Optimizer> {
      if (kind == 0) return std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      return std::make_unique<optim::Adam>(std::vector<Tensor>{p}, optim::AdamOptions{.lr = 0.01, .amsgrad = true});
    };
    auto oa = make(a.param);
    auto ob = make(b.param);
    for (int s = 0; s < 2; ++s) {
      a.set_grad(s);
      oa->step();
      b.set_grad(s);
      ob->step();
    }
    // A third optimizer for b, restored from b's state, takes step 3.
    auto oc = make(b.param);
    oc->param_groups()[0].set_lr(123.0);  // overwritten by the loaded state
    oc->load_state_dict(ob->state_dict());
    CHECK(oc->param_groups()[0].lr() == oa->param_groups()[0].lr());
    a.set_grad(2);
    oa->step();
    b.set_grad(2);
    oc->step();
    check_vec(doubles(b.param), doubles(a.param), 0);
    nn::NamedTensors bad = oa->state_dict();
    for (auto& [name, t] : bad)
      if (name.find("state.0.") == 0 && name.find("step") == std::string::npos) t = zeros({5});
    CHECK_THROWS_WITH(oc->load_state_dict(bad), Catch::Contains("has shape [5]") && Catch::Contains("[3, 4]"));
    CHECK_THROWS_WITH(oc->load_state_dict({{"bogus", zeros({1})}}), Catch::Contains("unexpected key 'bogus'"));
  }
}

TEST_CASE("schedulers follow their closed forms and resume from state", "[optim][schedulers]") {
  Problem p(7);
  auto lr_seq = [&](auto make, int steps) {
    optim::SGD opt({p.param}, {.lr = 0.1});
    auto sched = make(opt);
    std::vector<double> lrs{opt.param_groups()[0].lr()};
    for (int i = 0; i < steps; ++i) {
      sched.step();
      lrs.push_back(opt.param_groups()[0].lr());
      CHECK(sched.get_last_lr()[0] == lrs.back());
    }
    return lrs;
  };
  check_vec(lr_seq([](optim::Optimizer& o) { return optim::StepLR(o, 2, 0.5); }, 5), {0.1, 0.1, 0.05, 0.05, 0.025, 0.025});
  check_vec(lr_seq([](optim::Optimizer& o) { return optim::MultiStepLR(o, {1, 3}, 0.1); }, 4), {0.1, 0.01, 0.01, 0.001, 0.001});
  std::vector<double> cos = lr_seq([](optim::Optimizer& o) { return optim::CosineAnnealingLR(o, 4, 0.01); }, 4);
  for (int t = 0; t <= 4; ++t) CHECK(cos[t] == Approx(0.01 + 0.09 * (1 + std::cos(std::numbers::pi * t / 4)) / 2));
  using D = optim::WarmupDecayLR::Decay;
  check_vec(lr_seq([](optim::Optimizer& o) { return optim::WarmupDecayLR(o, 2, 6, D::Linear); }, 7),
            {0, 0.05, 0.1, 0.075, 0.05, 0.025, 0, 0});
  std::vector<double> wc = lr_seq([](optim::Optimizer& o) { return optim::WarmupDecayLR(o, 1, 5, D::Cosine); }, 5);
  CHECK(wc[3] == Approx(0.1 * (1 + std::cos(std::numbers::pi * 0.5)) / 2));
  // Resume: a new scheduler loading the state continues the sequence.
  optim::SGD opt({p.param}, {.lr = 0.1});
  optim::StepLR s1(opt, 2, 0.5);
  s1.step();
  s1.step();
  s1.step();
  optim::SGD opt2({p.param}, {.lr = 0.1});
  optim::StepLR s2(opt2, 2, 0.5);
  s2.load_state_dict(s1.state_dict());
  CHECK(opt2.param_groups()[0].lr() == 0.05);
  s1.step();
  s2.step();
  CHECK(opt2.param_groups()[0].lr() == opt.param_groups()[0].lr());
  CHECK_THROWS_WITH(optim::StepLR(opt, 0), Catch::Contains("step_size must be positive"));
  // A refused state changes nothing (last_epoch was taken before the check that refused it).
  const int64_t epoch = s2.last_epoch();
  CHECK_THROWS_WITH(s2.load_state_dict({{"last_epoch", full({}, 7.0, {.dtype = kFloat64})}}),
                    Catch::Contains("expected last_epoch and 1 base_lrs entries"));
  CHECK(s2.last_epoch() == epoch);
  // Two groups: base_lrs.0 twice is not a state for both.
  Problem q(8);
  optim::SGD two({optim::ParamGroup{{p.param}, {}}, optim::ParamGroup{{q.param}, {}}}, {.lr = 0.1});
  optim::StepLR s3(two, 2, 0.5);
  const Tensor lr = full({}, 0.3, {.dtype = kFloat64});
  CHECK_THROWS_WITH(s3.load_state_dict({{"last_epoch", full({}, 1.0, {.dtype = kFloat64})}, {"base_lrs.0", lr},
                                        {"base_lrs.0", lr}}),
                    Catch::Contains("'base_lrs.0' appears twice"));
  CHECK(s3.last_epoch() == 0);
}

TEST_CASE("clip_grad_norm_ returns the total norm and scales only when over the max", "[optim][clip]") {
  Problem a(8), b(9);
  a.set_grad(0);
  b.set_grad(0);
  std::vector<double> ga = doubles(a.grads[0]), gb = doubles(b.grads[0]);
  double sq = 0, mx = 0;
  for (double v : ga) sq += v * v, mx = std::max(mx, std::abs(v));
  for (double v : gb) sq += v * v, mx = std::max(mx, std::abs(v));
  const double total = std::sqrt(sq);
  CHECK(optim::clip_grad_norm_({a.param, b.param}, 1e9) == Approx(total));
  check_vec(doubles(a.param.grad()), ga);  // under the max: untouched
  CHECK(optim::clip_grad_norm_({a.param, b.param}, 1.0) == Approx(total));
  const double coef = 1.0 / (total + 1e-6);
  for (double& v : ga) v *= coef;
  check_vec(doubles(a.param.grad()), ga);
  CHECK(std::sqrt(std::pow(norm(a.param.grad()).item<double>(), 2) + std::pow(norm(b.param.grad()).item<double>(), 2)) ==
        Approx(1.0).epsilon(1e-5));
  a.set_grad(1);
  b.set_grad(1);
  double mx1 = 0;
  for (const Tensor& g : {a.grads[1], b.grads[1]})
    for (double v : doubles(g)) mx1 = std::max(mx1, std::abs(v));
  CHECK(optim::clip_grad_norm_({a.param, b.param}, 100.0, INFINITY) == Approx(mx1));
  a.param.mutable_grad() = full({3, 4}, NAN, {.dtype = kFloat64});
  CHECK_THROWS_WITH(optim::clip_grad_norm_({a.param}, 1.0, 2.0, true), Catch::Contains("non-finite"));
  // The infinity norm too, whichever side the NaN is on (until 2026-12-04 std::max dropped it).
  CHECK_THROWS_WITH(optim::clip_grad_norm_({a.param}, 1.0, INFINITY, true), Catch::Contains("non-finite"));
  CHECK(std::isnan(optim::clip_grad_norm_({a.param, b.param}, 1.0, INFINITY)));
  CHECK(std::isnan(optim::clip_grad_norm_({b.param, a.param}, 1.0, INFINITY)));
  b.set_grad(2);
  optim::clip_grad_value_({b.param}, 0.5);
  for (double v : doubles(b.param.grad())) CHECK(std::abs(v) <= 0.5);
  CHECK(b.param.grad().abs().max().item<double>() == 0.5);  // 12 normal draws: some exceed 0.5
}

TEST_CASE("SGD with momentum and Adam train a linear model: the loss falls", "[optim]") {
  for (int kind = 0; kind < 2; ++kind) {
    manual_seed(10);
    nn::Linear model(5, 2);
    Tensor x = randn({64, 5});
    Tensor y = matmul(x, randn({5, 2})) + 0.5;
    std::unique_ptr<optim::Optimizer> opt;
    if (kind == 0) opt = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    else opt = std::make_unique<optim::Adam>(model.parameters(), optim::AdamOptions{.lr = 0.05});
    double first = 0, last = 0;
    for (int step = 0; step < 100; ++step) {
      opt->zero_grad();
      Tensor loss = nn::functional::mse_loss(model.forward(x), y);
      loss.backward();
      opt->step();
      (step == 0 ? first : last) = loss.item<float>();
    }
    CHECK(last < 0.01 * first);
  }
}


// The optimizers whose state a step reads, each in the configurations that step it differently.
std::vector<std::pair<std::string, std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>>>
stateful_optimizers() {
  using P = std::vector<Tensor>;
  return {
      {"SGD momentum", [](P p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .foreach = false}); }},
      {"SGD momentum foreach", [](P p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .foreach = true}); }},
      {"Adam", [](P p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = 0.01, .foreach = false}); }},
      {"Adam amsgrad foreach", [](P p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = 0.01, .amsgrad = true, .foreach = true}); }},
      {"AdamW fused", [](P p) { return std::make_unique<optim::AdamW>(p, optim::AdamOptions{.lr = 0.01, .weight_decay = 0.01, .fused = true}); }},
      {"RMSprop", [](P p) { return std::make_unique<optim::RMSprop>(p, optim::RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true}); }},
      {"Adagrad", [](P p) { return std::make_unique<optim::Adagrad>(p, optim::AdagradOptions{.lr = 0.1}); }},
      {"Adamax", [](P p) { return std::make_unique<optim::Adamax>(p, optim::AdamaxOptions{.lr = 0.01}); }},
  };
}

void set_grads(nn::Module& m, uint64_t seed) {
  Generator gen(seed);
  for (Tensor& p : m.parameters()) {
    p.mutable_grad() = randn(p.sizes(), {.dtype = p.dtype()}, &gen).to(p.device());
  }
}

bool same_state(const nn::NamedTensors& a, const nn::NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || a[i].second.dtype() != b[i].second.dtype() ||
        !equal(a[i].second.cpu(), b[i].second.cpu())) {
      return false;
    }
  }
  return true;
}

TEST_CASE("after Module::to changes a parameter's dtype or device, step refuses the old state and changes nothing",
          "[optim][state][sim]") {
  // PyTorch steps such a state into an error inside its kernels; chorus's kernels would read a
  // float32 buffer as float64 (out of bounds on a GPU). The step is refused before any step count
  // or buffer moves, naming the buffer and the fix; after a state_dict round trip (which puts the
  // state on each parameter's device and dtype) the step equals a CPU float64 optimizer's.
  for (const auto& [label, make] : stateful_optimizers()) {
    INFO(label);
    auto model = std::make_shared<nn::Linear>(3, 2);
    model->to(Device::sim(0));
    auto opt = make(model->parameters());
    set_grads(*model, 1);
    opt->step();
    model->to(kFloat64);
    set_grads(*model, 2);
    const nn::NamedTensors before = opt->state_dict();
    const std::vector<double> weight = doubles(model->weight.cpu());
    const std::string error = [&] {
      try {
        opt->step();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    }();
    CHECK_THAT(error, Catch::Contains("of parameter 0 is float32 on sim:0 with shape [2, 3], but the parameter is "
                                      "float64 on sim:0 with shape [2, 3]") &&
                          Catch::Contains("load_state_dict"));
    CHECK(same_state(opt->state_dict(), before));
    check_vec(doubles(model->weight.cpu()), weight, 0);

    // The fix the error names, against the same step on the CPU in float64.
    opt->load_state_dict(opt->state_dict());
    auto cpu_model = std::make_shared<nn::Linear>(3, 2);
    cpu_model->to(kFloat64);
    cpu_model->load_state_dict(model->state_dict());
    auto cpu_opt = make(cpu_model->parameters());
    cpu_opt->load_state_dict(opt->state_dict());
    for (size_t i = 0; i < 2; ++i) {
      cpu_model->parameters()[i].mutable_grad() = model->parameters()[i].grad().cpu();
    }
    opt->step();
    cpu_opt->step();
    check_vec(doubles(model->weight.cpu()), doubles(cpu_model->weight), 0);
    check_vec(doubles(model->bias.cpu()), doubles(cpu_model->bias), 0);

    // A device change is refused the same way.
    auto cpu_first = std::make_shared<nn::Linear>(3, 2);
    auto moved_opt = make(cpu_first->parameters());
    set_grads(*cpu_first, 3);
    moved_opt->step();
    cpu_first->to(Device::sim(0));
    set_grads(*cpu_first, 4);
    CHECK_THROWS_WITH(moved_opt->step(), Catch::Contains("is float32 on cpu with shape [2, 3], but the parameter is "
                                                         "float32 on sim:0"));
  }
}

TEST_CASE("amsgrad turned on after the state was made keeps a running maximum from then on; a loaded amsgrad state "
          "must hold it",
          "[optim][adam][state]") {
  for (const bool foreach : {false, true}) {
    INFO("foreach " << foreach);
    Problem pr(21);
    optim::Adam opt({pr.param}, {.lr = 0.01, .foreach = foreach});
    pr.set_grad(0);
    opt.step();
    opt.param_groups()[0].options["amsgrad"] = 1;
    pr.set_grad(1);
    opt.step();
    auto state_of = [&](const std::string& key) {
      for (const auto& [name, t] : opt.state_dict())
        if (name == "state.0." + key) return t;
      return Tensor();
    };
    REQUIRE(state_of("max_exp_avg_sq").defined());
    // Started from zeros on this step, as on a first step: max(0, v) = v.
    check_vec(doubles(state_of("max_exp_avg_sq")), doubles(state_of("exp_avg_sq")), 0);
    const std::vector<double> peak = doubles(state_of("max_exp_avg_sq"));
    // A zero gradient: v decays, the maximum stays, and the update divides by the maximum.
    const std::vector<double> p_before = doubles(pr.param), m_before = doubles(state_of("exp_avg"));
    pr.param.mutable_grad() = zeros({3, 4}, {.dtype = kFloat64});
    opt.step();
    check_vec(doubles(state_of("max_exp_avg_sq")), peak, 0);
    std::vector<double> want(p_before.size());
    const double step_size = 0.01 / (1 - std::pow(0.9, 3)), bc2 = std::sqrt(1 - std::pow(0.999, 3));
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = p_before[i] - step_size * (0.9 * m_before[i]) / (std::sqrt(peak[i]) / bc2 + 1e-8);
    }
    check_vec(doubles(pr.param), want, 1e-12);

    // A saved state that says amsgrad but lacks the buffer (not written by chorus) is refused.
    Problem other(22);
    optim::Adam plain({other.param}, {.lr = 0.01});
    other.set_grad(0);
    plain.step();
    nn::NamedTensors claimed = plain.state_dict();
    for (auto& [name, t] : claimed)
      if (name == "param_groups.0.amsgrad") t = full({}, 1.0, {.dtype = kFloat64});
    CHECK_THROWS_WITH(opt.load_state_dict(claimed), Catch::Contains("has no 'max_exp_avg_sq'"));
  }
}

TEST_CASE("state_dict snapshots device state in host memory; a refused load_state_dict changes nothing",
          "[optim][state][sim]") {
  auto model = std::make_shared<nn::Linear>(3, 2);
  model->to(Device::sim(0));
  optim::Adam opt(model->parameters(), {.lr = 0.01});
  set_grads(*model, 5);
  opt.step();
  const nn::NamedTensors state = opt.state_dict();
  for (const auto& [name, t] : state) {
    INFO(name);
    CHECK(t.device().is_cpu());
  }
  // Valid options (lr 5) with a parameter's state missing a buffer: neither is applied.
  nn::NamedTensors bad;
  for (const auto& [name, t] : state) {
    if (name == "state.1.exp_avg_sq") continue;
    bad.emplace_back(name, name == "param_groups.0.lr" ? full({}, 5.0, {.dtype = kFloat64}) : t);
  }
  CHECK_THROWS_WITH(opt.load_state_dict(bad), Catch::Contains("the state of parameter 1 has no 'exp_avg_sq'"));
  CHECK(opt.param_groups()[0].lr() == 0.01);
  CHECK(same_state(opt.state_dict(), state));
  // RMSprop with momentum and centered needs their buffers too.
  optim::RMSprop rms(model->parameters(), {.lr = 0.01, .momentum = 0.5, .centered = true});
  rms.step();
  nn::NamedTensors no_momentum;
  for (const auto& [name, t] : rms.state_dict())
    if (name != "state.0.momentum_buffer") no_momentum.emplace_back(name, t);
  CHECK_THROWS_WITH(rms.load_state_dict(no_momentum), Catch::Contains("the state of parameter 0 has no 'momentum_buffer'"));
}

TEST_CASE("RMSprop with momentum or centered turned on after its state was made starts those buffers then",
          "[optim][state]") {
  Problem pr(23);
  optim::RMSprop opt({pr.param}, {.lr = 0.01});
  pr.set_grad(0);
  opt.step();
  opt.param_groups()[0].options["momentum"] = 0.5;
  opt.param_groups()[0].options["centered"] = 1;
  const std::vector<double> p_before = doubles(pr.param);
  nn::NamedTensors st = opt.state_dict();
  std::vector<double> sq;
  for (const auto& [name, t] : st)
    if (name == "state.0.square_avg") sq = doubles(t);
  pr.set_grad(1);
  opt.step();
  // From zeros: grad_avg = 0.01 g, buf = g / (sqrt(v - grad_avg^2) + eps), p -= lr buf.
  const std::vector<double> g = doubles(pr.grads[1]);
  std::vector<double> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double v = 0.99 * sq[i] + 0.01 * g[i] * g[i], avg = 0.01 * g[i];
    want[i] = p_before[i] - 0.01 * g[i] / (std::sqrt(v - avg * avg) + 1e-8);
  }
  check_vec(doubles(pr.param), want, 1e-12);
}

}  // namespace
}  // namespace chorus
