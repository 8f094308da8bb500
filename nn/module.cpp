#include "nn/module.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::nn {

Tensor Module::forward(const Tensor&) {
  fail("{}: this module has no single-input forward(); call its own forward overload", type_name_);
}

void Module::check_new_name(const std::string& name, const char* what) const {
  if (name.empty() || name.find('.') != std::string::npos) {
    fail("{}::register_{}: name '{}' must be non-empty and contain no '.'", type_name_, what, name);
  }
  auto taken = [&](const auto& list) {
    for (const auto& [n, v] : list) if (n == name) return true;
    return false;
  };
  if (taken(parameters_) || taken(buffers_) || taken(children_)) {
    fail("{}::register_{}: an attribute named '{}' is already registered", type_name_, what, name);
  }
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  if (!tensor.defined()) fail("{}::register_parameter: '{}' is an undefined tensor", type_name_, name);
  if (!tensor.is_leaf()) tensor = tensor.detach();
  if (requires_grad) tensor.requires_grad_(true);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "buffer");
  if (!tensor.defined()) fail("{}::register_buffer: '{}' is an undefined tensor", type_name_, name);
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "module");
  if (!module) fail("{}::register_module: '{}' is null", type_name_, name);
  children_.emplace_back(name, std::move(module));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  for (auto& [n, m] : children_) {
    if (n == name) {
      m = std::move(module);
      return;
    }
  }
  fail("{}::replace_module: no submodule named '{}'", type_name_, name);
}

void Module::unregister_module(const std::string& name) {
  auto it = std::find_if(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  if (it == children_.end()) fail("{}::unregister_module: no submodule named '{}'", type_name_, name);
  children_.erase(it);
}

void Module::collect(const std::string& prefix, bool params, bool recurse, NamedTensors& out) const {
  for (const auto& [n, t] : params ? parameters_ : buffers_) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, true, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", true, recurse, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", false, recurse, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [n, m] : children_) out.push_back(m);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  // The entry for this module is a shared_ptr to it, so it must be owned by one (shared_from_this
  // would throw a bare std::bad_weak_ptr otherwise).
  std::shared_ptr<Module> self = weak_from_this().lock();
  if (!self) {
    fail("{}::named_modules: the module must be owned by a std::shared_ptr (create it with std::make_shared)",
         type_name_);
  }
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out{{"", self}};
  for (const auto& [n, m] : children_) {
    for (auto& [sub, mod] : m->named_modules()) out.emplace_back(sub.empty() ? n : n + "." + sub, mod);
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::to(Device device, std::optional<DType> dtype) { convert(device, dtype); }

// As PyTorch's module.to(dtype): floating-point tensors change dtype and every tensor stays on its
// own device (a model split over devices stays split).
void Module::to(DType dtype) {
  if (!is_floating(dtype)) fail("{}::to: expected a floating-point dtype, got {}", type_name_, dtype_name(dtype));
  convert(std::nullopt, dtype);
}

void Module::convert(std::optional<Device> device, std::optional<DType> dtype) {
  NoGradGuard no_grad;
  auto convert_one = [&](const Tensor& t) {
    Tensor out = device ? t.to(*device) : t;
    if (dtype && is_floating(t.dtype())) out = out.to(*dtype);
    return out;
  };
  auto move = [&](const Tensor& t) {
    Tensor moved = convert_one(t);
    if (!moved.is_same(t)) t.set_data(moved);
    if (t.grad().defined()) const_cast<Tensor&>(t).mutable_grad() = convert_one(t.grad());
  };
  for (auto& [n, t] : parameters_) move(t);
  for (auto& [n, t] : buffers_) move(t);
  for (auto& [n, m] : children_) m->convert(device, dtype);
}

void Module::to(MemoryFormat format) {
  if (format == MemoryFormat::Preserve) {
    fail("{}::to: MemoryFormat::Preserve keeps every layout as it is; pass ChannelsLast or Contiguous", type_name_);
  }
  NoGradGuard no_grad;
  auto relayout = [&](const Tensor& t) {
    if (t.dim() != 4) return;
    Tensor moved = t.contiguous(format);
    if (!moved.is_same(t)) t.set_data(moved);
    if (t.grad().defined() && t.grad().dim() == 4) const_cast<Tensor&>(t).mutable_grad() = t.grad().contiguous(format);
  };
  for (auto& [n, t] : parameters_) relayout(t);
  for (auto& [n, t] : buffers_) relayout(t);
  for (auto& [n, m] : children_) m->to(format);
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad() = Tensor();
    } else {
      NoGradGuard no_grad;
      p.mutable_grad().zero_();
    }
  }
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [n, m] : children_) m->apply(fn);
  fn(*this);
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  // Parameters then buffers per module, in registration order, as PyTorch orders them.
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& prefix) {
    for (const auto& [n, t] : m.parameters_) out.emplace_back(prefix + n, t.detach());
    for (const auto& [n, t] : m.buffers_) out.emplace_back(prefix + n, t.detach());
    for (const auto& [n, c] : m.children_) walk(*c, prefix + n + ".");
  };
  walk(*this, "");
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  NamedTensors own = state_dict();
  std::map<std::string, Tensor> given;
  for (const auto& [n, t] : state) given[n] = t;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> used;
  for (const auto& [n, t] : own) {
    auto it = given.find(n);
    if (it == given.end()) {
      missing.push_back(n);
      continue;
    }
    used.insert(n);
    if (it->second.sizes() != t.sizes()) {
      mismatched.push_back(fmt::format("size mismatch for {}: checkpoint has shape {}, the model has {}", n, shape_str(it->second.sizes()),
                                       shape_str(t.sizes())));
    } else if (it->second.is_floating_point() != t.is_floating_point()) {
      // float64 -> float32 is a cast PyTorch makes too; integer weights for a float parameter (or
      // the other way round) are a different tensor, not a precision change.
      mismatched.push_back(fmt::format("dtype mismatch for {}: checkpoint has dtype {}, the model has {}", n,
                                       dtype_name(it->second.dtype()), dtype_name(t.dtype())));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [n, t] : state) if (!used.count(n)) unexpected.push_back(n);
  if (strict && (!missing.empty() || !unexpected.empty() || !mismatched.empty())) {
    std::string msg = fmt::format("{}::load_state_dict: error(s) in loading the state dict:", type_name_);
    if (!missing.empty()) msg += fmt::format("\n  missing keys: {}", fmt::join(missing, ", "));
    if (!unexpected.empty()) msg += fmt::format("\n  unexpected keys: {}", fmt::join(unexpected, ", "));
    for (const auto& m : mismatched) msg += "\n  " + m;
    throw Error(msg);
  }
  NoGradGuard no_grad;
  for (auto& [n, t] : own) {
    auto it = given.find(n);
    if (it == given.end() || it->second.sizes() != t.sizes()) continue;
    if (it->second.is_floating_point() != t.is_floating_point()) continue;
    t.copy_(it->second);
  }
}

std::string Module::str_indented(int indent) const {
  std::ostringstream os;
  os << type_name_ << "(" << extra_repr();
  if (!children_.empty()) {
    os << "\n";
    for (const auto& [n, m] : children_) {
      os << std::string(indent + 2, ' ') << "(" << n << "): " << m->str_indented(indent + 2) << "\n";
    }
    os << std::string(indent, ' ');
  }
  os << ")";
  return os.str();
}

std::string Module::str() const { return str_indented(0); }

}  // namespace chorus::nn
