#include "optim/grad_scaler.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::optim {
namespace {

void check_options(const GradScalerOptions& o) {
  if (!(o.init_scale > 0) || !std::isfinite(o.init_scale))
    fail("GradScaler: init_scale is {}; expected a finite number > 0", o.init_scale);
  if (!(o.growth_factor > 1) || !std::isfinite(o.growth_factor))
    fail("GradScaler: growth_factor is {}; expected a finite number > 1", o.growth_factor);
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
    fail("GradScaler: backoff_factor is {}; expected a number in (0, 1)", o.backoff_factor);
  if (o.growth_interval < 1) fail("GradScaler: growth_interval is {}; expected at least 1", o.growth_interval);
}

// The one element of a 0-d (or 1-element) tensor of the state, named in errors.
double state_value(const nn::NamedTensors& state, const std::string& key) {
  for (const auto& [name, t] : state) {
    if (name != key) continue;
    if (!t.defined() || t.numel() != 1) {
      fail("GradScaler::load_state_dict: '{}' has shape {}; expected a single value",
           key, t.defined() ? shape_str(t.sizes()) : std::string("(undefined)"));
    }
    return t.to(kCPU).to(kFloat64).item<double>();
  }
  fail("GradScaler::load_state_dict: the state has no '{}' (expected scale, growth_factor, backoff_factor, "
       "growth_interval, growth_tracker)",
       key);
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : scale_(options.init_scale),
      growth_factor_(options.growth_factor),
      backoff_factor_(options.backoff_factor),
      growth_interval_(options.growth_interval),
      enabled_(options.enabled) {
  check_options(options);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!loss.defined()) fail("GradScaler::scale: the loss is undefined");
  if (!enabled_) return loss;
  if (!loss.is_floating_point()) fail("GradScaler::scale: the loss has dtype {}; expected a floating-point tensor",
                                      dtype_name(loss.dtype()));
  return mul(loss, scale_);
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!enabled_) return;
  PerOptimizer& st = this_step_[&optimizer];
  if (st.unscaled) fail("GradScaler::unscale_: already called for this optimizer since the last update()");
  if (st.stepped) fail("GradScaler::unscale_: called after step() for this optimizer; expected it before step()");
  NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  // inf * 0 and NaN * 0 are NaN, finite * 0 is 0: one sum per gradient, one read for all of them.
  Tensor nonfinite;
  for (ParamGroup& group : optimizer.param_groups()) {
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      Tensor g = p.grad();
      g.mul_(inv);
      Tensor probe = mul(g, 0.0).sum().to(kFloat32);
      nonfinite = nonfinite.defined() ? add(nonfinite, probe.to(nonfinite.device())) : probe;
    }
  }
  st.found_inf = combine_found_inf(nonfinite.defined() && !std::isfinite(nonfinite.to(kCPU).item<float>()));
  st.unscaled = true;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return true;
  }
  PerOptimizer& st = this_step_[&optimizer];
  if (st.stepped) fail("GradScaler::step: called twice for this optimizer since the last update()");
  if (!st.unscaled) unscale_(optimizer);
  st.stepped = true;
  if (st.found_inf) return false;
  optimizer.step();
  return true;
}

bool GradScaler::found_inf(const Optimizer& optimizer) const {
  auto it = this_step_.find(&optimizer);
  return it != this_step_.end() && it->second.found_inf;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) return;
  if (new_scale) {
    if (!(*new_scale > 0) || !std::isfinite(*new_scale))
      fail("GradScaler::update: new_scale is {}; expected a finite number > 0", *new_scale);
    scale_ = *new_scale;  // the growth tracker goes on counting, as PyTorch's update(new_scale)
    this_step_.clear();
    return;
  }
  if (this_step_.empty()) {
    fail("GradScaler::update: no step() or unscale_() since the last update(); expected scaler.step(optimizer) first");
  }
  bool any_inf = false;
  for (const auto& [opt, st] : this_step_) any_inf = any_inf || st.found_inf;
  if (any_inf) {
    scale_ *= backoff_factor_;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == growth_interval_) {
    const double grown = scale_ * growth_factor_;
    if (std::isfinite(grown)) scale_ = grown;  // as PyTorch: never grow into infinity
    growth_tracker_ = 0;
  }
  this_step_.clear();
}

nn::NamedTensors GradScaler::state_dict() const {
  auto f64 = [](double v) { return full({}, v, {.dtype = kFloat64}); };
  auto i64 = [](int64_t v) { return full({}, v, {.dtype = kInt64}); };
  return {{"scale", f64(scale_)},
          {"growth_factor", f64(growth_factor_)},
          {"backoff_factor", f64(backoff_factor_)},
          {"growth_interval", i64(growth_interval_)},
          {"growth_tracker", i64(growth_tracker_)}};
}

void GradScaler::load_state_dict(const nn::NamedTensors& state) {
  GradScalerOptions o;
  o.init_scale = state_value(state, "scale");
  o.growth_factor = state_value(state, "growth_factor");
  o.backoff_factor = state_value(state, "backoff_factor");
  o.growth_interval = static_cast<int64_t>(state_value(state, "growth_interval"));
  check_options(o);
  const double tracker = state_value(state, "growth_tracker");
  if (tracker < 0 || tracker >= static_cast<double>(o.growth_interval)) {
    fail("GradScaler::load_state_dict: growth_tracker is {}; expected a count in [0, growth_interval {})", tracker,
         o.growth_interval);
  }
  scale_ = o.init_scale;
  growth_factor_ = o.growth_factor;
  backoff_factor_ = o.backoff_factor;
  growth_interval_ = o.growth_interval;
  growth_tracker_ = static_cast<int64_t>(tracker);
  this_step_.clear();
}

}  // namespace chorus::optim
