// Dynamic loss scaling for float16 training, as torch.amp.GradScaler. float16 gradients underflow
// below 6e-8: the loss is multiplied by a large scale before backward, and the gradients divided by
// it before the optimizer uses them. A step whose gradients hold inf or NaN (the scale was too
// large) is skipped and the scale backed off; after growth_interval good steps in a row it grows.
//
//   optim::GradScaler scaler;
//   for (...) {
//     opt.zero_grad();
//     Tensor loss;
//     { autocast::AutocastGuard amp(DeviceType::CPU, kFloat16); loss = loss_fn(model->forward(x), y); }
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);                                  // optional: before clipping
//     optim::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(opt);                                      // skipped when a gradient is inf/NaN
//     scaler.update();
//   }
//
// With DDP the gradients are already averaged over the processes when step() looks at them, so
// every process sees the same inf/NaN and takes the same decision. Where each process's optimizer
// holds only part of the model (FSDP's shards, a pipeline stage) use distributed::ShardedGradScaler
// (distributed/sharded_grad_scaler.h), which agrees on it over the group.
#pragma once

#include <map>
#include <optional>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace chorus::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale() returns the loss, step() just steps, update() does nothing
};

class GradScaler {
 public:
  // chorus::Error for a non-positive init_scale or growth_interval, growth_factor <= 1 or
  // backoff_factor outside (0, 1).
  explicit GradScaler(GradScalerOptions options = {});
  virtual ~GradScaler() = default;

  // loss * scale (the loss itself when disabled).
  Tensor scale(const Tensor& loss) const;
  // Divides the gradients of `optimizer`'s parameters by the scale, in place, and records whether
  // any of them holds inf or NaN. At most once per optimizer between update()s (chorus::Error on a
  // second call: the gradients would be divided twice).
  void unscale_(Optimizer& optimizer);
  // unscale_ (unless called already this step), then optimizer.step() unless a gradient held inf or
  // NaN. Returns whether the optimizer stepped.
  bool step(Optimizer& optimizer);
  // Once per iteration, after step(): backs the scale off if any optimizer's step was skipped,
  // else counts a good step and grows the scale after growth_interval of them in a row. `new_scale`
  // sets the scale instead (the count of good steps is kept, as PyTorch's). chorus::Error when no
  // step() or unscale_() came before it.
  void update(std::optional<double> new_scale = std::nullopt);

  double get_scale() const { return enabled_ ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }  // good steps in a row since the last change
  bool is_enabled() const { return enabled_; }
  // Whether the last step() of `optimizer` was skipped (inf/NaN found).
  bool found_inf(const Optimizer& optimizer) const;

  // scale, growth_factor, backoff_factor (0-d float64), growth_interval and growth_tracker (0-d
  // int64): what a checkpoint needs to resume with the same scale (nn::Checkpoint::grad_scaler).
  nn::NamedTensors state_dict() const;
  // chorus::Error naming the key when one is missing, of the wrong shape, or out of range.
  void load_state_dict(const nn::NamedTensors& state);

 protected:
  // Whether unscale_ found inf or NaN, from what this process's gradients said: the same here;
  // distributed::ShardedGradScaler agrees over a process group (an optimizer holding shards sees
  // only its own).
  virtual bool combine_found_inf(bool found_inf) { return found_inf; }

 private:
  struct PerOptimizer {
    bool unscaled = false;
    bool stepped = false;
    bool found_inf = false;
  };
  double scale_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  int64_t growth_tracker_ = 0;
  bool enabled_;
  std::map<const Optimizer*, PerOptimizer> this_step_;
};

}  // namespace chorus::optim
