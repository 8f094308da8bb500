// RMSprop, Adagrad and Adamax, as torch.optim's (same options, defaults, state names and update
// order). Written with tensor ops under NoGradGuard, so they step parameters on any device; the
// state is checkpointed like the other optimizers' (Optimizer::state_dict).
#pragma once

#include "optim/optimizer.h"

namespace chorus::optim {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;  // smoothing of the squared-gradient average
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;  // divide by the gradient's variance estimate instead of its second moment
  Options to_map() const;
};

class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<ParamGroup> groups, RMSpropOptions options = {});
  RMSprop(const std::vector<Tensor>& params, RMSpropOptions options = {}) : RMSprop(single_group(params), options) {}
  void step() override;

 protected:
  void check_options(const Options& o) const override;
  std::vector<std::string> required_state(const Options& group) const override;
};

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  Options to_map() const;
};

class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<ParamGroup> groups, AdagradOptions options = {});
  Adagrad(const std::vector<Tensor>& params, AdagradOptions options = {}) : Adagrad(single_group(params), options) {}
  void step() override;

 protected:
  void check_options(const Options& o) const override;
  std::vector<std::string> required_state(const Options& group) const override {
    (void)group;
    return {"step", "sum"};
  }
};

struct AdamaxOptions {
  double lr = 2e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  Options to_map() const;
};

// Adam with the infinity norm: exp_inf = max(beta2 * exp_inf, |g| + eps).
class Adamax : public Optimizer {
 public:
  Adamax(std::vector<ParamGroup> groups, AdamaxOptions options = {});
  Adamax(const std::vector<Tensor>& params, AdamaxOptions options = {}) : Adamax(single_group(params), options) {}
  void step() override;

 protected:
  void check_options(const Options& o) const override;
  std::vector<std::string> required_state(const Options& group) const override {
    (void)group;
    return {"step", "exp_avg", "exp_inf"};
  }
};

}  // namespace chorus::optim
