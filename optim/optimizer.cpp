#include "optim/optimizer.h"

#include <fmt/format.h>

#include <cmath>
#include <tuple>

#include "autograd/grad_mode.h"
#include "kernels/dispatch.h"
#include "optim/foreach.h"
#include "tensor/ops.h"

namespace chorus::optim {
namespace {

// The contiguous gradient (in the parameter's dtype) and the contiguous parameter an update kernel
// runs over, on the parameter's device; `finish` writes a non-contiguous parameter back and bumps
// its version, as PyTorch's in-place optimizer updates do.
struct Raw {
  Tensor param, grad;
};
Raw raw_operands(const std::string& opt, Tensor& p) {
  if (p.dtype() != kFloat32 && p.dtype() != kFloat64) {
    fail("{}: parameters must be float32 or float64, got {}", opt, dtype_name(p.dtype()));
  }
  Tensor g = p.grad();
  if (g.sizes() != p.sizes()) {
    fail("{}: gradient of shape {} does not match its parameter's shape {}", opt, shape_str(g.sizes()),
         shape_str(p.sizes()));
  }
  if (g.device() != p.device()) {
    fail("{}: gradient on {} but its parameter on {}", opt, g.device().str(), p.device().str());
  }
  // A parameter dense in its layout (row-major, or channels-last after Module::to(ChannelsLast)) is
  // updated in place, with its gradient and state in the same layout: the kernels pair elements by
  // memory position. Any other parameter (a strided view) goes through a contiguous copy.
  const MemoryFormat format = p.suggest_memory_format();
  Tensor gc = (g.dtype() == p.dtype() ? g : g.to(p.dtype())).contiguous(format);
  return {p.contiguous(format), gc};
}

// An optimizer state tensor in the layout of the parameter operand it is updated with (a state made
// before Module::to(ChannelsLast), or loaded from a checkpoint, is relaid once and kept that way).
Tensor& in_layout(Tensor& state, const Tensor& param) {
  const MemoryFormat format = param.suggest_memory_format();
  if (!state.is_contiguous(format)) {
    NoGradGuard no_grad;
    state = state.contiguous(format);
  }
  return state;
}
void finish(Tensor& p, const Raw& raw) {
  if (!raw.param.is_same(p)) {
    NoGradGuard no_grad;
    p.copy_(raw.param);
  }
  p.bump_version();
}

// The parameters of one group that have a gradient, with their kernel operands. All are checked
// before any state is created or any parameter moves, so a bad gradient leaves the group as it was.
struct WithGrad {
  std::vector<Tensor*> params;
  std::vector<Raw> raws;
};
WithGrad with_grad(const std::string& opt, ParamGroup& group) {
  WithGrad out;
  for (Tensor& p : group.params) {
    if (!p.grad().defined()) continue;
    out.raws.push_back(raw_operands(opt, p));
    out.params.push_back(&p);
  }
  return out;
}

// After a multi-tensor call, which bumped the versions of the tensors it updated: non-contiguous
// parameters get their updated copies back.
void finish_all(WithGrad& pending) {
  for (size_t i = 0; i < pending.params.size(); ++i) {
    if (!pending.raws[i].param.is_same(*pending.params[i])) finish(*pending.params[i], pending.raws[i]);
  }
}

// Indices of a group's parameters sorted into the launches of the multi-tensor path: one per
// distinct key (device, dtype and what the launch's scalars depend on), in first-seen order.
template <typename Key>
std::vector<std::vector<size_t>> buckets_by(const std::vector<Key>& keys) {
  std::vector<Key> seen;
  std::vector<std::vector<size_t>> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    size_t b = 0;
    while (b < seen.size() && !(seen[b] == keys[i])) ++b;
    if (b == seen.size()) {
      seen.push_back(keys[i]);
      out.emplace_back();
    }
    out[b].push_back(i);
  }
  return out;
}

// Adam's per-parameter state on its first step (the per-tensor and multi-tensor paths alike).
// amsgrad turned on after the state was made starts its running maximum then, from zeros as on a
// first step (PyTorch raises a KeyError there); without it the step would silently be plain Adam's.
void init_adam_state(std::map<std::string, Tensor>& st, const Tensor& p, bool amsgrad) {
  if (!st.count("exp_avg")) {
    st["step"] = zeros({}, TensorOptions{.dtype = kFloat64});
    st["exp_avg"] = zeros_like(p);
    st["exp_avg_sq"] = zeros_like(p);
  }
  if (amsgrad && !st.count("max_exp_avg_sq")) st["max_exp_avg_sq"] = zeros_like(p);
}

}  // namespace

bool MultiTensorChoice::for_group(const ParamGroup& group) const {
  if (fused) return true;
  if (foreach.has_value()) return *foreach;
  if (group.params.empty()) return false;
  const Tensor& first = group.params.front();
  for (const Tensor& p : group.params) {
    if (p.device() != first.device() || p.dtype() != first.dtype()) return false;
    if (p.dtype() != kFloat32 && p.dtype() != kFloat64) return false;
  }
  return true;
}

void MultiTensorChoice::check(const std::string& optimizer, const std::vector<ParamGroup>& groups) const {
  if (fused && foreach.value_or(false)) {
    fail("{}: `fused` and `foreach` cannot both be true (fused is the multi-tensor kernel already; set one)",
         optimizer);
  }
  if (!fused) return;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (size_t i = 0; i < groups[gi].params.size(); ++i) {
      const DType dtype = groups[gi].params[i].dtype();
      if (dtype != kFloat32 && dtype != kFloat64) {
        fail("{}: fused=true needs float32 or float64 parameters, but parameter {} of group {} is {}", optimizer, i,
             gi, dtype_name(dtype));
      }
    }
  }
}

std::vector<ParamGroup> single_group(const std::vector<Tensor>& params) { return {ParamGroup{params, {}}}; }

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, Options defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {
  if (groups.empty()) fail("{}: got an empty list of parameter groups", name_);
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  for (const auto& [key, value] : group.options) {
    if (!defaults_.count(key)) fail("{}: unknown option '{}' in a parameter group", name_, key);
  }
  for (const auto& [key, value] : defaults_) group.options.try_emplace(key, value);
  for (const Tensor& p : group.params) {
    if (!p.defined()) fail("{}: a parameter group holds an undefined tensor", name_);
    if (!p.requires_grad()) fail("{}: can only optimize tensors that require grad (a leaf with requires_grad)", name_);
    for (const ParamGroup& other : groups_)
      for (const Tensor& q : other.params)
        if (q.is_same(p)) fail("{}: some parameters appear in more than one parameter group", name_);
  }
  // Subclasses check in their constructors (after this, when all groups are in): see check_options.
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  for (ParamGroup& g : groups_) {
    for (Tensor& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        NoGradGuard no_grad;
        Tensor gr = p.grad();
        gr.zero_();
      }
    }
  }
}

std::map<std::string, Tensor>& Optimizer::state_of(const Tensor& param) { return state_[param.unsafe_impl()]; }

int64_t Optimizer::global_index(const Tensor& p) const {
  int64_t i = 0;
  for (const ParamGroup& g : groups_)
    for (const Tensor& q : g.params) {
      if (q.is_same(p)) return i;
      ++i;
    }
  return -1;
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const std::string prefix = "param_groups." + std::to_string(gi) + ".";
    for (const auto& [key, value] : groups_[gi].options) {
      out.emplace_back(prefix + key, full({}, value, TensorOptions{.dtype = kFloat64}));
    }
    out.emplace_back(prefix + "num_params",
                     full({}, static_cast<double>(groups_[gi].params.size()), TensorOptions{.dtype = kInt64}));
  }
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    for (const Tensor& p : g.params) {
      auto it = state_.find(p.unsafe_impl());
      if (it != state_.end()) {
        // A snapshot in host memory: a device buffer copied on the device would double the
        // optimizer's device memory while a checkpoint is written.
        for (const auto& [name, t] : it->second) {
          out.emplace_back("state." + std::to_string(index) + "." + name, t.device().is_cpu() ? t.clone() : t.cpu());
        }
      }
      ++index;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) { apply_state_dict(read_state_dict(state)); }

Optimizer::LoadedState Optimizer::read_state_dict(const NamedTensors& state) const {
  std::vector<Tensor> flat;
  std::vector<size_t> group_of;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const Tensor& p : groups_[gi].params) {
      flat.push_back(p);
      group_of.push_back(gi);
    }
  }
  std::vector<Options> options(groups_.size());
  std::map<int64_t, std::map<std::string, Tensor>> buffers;
  for (const auto& [name, t] : state) {
    if (name.rfind("param_groups.", 0) == 0) {
      const std::string rest = name.substr(13);
      const size_t dot = rest.find('.');
      const std::string digits = dot == std::string::npos ? "" : rest.substr(0, dot);
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
        fail("{}.load_state_dict: '{}' should be param_groups.<group index>.<option>, and '{}' is not an index",
             name_, name, digits);
      }
      const size_t gi = std::stoul(digits);
      if (gi >= groups_.size()) {
        fail("{}.load_state_dict: '{}' names a parameter group this optimizer does not have ({} groups)", name_, name,
             groups_.size());
      }
      const std::string key = rest.substr(dot + 1);
      if (key == "num_params") {
        if (t.item<int64_t>() != static_cast<int64_t>(groups_[gi].params.size())) {
          fail("{}.load_state_dict: group {} has {} parameters in the state but {} in this optimizer", name_, gi,
               t.item<int64_t>(), groups_[gi].params.size());
        }
        continue;
      }
      if (!defaults_.count(key)) fail("{}.load_state_dict: unknown option '{}' in '{}'", name_, key, name);
      options[gi][key] = t.item<double>();
    } else if (name.rfind("state.", 0) == 0) {
      const std::string rest = name.substr(6);
      const size_t dot = rest.find('.');
      if (dot == std::string::npos) fail("{}.load_state_dict: malformed key '{}'", name_, name);
      const std::string digits = rest.substr(0, dot);
      if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
        fail("{}.load_state_dict: '{}' should be state.<parameter index>.<buffer>, and '{}' is not an index", name_,
             name, digits);
      }
      const int64_t index = std::stoll(digits);
      if (index < 0 || index >= static_cast<int64_t>(flat.size())) {
        fail("{}.load_state_dict: '{}' refers to parameter {}, but this optimizer has {} parameters", name_, name,
             index, flat.size());
      }
      const std::string buffer = rest.substr(dot + 1);
      if (buffer != "step" && t.sizes() != flat[index].sizes()) {
        fail("{}.load_state_dict: '{}' has shape {}, but parameter {} has shape {}", name_, name, shape_str(t.sizes()),
             index, shape_str(flat[index].sizes()));
      }
      // The step count stays a float64 CPU scalar (as PyTorch's non-capturable optimizers); the
      // buffers go to the parameter's device and dtype, wherever the state was saved from.
      buffers[index][buffer] = buffer == "step" ? t.cpu().to(kFloat64).clone()
                                                : t.to(flat[index].dtype()).to(flat[index].device()).clone();
    } else {
      fail("{}.load_state_dict: unexpected key '{}' (expected param_groups.* or state.*)", name_, name);
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const auto& [key, value] : defaults_) {
      if (!options[gi].count(key)) fail("{}.load_state_dict: the state has no 'param_groups.{}.{}'", name_, gi, key);
    }
    check_options(options[gi]);
  }
  for (const auto& [index, bufs] : buffers) {
    for (const std::string& want : required_state(options[group_of[index]])) {
      if (!bufs.count(want)) {
        std::vector<std::string> have;
        for (const auto& [k, v] : bufs) have.push_back(k);
        fail("{}.load_state_dict: the state of parameter {} has no '{}' (it has: {})", name_, index, want,
             fmt::join(have, ", "));
      }
    }
    if (auto it = bufs.find("step"); it != bufs.end()) {
      const double step = it->second.item<double>();
      if (!(step >= 0) || step > 1e15 || step != std::floor(step)) {
        fail("{}.load_state_dict: parameter {} has step {}, expected a whole number >= 0", name_, index, step);
      }
    }
  }
  return {std::move(options), std::move(buffers)};
}

void Optimizer::apply_state_dict(LoadedState loaded) {
  std::vector<const void*> flat;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) flat.push_back(p.unsafe_impl());
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = std::move(loaded.options[gi]);
  state_.clear();
  for (auto& [index, bufs] : loaded.buffers) state_[flat[index]] = std::move(bufs);
}

void Optimizer::check_state(const Tensor& param, const std::map<std::string, Tensor>& state) const {
  for (const auto& [name, t] : state) {
    if (name == "step") {
      if (!t.device().is_cpu() || t.dtype() != kFloat64 || t.numel() != 1) {
        fail("{}: the 'step' state of parameter {} is a {} {} tensor of shape {}; expected a float64 CPU scalar",
             name_, global_index(param), t.device().str(), dtype_name(t.dtype()), shape_str(t.sizes()));
      }
      continue;
    }
    if (t.dtype() != param.dtype() || t.device() != param.device() || t.sizes() != param.sizes()) {
      fail("{}: the state '{}' of parameter {} is {} on {} with shape {}, but the parameter is {} on {} with shape "
           "{}: it changed (Module::to?) after the optimizer made its state. Move or cast the model before building "
           "the optimizer, or save state_dict() and load_state_dict() it again, which puts each buffer on its "
           "parameter's device and dtype",
           name_, name, global_index(param), dtype_name(t.dtype()), t.device().str(), shape_str(t.sizes()),
           dtype_name(param.dtype()), param.device().str(), shape_str(param.sizes()));
    }
  }
}

// ------------------------------------------------------------------ SGD
Options SGDOptions::to_map() const {
  return {{"lr", lr}, {"momentum", momentum}, {"dampening", dampening}, {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0}};
}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer("SGD", std::move(groups), options.to_map()),
      multi_tensor_{.foreach = options.foreach, .fused = options.fused} {
  for (const ParamGroup& g : groups_) check_options(g.options);
  multi_tensor_.check(name_, groups_);
}

void SGD::check_options(const Options& o) const {
  // As PyTorch ("Invalid learning rate"), and NaN and infinity too: they train to NaN silently.
  if (!(o.at("lr") >= 0) || !std::isfinite(o.at("lr"))) {
    fail("SGD: invalid learning rate {} (must be finite and >= 0)", o.at("lr"));
  }
  if (!(o.at("momentum") >= 0) || !std::isfinite(o.at("momentum"))) {
    fail("SGD: invalid momentum {} (must be finite and >= 0)", o.at("momentum"));
  }
  if (!(o.at("weight_decay") >= 0) || !std::isfinite(o.at("weight_decay"))) {
    fail("SGD: invalid weight_decay {} (must be finite and >= 0)", o.at("weight_decay"));
  }
  if (o.at("nesterov") != 0 && (o.at("momentum") <= 0 || o.at("dampening") != 0)) {
    fail("SGD: nesterov momentum requires a momentum > 0 and zero dampening (got momentum {}, dampening {})",
         o.at("momentum"), o.at("dampening"));
  }
}

void SGD::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.options["lr"], mom = group.options["momentum"], damp = group.options["dampening"],
                 wd = group.options["weight_decay"];
    const bool nesterov = group.options["nesterov"] != 0;
    if (uses_multi_tensor(group)) {
      step_multi_tensor(group);
      continue;
    }
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      std::map<std::string, Tensor>* st = nullptr;
      bool first = false;
      if (mom != 0) {
        st = &state_of(p);
        if (!st->count("momentum_buffer")) {
          (*st)["momentum_buffer"] = zeros_like(p);
          first = true;
        }
        check_state(p, *st);
      }
      Raw raw = raw_operands("SGD", p);
      kernels::sgd_step(raw.param, raw.grad, st ? in_layout(st->at("momentum_buffer"), raw.param) : Tensor(), lr, wd,
                        mom, damp, nesterov, first);
      finish(p, raw);
    }
  }
}

// The foreach / fused path: the per-tensor loop above, with the kernel calls gathered into one
// multi-tensor call per (device, dtype, first step). `first` varies within a group when a parameter
// got its first gradient later than the others.
void SGD::step_multi_tensor(ParamGroup& group) {
  const SgdStepOptions options{.lr = group.options["lr"],
                               .momentum = group.options["momentum"],
                               .dampening = group.options["dampening"],
                               .weight_decay = group.options["weight_decay"],
                               .nesterov = group.options["nesterov"] != 0};
  WithGrad pending = with_grad("SGD", group);
  const size_t n = pending.params.size();
  std::vector<Tensor> buffers(n);
  std::vector<std::tuple<Device, DType, bool>> keys;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = *pending.params[i];
    bool first = false;
    if (options.momentum != 0) {
      auto& st = state_of(p);
      if (!st.count("momentum_buffer")) {
        st["momentum_buffer"] = zeros_like(p);
        first = true;
      }
      check_state(p, st);
      buffers[i] = in_layout(st.at("momentum_buffer"), pending.raws[i].param);
    }
    keys.emplace_back(p.device(), p.dtype(), first);
  }
  for (const std::vector<size_t>& bucket : buckets_by(keys)) {
    std::vector<Tensor> params, grads, momentum_buffers;
    for (size_t i : bucket) {
      params.push_back(pending.raws[i].param);
      grads.push_back(pending.raws[i].grad);
      if (options.momentum != 0) momentum_buffers.push_back(buffers[i]);
    }
    SgdStepOptions launch = options;
    launch.first_step = std::get<2>(keys[bucket.front()]);
    foreach_sgd_step(params, grads, momentum_buffers, launch);
  }
  finish_all(pending);
}

// ------------------------------------------------------------------ Adam / AdamW
Options AdamOptions::to_map() const {
  return {{"lr", lr}, {"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0}};
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options) : Adam("Adam", std::move(groups), options, false) {}

Adam::Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled)
    : Optimizer(std::move(name), std::move(groups), options.to_map()),
      decoupled_(decoupled),
      multi_tensor_{.foreach = options.foreach, .fused = options.fused} {
  for (const ParamGroup& g : groups_) check_options(g.options);
  multi_tensor_.check(name_, groups_);
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions options) : Adam("AdamW", std::move(groups), options, true) {}

std::vector<std::string> Adam::required_state(const Options& group) const {
  std::vector<std::string> out{"step", "exp_avg", "exp_avg_sq"};
  if (group.at("amsgrad") != 0) out.push_back("max_exp_avg_sq");
  return out;
}

void Adam::check_options(const Options& o) const {
  if (!(o.at("lr") >= 0) || !std::isfinite(o.at("lr"))) {
    fail("{}: invalid learning rate {} (must be finite and >= 0)", name_, o.at("lr"));
  }
  if (!(o.at("eps") >= 0) || !std::isfinite(o.at("eps"))) {
    fail("{}: invalid epsilon {} (must be finite and >= 0)", name_, o.at("eps"));
  }
  for (const char* b : {"beta1", "beta2"}) {
    if (!(o.at(b) >= 0 && o.at(b) < 1)) fail("{}: invalid {} {} (must be in [0, 1))", name_, b, o.at(b));
  }
  if (!(o.at("weight_decay") >= 0) || !std::isfinite(o.at("weight_decay"))) {
    fail("{}: invalid weight_decay {} (must be finite and >= 0)", name_, o.at("weight_decay"));
  }
}

void Adam::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.options["lr"], b1 = group.options["beta1"], b2 = group.options["beta2"],
                 eps = group.options["eps"], wd = group.options["weight_decay"];
    const bool amsgrad = group.options["amsgrad"] != 0;
    if (uses_multi_tensor(group)) {
      step_multi_tensor(group);
      continue;
    }
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      auto& st = state_of(p);
      init_adam_state(st, p, amsgrad);
      check_state(p, st);
      Raw raw = raw_operands(name_, p);
      double* step = st["step"].data_ptr<double>();
      *step += 1;
      const AdamBiasCorrection bc = adam_bias_correction(lr, b1, b2, *step);
      const bool use_max = amsgrad;
      kernels::adam_step(raw.param, raw.grad, in_layout(st.at("exp_avg"), raw.param),
                         in_layout(st.at("exp_avg_sq"), raw.param),
                         use_max ? in_layout(st.at("max_exp_avg_sq"), raw.param) : Tensor(), lr, b1, b2, eps, wd,
                         bc.step_size,
                         bc.bias_correction2_sqrt, decoupled_);
      finish(p, raw);
    }
  }
}

// The foreach / fused path. Each parameter keeps its own step count (PyTorch's per-parameter
// `step`): parameters that got gradients on different steps, or whose state was loaded from a
// checkpoint, have different bias corrections, so the launches are per (device, dtype, step,
// amsgrad buffer); in a steady state that is one launch per device and dtype.
void Adam::step_multi_tensor(ParamGroup& group) {
  const AdamStepOptions options{.lr = group.options["lr"],
                                .beta1 = group.options["beta1"],
                                .beta2 = group.options["beta2"],
                                .eps = group.options["eps"],
                                .weight_decay = group.options["weight_decay"],
                                .decoupled = decoupled_};
  const bool amsgrad = group.options["amsgrad"] != 0;
  WithGrad pending = with_grad(name_, group);
  const size_t n = pending.params.size();
  std::vector<std::map<std::string, Tensor>*> states;
  std::vector<std::tuple<Device, DType, double, bool>> keys;
  // Every state checked before any step count moves, so a refused step leaves all of them as they were.
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = *pending.params[i];
    auto& st = state_of(p);
    init_adam_state(st, p, amsgrad);
    check_state(p, st);
    states.push_back(&st);
  }
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = *pending.params[i];
    double* step = states[i]->at("step").data_ptr<double>();
    *step += 1;
    keys.emplace_back(p.device(), p.dtype(), *step, amsgrad);
  }
  for (const std::vector<size_t>& bucket : buckets_by(keys)) {
    const bool use_max = std::get<3>(keys[bucket.front()]);
    std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
    for (size_t i : bucket) {
      params.push_back(pending.raws[i].param);
      grads.push_back(pending.raws[i].grad);
      const Tensor& raw_param = pending.raws[i].param;
      exp_avgs.push_back(in_layout(states[i]->at("exp_avg"), raw_param));
      exp_avg_sqs.push_back(in_layout(states[i]->at("exp_avg_sq"), raw_param));
      if (use_max) max_exp_avg_sqs.push_back(in_layout(states[i]->at("max_exp_avg_sq"), raw_param));
    }
    AdamStepOptions launch = options;
    launch.step = std::get<2>(keys[bucket.front()]);
    foreach_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, launch);
  }
  finish_all(pending);
}

}  // namespace chorus::optim
