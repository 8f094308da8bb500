#include "optim/optimizer.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::optim {
namespace {

// Runs f(T* p, const T* g, n) over a parameter and its gradient as contiguous arrays, writing back
// when the parameter is not contiguous. float32 and float64 parameters.
template <typename F>
void with_raw(const std::string& opt, Tensor& p, const F& f) {
  if (p.dtype() != kFloat32 && p.dtype() != kFloat64) {
    fail("{}: parameters must be float32 or float64, got {}", opt, dtype_name(p.dtype()));
  }
  if (!p.device().is_cpu()) fail("{}: parameter on {}; only CPU parameters are supported here", opt, p.device().str());
  Tensor g = p.grad();
  if (g.sizes() != p.sizes()) {
    fail("{}: gradient of shape {} does not match its parameter's shape {}", opt, shape_str(g.sizes()),
         shape_str(p.sizes()));
  }
  Tensor gc = g.dtype() == p.dtype() ? g.contiguous() : g.to(p.dtype()).contiguous();
  Tensor pc = p.is_contiguous() ? p : p.contiguous();
  if (p.dtype() == kFloat32) f(pc.data_ptr<float>(), gc.data_ptr<float>(), pc.numel());
  else f(pc.data_ptr<double>(), gc.data_ptr<double>(), pc.numel());
  if (!pc.is_same(p)) {
    NoGradGuard no_grad;
    p.copy_(pc);
  }
  p.bump_version();  // an in-place update, as PyTorch's optimizers
}

template <typename T>
T* buf(std::map<std::string, Tensor>& st, const std::string& name) {
  return st.at(name).data_ptr<T>();
}

}  // namespace

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
        for (const auto& [name, t] : it->second) out.emplace_back("state." + std::to_string(index) + "." + name, t.clone());
      }
      ++index;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  std::vector<Tensor> flat;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) flat.push_back(p);
  std::vector<Options> options(groups_.size());
  std::map<int64_t, std::map<std::string, Tensor>> buffers;
  for (const auto& [name, t] : state) {
    if (name.rfind("param_groups.", 0) == 0) {
      const std::string rest = name.substr(13);
      const size_t dot = rest.find('.');
      const size_t gi = dot == std::string::npos ? groups_.size() : std::stoul(rest.substr(0, dot));
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
      const int64_t index = std::stoll(rest.substr(0, dot));
      if (index < 0 || index >= static_cast<int64_t>(flat.size())) {
        fail("{}.load_state_dict: '{}' refers to parameter {}, but this optimizer has {} parameters", name_, name,
             index, flat.size());
      }
      const std::string buffer = rest.substr(dot + 1);
      if (buffer != "step" && t.sizes() != flat[index].sizes()) {
        fail("{}.load_state_dict: '{}' has shape {}, but parameter {} has shape {}", name_, name, shape_str(t.sizes()),
             index, shape_str(flat[index].sizes()));
      }
      buffers[index][buffer] = buffer == "step" ? t.to(kFloat64).clone() : t.to(flat[index].dtype()).clone();
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
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = options[gi];
  state_.clear();
  for (auto& [index, bufs] : buffers) state_[flat[index].unsafe_impl()] = std::move(bufs);
}

// ------------------------------------------------------------------ SGD
Options SGDOptions::to_map() const {
  return {{"lr", lr}, {"momentum", momentum}, {"dampening", dampening}, {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0}};
}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options) : Optimizer("SGD", std::move(groups), options.to_map()) {
  for (const ParamGroup& g : groups_) check_options(g.options);
}

void SGD::check_options(const Options& o) const {
  if (o.at("lr") < 0) fail("SGD: invalid learning rate {} (must be >= 0)", o.at("lr"));
  if (o.at("momentum") < 0) fail("SGD: invalid momentum {} (must be >= 0)", o.at("momentum"));
  if (o.at("weight_decay") < 0) fail("SGD: invalid weight_decay {} (must be >= 0)", o.at("weight_decay"));
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
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      std::map<std::string, Tensor>* st = nullptr;
      bool first = false;
      if (mom != 0) {
        st = &state_of(p);
        if (!st->count("momentum_buffer")) {
          (*st)["momentum_buffer"] = zeros(p.sizes(), TensorOptions{.dtype = p.dtype()});
          first = true;
        }
      }
      with_raw("SGD", p, [&]<typename T>(T* w, const T* g, int64_t n) {
        T* v = st ? buf<T>(*st, "momentum_buffer") : nullptr;
        const T tlr = static_cast<T>(lr), twd = static_cast<T>(wd), tm = static_cast<T>(mom),
                keep = static_cast<T>(1 - damp);
        for (int64_t i = 0; i < n; ++i) {
          T d = g[i] + twd * w[i];
          if (v) {
            v[i] = first ? d : tm * v[i] + keep * d;
            d = nesterov ? d + tm * v[i] : v[i];
          }
          w[i] -= tlr * d;
        }
      });
    }
  }
}

// ------------------------------------------------------------------ Adam / AdamW
Options AdamOptions::to_map() const {
  return {{"lr", lr}, {"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0}};
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options) : Adam("Adam", std::move(groups), options, false) {}

Adam::Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled)
    : Optimizer(std::move(name), std::move(groups), options.to_map()), decoupled_(decoupled) {
  for (const ParamGroup& g : groups_) check_options(g.options);
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions options) : Adam("AdamW", std::move(groups), options, true) {}

void Adam::check_options(const Options& o) const {
  if (o.at("lr") < 0) fail("{}: invalid learning rate {} (must be >= 0)", name_, o.at("lr"));
  if (o.at("eps") < 0) fail("{}: invalid epsilon {} (must be >= 0)", name_, o.at("eps"));
  for (const char* b : {"beta1", "beta2"}) {
    if (o.at(b) < 0 || o.at(b) >= 1) fail("{}: invalid {} {} (must be in [0, 1))", name_, b, o.at(b));
  }
  if (o.at("weight_decay") < 0) fail("{}: invalid weight_decay {} (must be >= 0)", name_, o.at("weight_decay"));
}

void Adam::step() {
  NoGradGuard no_grad;
  for (ParamGroup& group : groups_) {
    const double lr = group.options["lr"], b1 = group.options["beta1"], b2 = group.options["beta2"],
                 eps = group.options["eps"], wd = group.options["weight_decay"];
    const bool amsgrad = group.options["amsgrad"] != 0;
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      auto& st = state_of(p);
      if (!st.count("exp_avg")) {
        st["step"] = zeros({}, TensorOptions{.dtype = kFloat64});
        st["exp_avg"] = zeros(p.sizes(), TensorOptions{.dtype = p.dtype()});
        st["exp_avg_sq"] = zeros(p.sizes(), TensorOptions{.dtype = p.dtype()});
        if (amsgrad) st["max_exp_avg_sq"] = zeros(p.sizes(), TensorOptions{.dtype = p.dtype()});
      }
      double* step = st["step"].data_ptr<double>();
      *step += 1;
      const double bc1 = 1 - std::pow(b1, *step), bc2 = 1 - std::pow(b2, *step);
      const double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
      const bool use_max = amsgrad && st.count("max_exp_avg_sq");
      with_raw(name_, p, [&]<typename T>(T* w, const T* g, int64_t n) {
        T* m = buf<T>(st, "exp_avg");
        T* v = buf<T>(st, "exp_avg_sq");
        T* vmax = use_max ? buf<T>(st, "max_exp_avg_sq") : nullptr;
        const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2), teps = static_cast<T>(eps),
                tstep = static_cast<T>(step_size), tbc2 = static_cast<T>(bc2_sqrt), twd = static_cast<T>(wd),
                decay = static_cast<T>(1 - lr * wd);
        for (int64_t i = 0; i < n; ++i) {
          T gi = g[i];
          if (decoupled_) w[i] *= decay;
          else gi += twd * w[i];
          m[i] = tb1 * m[i] + (T(1) - tb1) * gi;
          v[i] = tb2 * v[i] + (T(1) - tb2) * gi * gi;
          T denom_v = v[i];
          if (vmax) {
            vmax[i] = std::max(vmax[i], v[i]);
            denom_v = vmax[i];
          }
          w[i] -= tstep * m[i] / (std::sqrt(denom_v) / tbc2 + teps);
        }
      });
    }
  }
}

}  // namespace chorus::optim
