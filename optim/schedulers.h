// Learning-rate schedulers, as torch.optim.lr_scheduler: each step() advances last_epoch and sets
// every group's lr from its initial lr (base_lrs). Closed forms, so a resumed schedule (load_state_dict)
// continues exactly.
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace chorus::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  void step();
  std::vector<double> get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  NamedTensors state_dict() const;  // last_epoch, base_lrs.<g>
  void load_state_dict(const NamedTensors& state);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // The lr of group g at last_epoch_ (closed form).
  virtual double lr_at(size_t group, double base_lr) const = 0;
  void apply();

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
};

// lr = base * gamma^(epoch / step_size)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double lr_at(size_t, double base) const override;
  int64_t step_size_;
  double gamma_;
};

// lr = base * gamma^(number of milestones <= epoch)
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  double lr_at(size_t, double base) const override;
  std::vector<int64_t> milestones_;
  double gamma_;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);

 protected:
  double lr_at(size_t, double base) const override;
  int64_t t_max_;
  double eta_min_;
};

// Linear warm-up from 0 to base over warmup_steps, then linear or cosine decay to min_lr at
// total_steps (BERT's schedule). Stepped once per optimizer step.
class WarmupDecayLR : public LRScheduler {
 public:
  enum class Decay { Linear, Cosine };
  WarmupDecayLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, Decay decay = Decay::Linear,
                double min_lr = 0.0);

 protected:
  double lr_at(size_t, double base) const override;
  int64_t warmup_, total_;
  Decay decay_;
  double min_lr_;
};

}  // namespace chorus::optim
