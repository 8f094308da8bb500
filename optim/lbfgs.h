// L-BFGS, as torch.optim.LBFGS: a quasi-Newton method that keeps the last `history_size` pairs of
// parameter and gradient differences and, each iteration, turns the gradient into a search
// direction through them (the two-loop recursion). step(closure) runs up to `max_iter` iterations,
// re-evaluating the closure (which recomputes the loss and its gradients) as it goes; with
// `line_search = StrongWolfe` each step length is found by a bracketing and cubic-interpolation
// line search satisfying the strong Wolfe conditions, otherwise it is the fixed `lr`.
//
// As PyTorch's: one parameter group only; the parameters are treated as one flat vector (in their
// dtype and on their device); the same options, defaults and stopping tests. The state (the
// direction, the step, the history, the previous gradient and loss, the iteration and evaluation
// counts) goes into state_dict() under "lbfgs.*", so a checkpoint resumes the same iterations.
#pragma once

#include <functional>
#include <optional>

#include "optim/optimizer.h"

namespace chorus::optim {

struct LBFGSOptions {
  enum class LineSearch { None, StrongWolfe };
  double lr = 1;
  int64_t max_iter = 20;                 // iterations per step()
  std::optional<int64_t> max_eval{};     // closure evaluations per step(); default max_iter * 5 / 4
  double tolerance_grad = 1e-7;          // stop when the gradient's largest |element| is at most this
  double tolerance_change = 1e-9;        // stop when the loss or the step changes less than this
  int64_t history_size = 100;
  LineSearch line_search = LineSearch::None;
  Options to_map() const;
};

class LBFGS : public Optimizer {
 public:
  // The closure clears the gradients, computes the loss, calls backward() and returns the loss.
  using Closure = std::function<Tensor()>;

  LBFGS(const std::vector<Tensor>& params, LBFGSOptions options = {});
  // The loss the closure returned at the start (before this step's updates), as PyTorch.
  Tensor step(const Closure& closure);
  // L-BFGS needs the closure: a chorus::Error saying so.
  void step() override;

  NamedTensors state_dict() const override;
  void load_state_dict(const NamedTensors& state) override;

  // The closure evaluations and iterations so far, over all steps (PyTorch's state "func_evals"
  // and "n_iter").
  int64_t func_evals() const { return func_evals_; }
  int64_t n_iter() const { return n_iter_; }

 protected:
  void check_options(const Options& o) const override;

 private:
  std::vector<Tensor>& params();
  Tensor flat_grad();
  // p += t * d over the flat vector d.
  void add_direction(double t, const Tensor& d);
  void set_params(const std::vector<Tensor>& values);
  // The loss and flat gradient at x + t * d; the parameters are put back to x afterwards.
  std::pair<double, Tensor> evaluate_at(const Closure& closure, const std::vector<Tensor>& x, double t, const Tensor& d);
  struct LineSearchResult {
    double loss;
    Tensor grad;
    double t;
    int64_t evals;
  };
  LineSearchResult strong_wolfe(const Closure& closure, const std::vector<Tensor>& x, double t, const Tensor& d,
                                double loss, const Tensor& grad, double gtd);

  // The state between steps (undefined tensors and empty history before the first).
  Tensor d_, prev_flat_grad_;
  double t_ = 0, h_diag_ = 1, prev_loss_ = 0;
  std::vector<Tensor> old_dirs_, old_stps_;
  std::vector<double> ro_;
  int64_t func_evals_ = 0, n_iter_ = 0;
};

}  // namespace chorus::optim
