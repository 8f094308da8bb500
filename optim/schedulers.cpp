#include "optim/schedulers.h"

#include <algorithm>
#include <cmath>
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
  bool have_epoch = false;
  std::vector<double> bases = base_lrs_;
  size_t seen = 0;
  for (const auto& [name, t] : state) {
    if (t.numel() != 1) fail("LRScheduler.load_state_dict: '{}' must hold one value, got shape {}", name, shape_str(t.sizes()));
    if (name == "last_epoch") {
      // A lying state (e.g. -2^62) makes every formula's power or cosine produce NaN.
      const int64_t e = t.item<int64_t>();
      if (e < -1 || e > (int64_t(1) << 40)) {
        fail("LRScheduler.load_state_dict: last_epoch {} is outside [-1, 2^40] (corrupt state?)", e);
      }
      last_epoch_ = e;
      have_epoch = true;
    } else if (name.rfind("base_lrs.", 0) == 0) {
      const std::string digits = name.substr(9);
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
        fail("LRScheduler.load_state_dict: '{}' should be base_lrs.<group index>", name);
      }
      const size_t g = std::stoul(digits);
      if (g >= bases.size()) fail("LRScheduler.load_state_dict: '{}' but the optimizer has {} groups", name, bases.size());
      bases[g] = t.item<double>();
      if (!(bases[g] >= 0) || !std::isfinite(bases[g])) {
        fail("LRScheduler.load_state_dict: '{}' = {} is not a valid learning rate (finite, >= 0)", name, bases[g]);
      }
      ++seen;
    } else {
      fail("LRScheduler.load_state_dict: unexpected key '{}' (expected last_epoch, base_lrs.<g>)", name);
    }
  }
  if (!have_epoch || seen != bases.size()) {
    fail("LRScheduler.load_state_dict: expected last_epoch and {} base_lrs entries, got {} entries", bases.size(),
         state.size());
  }
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

}  // namespace chorus::optim
