// L-BFGS against libtorch 1.13's torch::optim::LBFGS on the same problem (a tanh least-squares fit
// with an L2 term, float64, random data): the parameters after each step() and the number of
// closure evaluations, with the fixed step and with the strong-Wolfe line search; convergence on
// the Rosenbrock function; the state through state_dict into a fresh optimizer; the errors.
#include <torch/optim/lbfgs.h>
#include "tests/libtorch_testing.h"  // after the torch headers ([Narrow torch headers])

#include <cmath>
#include <functional>

#include "optim/optim.h"
#include "tensor/ops.h"

namespace {

using chorus::Tensor;
namespace o = chorus::optim;

using chorus::testing::max_diff;
using chorus::testing::to_torch;

// mean((tanh(X W + b) - Y)^2) + 0.01 |W|^2, with its gradients.
struct Problem {
  Tensor x, y;
  Tensor loss(const Tensor& w, const Tensor& b) const {
    const Tensor r = chorus::sub(chorus::tanh(chorus::add(chorus::matmul(x, w), b)), y);
    return chorus::add(chorus::mean(chorus::mul(r, r)), chorus::mul(chorus::sum(chorus::mul(w, w)), 0.01));
  }
  torch::Tensor loss(const torch::Tensor& w, const torch::Tensor& b) const {
    const torch::Tensor r = torch::tanh(torch::matmul(to_torch(x), w) + b) - to_torch(y);
    return (r * r).mean() + (w * w).sum() * 0.01;
  }
};

Problem make_problem(uint64_t seed) {
  chorus::Generator g(seed);
  Problem p{chorus::randn({12, 5}, {.dtype = chorus::kFloat64}, &g), chorus::randn({12, 3}, {.dtype = chorus::kFloat64}, &g)};
  p.y = chorus::mul(chorus::tanh(p.y), 0.8);
  return p;
}

// The closure step() evaluates: the loss at (w, b), with gradients.
std::function<Tensor()> loss_closure(const Problem& problem, o::LBFGS& which, Tensor& w, Tensor& b) {
  return [&problem, &which, &w, &b] {
    which.zero_grad();
    Tensor l = problem.loss(w, b);
    l.backward();
    return l;
  };
}

}  // namespace

TEST_CASE("LBFGS equals libtorch's, with and without the strong-Wolfe line search", "[optim][libtorch]") {
  torch::set_num_threads(1);
  const Problem problem = make_problem(11);
  for (bool wolfe : {false, true}) {
    for (int64_t history : {3, 100}) {
      INFO("strong Wolfe " << wolfe << ", history " << history);
      chorus::Generator g(5);
      Tensor w = chorus::mul(chorus::randn({5, 3}, {.dtype = chorus::kFloat64}, &g), 0.5).requires_grad_();
      Tensor b = chorus::zeros({3}, {.dtype = chorus::kFloat64}).requires_grad_();
      torch::Tensor tw = to_torch(w).requires_grad_(), tb = to_torch(b).requires_grad_();
      o::LBFGSOptions options{.lr = wolfe ? 1.0 : 0.3, .max_iter = 7, .history_size = history};
      if (wolfe) options.line_search = o::LBFGSOptions::LineSearch::StrongWolfe;
      o::LBFGS opt({w, b}, options);
      auto topts = torch::optim::LBFGSOptions(options.lr).max_iter(7).history_size(history);
      if (wolfe) topts.line_search_fn("strong_wolfe");
      torch::optim::LBFGS topt({tw, tb}, topts);
      int evals = 0, tevals = 0;
      auto closure = [&] {
        ++evals;
        opt.zero_grad();
        Tensor l = problem.loss(w, b);
        l.backward();
        return l;
      };
      auto tclosure = [&] {
        ++tevals;
        topt.zero_grad();
        torch::Tensor l = problem.loss(tw, tb);
        l.backward();
        return l;
      };
      double first = 0, last = 0;
      for (int step = 0; step < 4; ++step) {
        const double l = opt.step(closure).item<double>();
        const double tl = topt.step(tclosure).item<double>();
        CHECK(std::abs(l - tl) < 1e-12);
        if (step == 0) first = l;
        last = l;
        CHECK(max_diff(w, tw) < 1e-10);
        CHECK(max_diff(b, tb) < 1e-10);
        CHECK(evals == tevals);
      }
      CHECK(opt.func_evals() == evals);
      CHECK(last < 0.5 * first);
    }
  }
}

TEST_CASE("LBFGS with the line search minimizes the Rosenbrock function", "[optim]") {
  Tensor xy = chorus::tensor({-1.5, 2.0}).to(chorus::kFloat64).requires_grad_();
  o::LBFGS opt({xy}, {.lr = 1, .max_iter = 50, .tolerance_grad = 1e-12, .tolerance_change = 1e-14,
                      .line_search = o::LBFGSOptions::LineSearch::StrongWolfe});
  auto closure = [&] {
    opt.zero_grad();
    const Tensor x = xy[0], y = xy[1];
    const Tensor a = chorus::sub(x, 1.0), c = chorus::sub(y, chorus::mul(x, x));
    Tensor l = chorus::add(chorus::mul(a, a), chorus::mul(chorus::mul(c, c), 100.0));
    l.backward();
    return l;
  };
  for (int step = 0; step < 5; ++step) opt.step(closure);
  CHECK(std::abs(xy[0].item<double>() - 1) < 1e-8);
  CHECK(std::abs(xy[1].item<double>() - 1) < 1e-8);
  CHECK(opt.n_iter() < 100);
}

TEST_CASE("LBFGS state goes through state_dict; bad use is refused", "[optim]") {
  const Problem problem = make_problem(12);
  chorus::Generator g(8);
  Tensor w = chorus::randn({5, 3}, {.dtype = chorus::kFloat64}, &g).requires_grad_();
  Tensor b = chorus::randn({3}, {.dtype = chorus::kFloat64}, &g).requires_grad_();
  const o::LBFGSOptions options{.lr = 1, .max_iter = 4, .history_size = 3,
                                .line_search = o::LBFGSOptions::LineSearch::StrongWolfe};
  o::LBFGS opt({w, b}, options);
  auto closure_for = [&](o::LBFGS& which, Tensor& pw, Tensor& pb) { return loss_closure(problem, which, pw, pb); };
  opt.step(closure_for(opt, w, b));
  opt.step(closure_for(opt, w, b));
  const auto state = opt.state_dict();
  // A fresh optimizer on copies of the parameters, given the state, continues identically.
  Tensor w2 = w.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  o::LBFGS again({w2, b2}, options);
  again.load_state_dict(state);
  CHECK(again.n_iter() == opt.n_iter());
  CHECK(again.func_evals() == opt.func_evals());
  opt.step(closure_for(opt, w, b));
  again.step(closure_for(again, w2, b2));
  CHECK(chorus::equal(w, w2));
  CHECK(chorus::equal(b, b2));

  CHECK_THROWS_WITH(opt.step(), Catch::Contains("needs a closure"));
  CHECK_THROWS_WITH(o::LBFGS({w}, {.lr = -1}), Catch::Contains("invalid learning rate -1"));
  CHECK_THROWS_WITH(o::LBFGS({w}, {.history_size = 0}), Catch::Contains("history_size is 0"));
  auto bad = state;
  for (auto& [name, t] : bad) {
    if (name == "lbfgs.d") t = chorus::zeros({4}, {.dtype = chorus::kFloat64});
  }
  // A refused state changes nothing: the options it carried (lr 7 here) are not applied either.
  for (auto& [name, t] : bad) {
    if (name == "param_groups.0.lr") t = chorus::full({}, 7.0, {.dtype = chorus::kFloat64});
  }
  const int64_t iterations = again.n_iter();
  CHECK_THROWS_WITH(again.load_state_dict(bad), Catch::Contains("'lbfgs.d' has shape [4], expected [18]"));
  CHECK(again.param_groups()[0].lr() == 1);
  CHECK(again.n_iter() == iterations);
  o::LBFGS two({w}, {});
  two.add_param_group({{b}, {}});
  CHECK_THROWS_WITH(two.step(closure_for(two, w, b)), Catch::Contains("doesn't support per-parameter options"));
}

TEST_CASE("LBFGS on sim:0: state_dict is in host memory, and a state on the device loads and continues identically",
          "[optim][sim]") {
  const chorus::Device sim = chorus::Device::sim(0);
  Problem problem = make_problem(13);
  problem.x = problem.x.to(sim);
  problem.y = problem.y.to(sim);
  chorus::Generator g(9);
  Tensor w = chorus::randn({5, 3}, {.dtype = chorus::kFloat64}, &g).to(sim).requires_grad_();
  Tensor b = chorus::randn({3}, {.dtype = chorus::kFloat64}, &g).to(sim).requires_grad_();
  const o::LBFGSOptions options{.lr = 1, .max_iter = 4, .history_size = 3};
  o::LBFGS opt({w, b}, options);
  auto closure_for = [&](o::LBFGS& which, Tensor& pw, Tensor& pb) { return loss_closure(problem, which, pw, pb); };
  opt.step(closure_for(opt, w, b));
  opt.step(closure_for(opt, w, b));
  auto state = opt.state_dict();
  for (const auto& [name, t] : state) {
    INFO(name);
    CHECK(t.device().is_cpu());
  }
  // The same state with every tensor on the device (as a caller may hold it) loads too.
  for (auto& [name, t] : state) t = t.to(sim);
  Tensor w2 = w.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  o::LBFGS again({w2, b2}, options);
  again.load_state_dict(state);
  CHECK(again.n_iter() == opt.n_iter());
  opt.step(closure_for(opt, w, b));
  again.step(closure_for(again, w2, b2));
  CHECK(chorus::equal(w.cpu(), w2.cpu()));
  CHECK(chorus::equal(b.cpu(), b2.cpu()));
}
