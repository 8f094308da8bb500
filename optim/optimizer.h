// Optimizers, as torch::optim: parameter groups with their own options, step(), zero_grad(), and
// state_dict()/load_state_dict() as named tensors (so a checkpoint holds them as safetensors):
//   param_groups.<g>.<option>         0-d float64 (lr, momentum, betas as beta1/beta2, ...)
//   state.<i>.<buffer>                per parameter i (global index over all groups, in order):
//                                     momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq, step
// SGD and Adam/AdamW step a group one parameter at a time or through the multi-tensor kernels
// (options `foreach` and `fused`, as PyTorch's); the state and its state_dict are the same either way.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace chorus::optim {

using nn::NamedTensors;

// One group's hyperparameters by name ("lr", "momentum", ...). Every optimizer fills its defaults.
using Options = std::map<std::string, double>;

struct ParamGroup {
  std::vector<Tensor> params;
  Options options;  // unset keys take the optimizer's defaults when the group is added
  double lr() const { return options.at("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // set_to_none (the default, as PyTorch 2) drops .grad; otherwise gradients are zeroed in place.
  void zero_grad(bool set_to_none = true);
  void add_param_group(ParamGroup group);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const Options& defaults() const { return defaults_; }

  // Whether step() updates `group` through the multi-tensor kernels (see MultiTensorChoice) rather
  // than one parameter at a time.
  virtual bool uses_multi_tensor(const ParamGroup& group) const {
    (void)group;
    return false;
  }

  virtual NamedTensors state_dict() const;
  // Checks the group count, parameter count and each buffer's shape; chorus::Error on mismatch.
  virtual void load_state_dict(const NamedTensors& state);

 protected:
  Optimizer(std::string name, std::vector<ParamGroup> groups, Options defaults);
  // Per-parameter state buffers, created on first use.
  std::map<std::string, Tensor>& state_of(const Tensor& param);
  virtual void check_options(const Options& options) const = 0;
  // The buffers a loaded state must hold for one parameter of a group with these options (e.g.
  // Adam: step, exp_avg, exp_avg_sq, and max_exp_avg_sq with amsgrad), so a state missing one is an
  // error at load naming it, not a failure inside step().
  virtual std::vector<std::string> required_state(const Options& group) const {
    (void)group;
    return {};
  }
  // Before a step reads or changes `param`'s state: every buffer has the parameter's dtype, device
  // and shape, and `step` is a float64 CPU scalar. A model moved or cast (Module::to) after the
  // optimizer made its state would otherwise be stepped with buffers of another type or device;
  // the error names the buffer and the fix. Call it before incrementing `step`.
  void check_state(const Tensor& param, const std::map<std::string, Tensor>& state) const;

  // load_state_dict in two halves, so that a subclass with state of its own (LBFGS) checks all of
  // it before anything changes: read_state_dict checks and changes nothing; apply_state_dict
  // cannot fail.
  struct LoadedState {
    std::vector<Options> options;                                // per group
    std::map<int64_t, std::map<std::string, Tensor>> buffers;    // per global parameter index
  };
  LoadedState read_state_dict(const NamedTensors& state) const;
  void apply_state_dict(LoadedState loaded);

  std::string name_;
  Options defaults_;
  std::vector<ParamGroup> groups_;
  std::map<const void*, std::map<std::string, Tensor>> state_;  // keyed by TensorImpl

 private:
  int64_t global_index(const Tensor& p) const;
};

// Wraps a plain parameter list as one group.
std::vector<ParamGroup> single_group(const std::vector<Tensor>& params);

// How SGD and Adam/AdamW step a group, as PyTorch's `foreach` and `fused` options:
// - foreach = true: the multi-tensor path (optim/foreach.h): one kernel launch per device, dtype
//   and per-launch scalars (Adam's step count, SGD's first momentum step) over all of the group's
//   parameters with a gradient, instead of one per parameter. false: one parameter at a time.
//   Unset (the default): true for a group whose parameters are all on one device with one
//   floating dtype (float32 or float64), else false.
// - fused = true: the fused multi-tensor kernel, as torch's fused=True; on cuda and sim that is
//   the multi-tensor apply kernel, on the CPU the foreach loop (chorus has one multi-tensor kernel
//   per optimizer and device, so fused and foreach run the same code). Needs float32/float64
//   parameters; fused and foreach both true is an error, as in PyTorch.
// Every path rounds alike: results are bit-identical, and the state (and its state_dict) the same.
struct MultiTensorChoice {
  std::optional<bool> foreach;
  bool fused = false;
  bool for_group(const ParamGroup& group) const;
  // chorus::Error naming the optimizer for fused with foreach, or fused with a non-float parameter.
  void check(const std::string& optimizer, const std::vector<ParamGroup>& groups) const;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  std::optional<bool> foreach{};  // MultiTensorChoice; not a group option (not in the state_dict)
  bool fused = false;
  Options to_map() const;
};

// p -= lr * v, v = momentum * v + (1 - dampening) * (g + wd * p) (v = g on the first step);
// nesterov uses g + momentum * v.
class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  SGD(const std::vector<Tensor>& params, SGDOptions options) : SGD(single_group(params), options) {}
  void step() override;
  bool uses_multi_tensor(const ParamGroup& group) const override { return multi_tensor_.for_group(group); }

 protected:
  void check_options(const Options& o) const override;
  std::vector<std::string> required_state(const Options& group) const override {
    return group.at("momentum") != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  }

 private:
  void step_multi_tensor(ParamGroup& group);
  MultiTensorChoice multi_tensor_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled (default 0.01)
  bool amsgrad = false;
  std::optional<bool> foreach{};  // MultiTensorChoice; not a group option (not in the state_dict)
  bool fused = false;
  Options to_map() const;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, AdamOptions options);
  Adam(const std::vector<Tensor>& params, AdamOptions options) : Adam(single_group(params), options) {}
  void step() override;
  bool uses_multi_tensor(const ParamGroup& group) const override { return multi_tensor_.for_group(group); }

 protected:
  Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled);
  void check_options(const Options& o) const override;
  std::vector<std::string> required_state(const Options& group) const override;
  bool decoupled_;

 private:
  void step_multi_tensor(ParamGroup& group);
  MultiTensorChoice multi_tensor_;
};

// Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam update.
class AdamW : public Adam {
 public:
  static AdamOptions default_options() {
    AdamOptions o;
    o.weight_decay = 1e-2;
    return o;
  }
  AdamW(std::vector<ParamGroup> groups, AdamOptions options = default_options());
  AdamW(const std::vector<Tensor>& params, AdamOptions options = default_options())
      : AdamW(single_group(params), options) {}
};

}  // namespace chorus::optim
