#include "optim/more_optimizers.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::optim {
namespace {

void check_nonnegative(const char* opt, const Options& o, const char* key) {
  const double v = o.at(key);
  if (!(v >= 0) || !std::isfinite(v)) fail("{}: invalid {} {} (must be finite and >= 0)", opt, key, v);
}

// The gradient with L2 weight decay added (PyTorch's "grad = grad.add(p, alpha=weight_decay)").
Tensor decayed_grad(const Tensor& p, double weight_decay) {
  return weight_decay != 0 ? add(p.grad(), mul(p.detach(), weight_decay)) : p.grad();
}

// The step count (a float64 CPU scalar, as the other optimizers keep it), incremented.
double next_step(std::map<std::string, Tensor>& st) {
  double* step = st.at("step").data_ptr<double>();
  *step += 1;
  return *step;
}

}  // namespace

Options RMSpropOptions::to_map() const {
  return {{"lr", lr},         {"alpha", alpha},       {"eps", eps}, {"weight_decay", weight_decay},
          {"momentum", momentum}, {"centered", centered ? 1.0 : 0.0}};
}

RMSprop::RMSprop(std::vector<ParamGroup> groups, RMSpropOptions options)
    : Optimizer("RMSprop", std::move(groups), options.to_map()) {
  for (const ParamGroup& g : groups_) check_options(g.options);
}

std::vector<std::string> RMSprop::required_state(const Options& group) const {
  std::vector<std::string> out{"step", "square_avg"};
  if (group.at("momentum") > 0) out.push_back("momentum_buffer");
  if (group.at("centered") != 0) out.push_back("grad_avg");
  return out;
}

void RMSprop::check_options(const Options& o) const {
  for (const char* key : {"lr", "eps", "weight_decay", "momentum", "alpha"}) check_nonnegative("RMSprop", o, key);
}

void RMSprop::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.options["lr"], alpha = group.options["alpha"], eps = group.options["eps"],
                 wd = group.options["weight_decay"], momentum = group.options["momentum"];
    const bool centered = group.options["centered"] != 0;
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      auto& st = state_of(p);
      if (!st.count("square_avg")) {
        st["step"] = zeros({}, TensorOptions{.dtype = kFloat64});
        st["square_avg"] = zeros(p.sizes(), p.options());
      }
      // Also when momentum or centered was turned on after the state was made: they start then.
      if (momentum > 0 && !st.count("momentum_buffer")) st["momentum_buffer"] = zeros(p.sizes(), p.options());
      if (centered && !st.count("grad_avg")) st["grad_avg"] = zeros(p.sizes(), p.options());
      check_state(p, st);
      next_step(st);
      const Tensor g = decayed_grad(p, wd);
      Tensor& square_avg = st.at("square_avg");
      square_avg.copy_(add(mul(square_avg, alpha), mul(mul(g, g), 1 - alpha)));
      Tensor avg;
      if (centered) {
        Tensor& grad_avg = st.at("grad_avg");
        grad_avg.copy_(add(mul(grad_avg, alpha), mul(g, 1 - alpha)));
        avg = add(sqrt(sub(square_avg, mul(grad_avg, grad_avg))), eps);
      } else {
        avg = add(sqrt(square_avg), eps);
      }
      if (momentum > 0) {
        Tensor& buf = st.at("momentum_buffer");
        buf.copy_(add(mul(buf, momentum), div(g, avg)));
        p.copy_(sub(p.detach(), mul(buf, lr)));
      } else {
        p.copy_(sub(p.detach(), mul(div(g, avg), lr)));
      }
    }
  }
}

Options AdagradOptions::to_map() const {
  return {{"lr", lr}, {"lr_decay", lr_decay}, {"weight_decay", weight_decay},
          {"initial_accumulator_value", initial_accumulator_value}, {"eps", eps}};
}

Adagrad::Adagrad(std::vector<ParamGroup> groups, AdagradOptions options)
    : Optimizer("Adagrad", std::move(groups), options.to_map()) {
  for (const ParamGroup& g : groups_) check_options(g.options);
}

void Adagrad::check_options(const Options& o) const {
  for (const char* key : {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"}) {
    check_nonnegative("Adagrad", o, key);
  }
}

void Adagrad::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.options["lr"], lr_decay = group.options["lr_decay"], wd = group.options["weight_decay"],
                 eps = group.options["eps"], init = group.options["initial_accumulator_value"];
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      auto& st = state_of(p);
      if (!st.count("sum")) {
        st["step"] = zeros({}, TensorOptions{.dtype = kFloat64});
        st["sum"] = full(p.sizes(), init, p.options());
      }
      check_state(p, st);
      const double step = next_step(st);
      const Tensor g = decayed_grad(p, wd);
      const double clr = lr / (1 + (step - 1) * lr_decay);
      Tensor& sum_sq = st.at("sum");
      sum_sq.copy_(add(sum_sq, mul(g, g)));
      p.copy_(sub(p.detach(), mul(div(g, add(sqrt(sum_sq), eps)), clr)));
    }
  }
}

Options AdamaxOptions::to_map() const {
  return {{"lr", lr}, {"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay}};
}

Adamax::Adamax(std::vector<ParamGroup> groups, AdamaxOptions options)
    : Optimizer("Adamax", std::move(groups), options.to_map()) {
  for (const ParamGroup& g : groups_) check_options(g.options);
}

void Adamax::check_options(const Options& o) const {
  for (const char* key : {"lr", "eps", "weight_decay"}) check_nonnegative("Adamax", o, key);
  for (const char* key : {"beta1", "beta2"}) {
    if (!(o.at(key) >= 0 && o.at(key) < 1)) fail("Adamax: invalid {} {} (must be in [0, 1))", key, o.at(key));
  }
}

void Adamax::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.options["lr"], b1 = group.options["beta1"], b2 = group.options["beta2"],
                 eps = group.options["eps"], wd = group.options["weight_decay"];
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      auto& st = state_of(p);
      if (!st.count("exp_avg")) {
        st["step"] = zeros({}, TensorOptions{.dtype = kFloat64});
        st["exp_avg"] = zeros(p.sizes(), p.options());
        st["exp_inf"] = zeros(p.sizes(), p.options());
      }
      check_state(p, st);
      const double step = next_step(st);
      const Tensor g = decayed_grad(p, wd);
      Tensor& exp_avg = st.at("exp_avg");
      Tensor& exp_inf = st.at("exp_inf");
      exp_avg.copy_(add(mul(exp_avg, b1), mul(g, 1 - b1)));
      exp_inf.copy_(maximum(mul(exp_inf, b2), add(abs(g), eps)));
      const double clr = lr / (1 - std::pow(b1, step));
      p.copy_(sub(p.detach(), mul(div(exp_avg, exp_inf), clr)));
    }
  }
}

}  // namespace chorus::optim
