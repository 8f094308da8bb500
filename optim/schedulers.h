// Learning-rate schedulers, as torch.optim.lr_scheduler: each step() advances last_epoch and sets
// every group's lr from its initial lr (base_lrs). Closed forms, so a resumed schedule (load_state_dict)
// continues exactly.
#pragma once

#include <functional>
#include <memory>
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

  friend class SequentialLR;  // sets its children's epoch and reads their formulas
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

// lr = base * gamma^epoch
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 protected:
  double lr_at(size_t, double base) const override;
  double gamma_;
};

// lr = base * factor, factor going linearly from start_factor to end_factor over total_iters steps.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);

 protected:
  double lr_at(size_t, double base) const override;
  double start_, end_;
  int64_t total_;
};

// lr = base * lambda(epoch); one function for every group. The function is not in the state.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t epoch)> lr_lambda);

 protected:
  double lr_at(size_t, double base) const override;
  std::function<double(int64_t)> lambda_;
};

// torch.optim.lr_scheduler.SequentialLR: schedulers[0] until milestones[0], schedulers[1] until
// milestones[1], ...; each starts at its own epoch 0 when its milestone is reached. Every child
// computes from the learning rates the optimizer had before any scheduler (PyTorch's initial_lr),
// not from what an earlier child left. Children must be made for the same optimizer; only
// SequentialLR.step() is called (stepping a child directly is overridden at the next step).
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);

 protected:
  double lr_at(size_t group, double base) const override;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

// The 1cycle policy (Smith & Topin), as PyTorch's with anneal_strategy "cos" and two phases:
// from max_lr / div_factor up to max_lr over pct_start of total_steps, then down to
// max_lr / (div_factor * final_div_factor). Stepped once per batch; the optimizer's own lr is
// replaced. (PyTorch also cycles momentum; chorus does not.)
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps, double pct_start = 0.3, double div_factor = 25.0,
             double final_div_factor = 1e4);

 protected:
  double lr_at(size_t, double base) const override;
  double max_lr_;
  int64_t total_;
  double pct_, div_, final_div_;
};

// Divides the lr by 1/factor when a metric has not improved for `patience` epochs, as PyTorch's
// ReduceLROnPlateau (mode min or max, relative threshold, cooldown, min_lr). Not an LRScheduler:
// its step takes the metric.
class ReduceLROnPlateau {
 public:
  struct Options {
    bool mode_max = false;  // "max": improving means growing
    double factor = 0.1;
    int64_t patience = 10;
    double threshold = 1e-4;  // relative
    int64_t cooldown = 0;
    double min_lr = 0.0;
    double eps = 1e-8;  // smaller lr changes are skipped
  };
  ReduceLROnPlateau(Optimizer& optimizer, Options options);
  explicit ReduceLROnPlateau(Optimizer& optimizer) : ReduceLROnPlateau(optimizer, Options{}) {}
  void step(double metric);
  std::vector<double> get_last_lr() const;
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  NamedTensors state_dict() const;  // best, num_bad_epochs, cooldown_counter, last_epoch
  void load_state_dict(const NamedTensors& state);

 private:
  Optimizer& optimizer_;
  Options options_;
  double best_;
  int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
};

}  // namespace chorus::optim
