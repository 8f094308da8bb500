#include "optim/schedulers.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <numbers>

#include "tensor/ops.h"

namespace chorus::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (const ParamGroup& g : optimizer.param_groups()) base_lrs_.push_back(g.lr());
  last_lr_ = base_lrs_;
}

void LRScheduler::apply() {
  auto& groups = optimizer_.param_groups();
  if (groups.size() != base_lrs_.size()) {
    fail("LRScheduler: the optimizer has {} parameter groups, the scheduler was made for {}", groups.size(),
         base_lrs_.size());
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const double lr = lr_at(g, base_lrs_[g]);
    groups[g].set_lr(lr);
    last_lr_[g] = lr;
  }
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

NamedTensors LRScheduler::state_dict() const {
  NamedTensors out;
  out.emplace_back("last_epoch", full({}, static_cast<double>(last_epoch_), TensorOptions{.dtype = kInt64}));
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    out.emplace_back("base_lrs." + std::to_string(g), full({}, base_lrs_[g], TensorOptions{.dtype = kFloat64}));
  }
  return out;
}

void LRScheduler::load_state_dict(const NamedTensors& state) {
  // Checked whole into locals first: a refused state changes nothing.
  bool have_epoch = false;
  int64_t epoch = last_epoch_;
  std::vector<double> bases = base_lrs_;
  std::set<size_t> seen;
  for (const auto& [name, t] : state) {
    if (t.numel() != 1) fail("LRScheduler.load_state_dict: '{}' must hold one value, got shape {}", name, shape_str(t.sizes()));
    if (name == "last_epoch") {
      // A lying state (e.g. -2^62) makes every formula's power or cosine produce NaN.
      const int64_t e = t.item<int64_t>();
      if (e < -1 || e > (int64_t(1) << 40)) {
        fail("LRScheduler.load_state_dict: last_epoch {} is outside [-1, 2^40] (corrupt state?)", e);
      }
      if (have_epoch) fail("LRScheduler.load_state_dict: 'last_epoch' appears twice");
      epoch = e;
      have_epoch = true;
    } else if (name.rfind("base_lrs.", 0) == 0) {
      const std::string digits = name.substr(9);
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
        fail("LRScheduler.load_state_dict: '{}' should be base_lrs.<group index>", name);
      }
      const size_t g = std::stoul(digits);
      if (g >= bases.size()) fail("LRScheduler.load_state_dict: '{}' but the optimizer has {} groups", name, bases.size());
      if (!seen.insert(g).second) fail("LRScheduler.load_state_dict: '{}' appears twice", name);
      bases[g] = t.item<double>();
      if (!(bases[g] >= 0) || !std::isfinite(bases[g])) {
        fail("LRScheduler.load_state_dict: '{}' = {} is not a valid learning rate (finite, >= 0)", name, bases[g]);
      }
    } else {
      fail("LRScheduler.load_state_dict: unexpected key '{}' (expected last_epoch, base_lrs.<g>)", name);
    }
  }
  if (!have_epoch || seen.size() != bases.size()) {
    fail("LRScheduler.load_state_dict: expected last_epoch and {} base_lrs entries, got {} entries", bases.size(),
         state.size());
  }
  last_epoch_ = epoch;
  base_lrs_ = bases;
  apply();
}

StepLR::StepLR(Optimizer& o, int64_t step_size, double gamma) : LRScheduler(o), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) fail("StepLR: step_size must be positive, got {}", step_size);
  apply();
}
double StepLR::lr_at(size_t, double base) const {
  return base * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& o, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(o), milestones_(std::move(milestones)), gamma_(gamma) {
  if (!std::is_sorted(milestones_.begin(), milestones_.end())) fail("MultiStepLR: milestones must be increasing");
  apply();
}
double MultiStepLR::lr_at(size_t, double base) const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  return base * std::pow(gamma_, static_cast<double>(passed));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& o, int64_t t_max, double eta_min)
    : LRScheduler(o), t_max_(t_max), eta_min_(eta_min) {
  if (t_max <= 0) fail("CosineAnnealingLR: T_max must be positive, got {}", t_max);
  apply();
}
double CosineAnnealingLR::lr_at(size_t, double base) const {
  return eta_min_ + (base - eta_min_) * (1 + std::cos(std::numbers::pi * static_cast<double>(last_epoch_) /
                                                      static_cast<double>(t_max_))) / 2;
}

WarmupDecayLR::WarmupDecayLR(Optimizer& o, int64_t warmup, int64_t total, Decay decay, double min_lr)
    : LRScheduler(o), warmup_(warmup), total_(total), decay_(decay), min_lr_(min_lr) {
  if (warmup < 0 || total <= 0 || warmup > total) {
    fail("WarmupDecayLR: need 0 <= warmup_steps ({}) <= total_steps ({}) and total_steps > 0", warmup, total);
  }
  apply();
}
double WarmupDecayLR::lr_at(size_t, double base) const {
  const double t = static_cast<double>(last_epoch_);
  if (last_epoch_ < warmup_) return base * t / static_cast<double>(warmup_);
  if (last_epoch_ >= total_) return min_lr_;
  const double progress = (t - static_cast<double>(warmup_)) / static_cast<double>(total_ - warmup_);
  const double factor = decay_ == Decay::Linear ? 1 - progress : (1 + std::cos(std::numbers::pi * progress)) / 2;
  return min_lr_ + (base - min_lr_) * factor;
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) {
  if (!(gamma > 0) || !std::isfinite(gamma)) fail("ExponentialLR: gamma is {}; expected a finite number > 0", gamma);
}
double ExponentialLR::lr_at(size_t, double base) const { return base * std::pow(gamma_, static_cast<double>(last_epoch_)); }

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer), start_(start_factor), end_(end_factor), total_(total_iters) {
  if (!(start_factor > 0 && start_factor <= 1) || !(end_factor >= 0 && end_factor <= 1)) {
    fail("LinearLR: start_factor {} must be in (0, 1] and end_factor {} in [0, 1]", start_factor, end_factor);
  }
  if (total_iters < 1) fail("LinearLR: total_iters is {}; expected at least 1", total_iters);
  apply();
}
double LinearLR::lr_at(size_t, double base) const {
  const double t = static_cast<double>(std::min(last_epoch_, total_)) / static_cast<double>(total_);
  return base * (start_ + (end_ - start_) * t);
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : LRScheduler(optimizer), lambda_(std::move(lr_lambda)) {
  if (!lambda_) fail("LambdaLR: no lr_lambda given");
  apply();
}
double LambdaLR::lr_at(size_t, double base) const { return base * lambda_(last_epoch_); }

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  if (schedulers_.empty()) fail("SequentialLR: expected at least one scheduler, got none");
  if (milestones_.size() != schedulers_.size() - 1) {
    fail("SequentialLR: {} schedulers need {} milestones, got {}", schedulers_.size(), schedulers_.size() - 1,
         milestones_.size());
  }
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    if (!schedulers_[i]) fail("SequentialLR: scheduler {} is null", i);
    if (&schedulers_[i]->optimizer_ != &optimizer) {
      fail("SequentialLR: scheduler {} was made for another optimizer; every scheduler must drive this one", i);
    }
  }
  for (size_t i = 0; i < milestones_.size(); ++i) {
    if (milestones_[i] < 1 || (i > 0 && milestones_[i] <= milestones_[i - 1])) {
      fail("SequentialLR: milestones must be positive and increasing, got {} at position {}", milestones_[i], i);
    }
  }
  // The learning rates before any scheduler touched the optimizer: the first child's (each child
  // applied its epoch-0 rate when it was made, so the optimizer's current rates are not them).
  base_lrs_ = schedulers_.front()->base_lrs_;
  apply();
}

double SequentialLR::lr_at(size_t group, double base) const {
  const size_t active =
      static_cast<size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& child = *schedulers_[active];
  child.last_epoch_ = active == 0 ? last_epoch_ : last_epoch_ - milestones_[active - 1];
  return child.lr_at(group, base);
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps, double pct_start, double div_factor,
                       double final_div_factor)
    : LRScheduler(optimizer), max_lr_(max_lr), total_(total_steps), pct_(pct_start), div_(div_factor),
      final_div_(final_div_factor) {
  if (!(max_lr > 0)) fail("OneCycleLR: max_lr is {}; expected a positive learning rate", max_lr);
  if (total_steps < 2) fail("OneCycleLR: total_steps is {}; expected at least 2", total_steps);
  if (!(pct_start > 0 && pct_start < 1)) fail("OneCycleLR: pct_start is {}; expected a number in (0, 1)", pct_start);
  if (!(div_factor > 0) || !(final_div_factor > 0)) {
    fail("OneCycleLR: div_factor {} and final_div_factor {} must be positive", div_factor, final_div_factor);
  }
  apply();
}
double OneCycleLR::lr_at(size_t, double) const {
  const double initial = max_lr_ / div_, minimum = initial / final_div_;
  // PyTorch's phase ends: step pct*total - 1 reaches max_lr, step total - 1 reaches the minimum.
  const double up_end = pct_ * static_cast<double>(total_) - 1, down_end = static_cast<double>(total_) - 1;
  const double step = static_cast<double>(last_epoch_);
  auto cos_anneal = [](double start, double end, double pct) { return end + (start - end) / 2 * (std::cos(std::numbers::pi * pct) + 1); };
  if (step <= up_end) return cos_anneal(initial, max_lr_, step / up_end);
  return cos_anneal(max_lr_, minimum, std::min(1.0, (step - up_end) / (down_end - up_end)));
}

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, Options options) : optimizer_(optimizer), options_(options) {
  if (!(options.factor > 0 && options.factor < 1)) fail("ReduceLROnPlateau: factor is {}; expected a number in (0, 1)", options.factor);
  if (options.patience < 0 || options.cooldown < 0) {
    fail("ReduceLROnPlateau: patience {} and cooldown {} must be >= 0", options.patience, options.cooldown);
  }
  best_ = options.mode_max ? -INFINITY : INFINITY;
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  const bool better = options_.mode_max ? metric > best_ * (1 + options_.threshold * (best_ >= 0 ? 1 : -1))
                                        : metric < best_ * (1 - options_.threshold * (best_ >= 0 ? 1 : -1));
  if (better) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ > options_.patience) {
    for (ParamGroup& g : optimizer_.param_groups()) {
      const double lr = std::max(g.lr() * options_.factor, options_.min_lr);
      if (g.lr() - lr > options_.eps) g.set_lr(lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
}

std::vector<double> ReduceLROnPlateau::get_last_lr() const {
  std::vector<double> out;
  for (const ParamGroup& g : optimizer_.param_groups()) out.push_back(g.lr());
  return out;
}

NamedTensors ReduceLROnPlateau::state_dict() const {
  auto f64 = [](double v) { return full({}, v, TensorOptions{.dtype = kFloat64}); };
  return {{"best", f64(best_)},
          {"num_bad_epochs", f64(static_cast<double>(num_bad_epochs_))},
          {"cooldown_counter", f64(static_cast<double>(cooldown_counter_))},
          {"last_epoch", f64(static_cast<double>(last_epoch_))}};
}

void ReduceLROnPlateau::load_state_dict(const NamedTensors& state) {
  auto get = [&state](const char* key) {
    for (const auto& [name, t] : state)
      if (name == key) return t.to(kFloat64).item<double>();
    fail("ReduceLROnPlateau.load_state_dict: the state has no '{}'", key);
  };
  // Every value checked before any is taken: a refused state changes nothing.
  auto count = [&](const char* key, double lo) {
    const double v = get(key);
    if (!(v >= lo) || v > 1e15 || v != std::floor(v)) {
      fail("ReduceLROnPlateau.load_state_dict: '{}' is {}, expected a whole number >= {}", key, v, lo);
    }
    return static_cast<int64_t>(v);
  };
  const double best = get("best");
  if (std::isnan(best)) fail("ReduceLROnPlateau.load_state_dict: 'best' is NaN");
  const int64_t bad = count("num_bad_epochs", 0), cooldown = count("cooldown_counter", 0),
                epoch = count("last_epoch", -1);
  best_ = best;
  num_bad_epochs_ = bad;
  cooldown_counter_ = cooldown;
  last_epoch_ = epoch;
}

}  // namespace chorus::optim
