// autograd::Function's context and node (see function.h).
#include "autograd/function.h"
#include "autograd/inplace.h"

#include <cxxabi.h>

#include <cstdlib>

#include "tensor/error.h"

namespace chorus::autograd {

void AutogradContext::save_for_backward(TensorList tensors) {
  saved_.clear();
  for (const Tensor& t : tensors) saved_.emplace_back(t);
}

TensorList AutogradContext::get_saved_variables() const {
  if (released_) {
    fail("autograd::Function: the saved tensors were freed by an earlier backward; call backward(..., "
         "retain_graph=true) the first time to go through the graph again");
  }
  TensorList out;
  for (const SavedTensor& s : saved_) out.push_back(s.unpack("autograd::Function"));
  return out;
}

bool AutogradContext::needs_input_grad(size_t i) const {
  if (i >= needs_input_grad_.size()) {
    fail("autograd::Function: needs_input_grad({}) but forward has {} arguments", i, needs_input_grad_.size());
  }
  return needs_input_grad_[i];
}

void AutogradContext::mark_non_differentiable(const TensorList& outputs) {
  for (const Tensor& t : outputs)
    if (t.defined()) non_differentiable_.insert(t.unsafe_impl());
}

void AutogradContext::mark_dirty(const TensorList& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined()) dirty_.insert(t.unsafe_impl());
}

void AutogradContext::release() {
  saved_.clear();
  saved_data.clear();
  released_ = true;
}

namespace detail {

std::string function_node_name(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : type.name();
  std::free(demangled);
  const size_t colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  return name + "Backward";
}

CustomFunctionNode::CustomFunctionNode(std::string name, Backward backward, const std::vector<InputSlot>& slots)
    : Node(std::move(name)), backward_(std::move(backward)) {
  for (const InputSlot& s : slots) {
    expected_.push_back({s.is_tensor, s.is_tensor && s.tensor.defined(), s.is_tensor && s.tensor.defined() ? s.tensor.sizes() : Shape{}});
    if (s.is_tensor) next_edges().push_back(s.tensor.defined() ? gradient_edge(s.tensor) : Edge{});
  }
}

TensorList CustomFunctionNode::apply(TensorList&& grad_outputs) {
  if (!backward_) fail("{}: the graph was freed by an earlier backward (use retain_graph to go through it again)", name());
  TensorList result = backward_(&ctx, std::move(grad_outputs));
  if (result.size() != expected_.size()) {
    fail("{}: backward returned {} gradients, expected {} (one per forward argument, each tensor of a TensorList "
         "counted, an undefined Tensor for a non-tensor argument)",
         name(), result.size(), expected_.size());
  }
  TensorList grads;
  for (size_t i = 0; i < expected_.size(); ++i) {
    const Expected& e = expected_[i];
    const Tensor& g = result[i];
    if (!e.is_tensor) {
      if (g.defined()) {
        fail("{}: backward returned a gradient for argument {}, which is not a tensor; expected an undefined Tensor "
             "there",
             name(), i);
      }
      continue;
    }
    if (g.defined() && e.defined && g.sizes() != e.shape) {
      fail("{}: backward returned a gradient of shape {} for argument {}, whose shape is {}", name(),
           shape_str(g.sizes()), i, shape_str(e.shape));
    }
    grads.push_back(g);
  }
  return grads;
}

TensorList wrap_outputs(const std::shared_ptr<CustomFunctionNode>& node, AutogradContext& ctx,
                        const std::vector<InputSlot>& slots, const TensorList& outputs) {
  auto is_input = [&slots](const Tensor& t) {
    for (const InputSlot& s : slots)
      if (s.is_tensor && s.tensor.defined() && s.tensor.unsafe_impl() == t.unsafe_impl()) return true;
    return false;
  };
  TensorList result;
  for (const Tensor& out : outputs) {
    if (!out.defined() || !node) {
      result.push_back(out);
      continue;
    }
    if (ctx.is_dirty(out) && !is_input(out)) {
      fail("{}: mark_dirty() was given a tensor that is not an input of forward", node->name());
    }
    if (ctx.is_non_differentiable(out)) {
      node->add_output(out);  // backward still gets a (zero) gradient in its place
      result.push_back(out);
      continue;
    }
    Tensor t = out;
    if (ctx.is_dirty(out)) {
      check_inplace(out, node->name().c_str(), true);  // a leaf that requires grad, or a view of one: refused
      const AutogradMeta* out_meta = out.unsafe_impl()->autograd_meta();
      if (out_meta != nullptr && out_meta->is_view()) {
        // Its base's history would have to be rebased as built-in ops do (autograd/inplace.h);
        // custom Functions do not do that.
        fail("{}: mark_dirty() was given a view (shape {}); a custom Function cannot modify a view in "
             "place. Modify its base, or clone() the view first.", node->name(), shape_str(out.sizes()));
      }
    } else if (is_input(out)) {
      t = alias_without_history(out);  // returned as is: the caller's input keeps its own history
    }
    AutogradMeta& meta = t.unsafe_impl()->ensure_autograd_meta();
    meta.grad_fn = node;
    meta.output_nr = node->add_output(t);
    meta.requires_grad = false;
    result.push_back(t);
  }
  return result;
}

}  // namespace detail
}  // namespace chorus::autograd
