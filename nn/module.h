// nn::Module: the base of every layer and model. It owns ordered, named parameters, buffers and
// submodules (registration order, recursive, dotted names like "layer1.0.conv1.weight"), switches
// train/eval, moves to a device or dtype, and saves/loads state dicts with strict checking.
// Layers are held by std::shared_ptr: auto fc = register_module("fc", std::make_shared<Linear>(4, 2)).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::nn {

// An ordered list of (name, tensor): what state_dict() returns and load_state_dict() takes.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The single-input forward used by Sequential; layers with other signatures add overloads.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // ---- registration (returns the registered handle; keep it as a member) ----
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Replaces a registered submodule (same name), e.g. to swap a layer in a pretrained model.
  void replace_module(const std::string& name, std::shared_ptr<Module> module);
  // Removes a registered submodule (its parameters leave parameters() and state_dict()).
  void unregister_module(const std::string& name);

  // ---- traversal (registration order, depth first, this module first) ----
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // This module and all below it, with dotted names ("" for this one).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();

  // ---- modes and placement ----
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters and buffers; a dtype applies to floating-point tensors only (as in PyTorch).
  void to(Device device, std::optional<DType> dtype = std::nullopt);
  // Floating-point parameters and buffers (and their gradients) to `dtype`, each on its own device.
  void to(DType dtype);
  // Every 4-D parameter and buffer (convolution weights) in `format`, as PyTorch's
  // model.to(memory_format=torch.channels_last); other ranks are left as they are. With the input
  // channels-last too, convolutions, batch norm, pooling and the pointwise ops between them keep the
  // layout. Contiguous turns it back; Preserve is refused.
  void to(MemoryFormat format);
  // set_to_none (default, as PyTorch 2): .grad becomes undefined; otherwise it is zeroed in place.
  void zero_grad(bool set_to_none = true);
  // Calls fn on every module, children first then this one (as PyTorch's apply).
  void apply(const std::function<void(Module&)>& fn);

  // ---- state ----
  // Parameters and buffers by dotted name, detached, sharing storage with the module.
  NamedTensors state_dict() const;
  // Copies values in. strict: every missing key, unexpected key and shape mismatch is listed in one
  // chorus::Error. Non-strict: copies what matches by name and shape, and returns nothing else.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  const std::string& type_name() const { return type_name_; }
  // Short description of the module tree, like PyTorch's repr.
  std::string str() const;

 protected:
  // Extra text shown after the type name in str(), e.g. "in_features=4, out_features=2".
  virtual std::string extra_repr() const { return ""; }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  // to(Device, DType) and to(DType): a device moves every tensor, a dtype the floating-point ones.
  void convert(std::optional<Device> device, std::optional<DType> dtype);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool params, bool recurse, NamedTensors& out) const;
  std::string str_indented(int indent) const;

  std::string type_name_;
  bool training_ = true;
  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace chorus::nn
