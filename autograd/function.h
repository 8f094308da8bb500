// User-defined autograd functions, as torch::autograd::Function: a struct with a static forward
// (run without recording history) and a static backward, sharing an AutogradContext.
//
//   struct MyExp : autograd::Function<MyExp> {
//     static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x) {
//       Tensor y = exp(x);
//       ctx->save_for_backward({y});
//       return y;
//     }
//     static TensorList backward(autograd::AutogradContext* ctx, TensorList grad_outputs) {
//       return {mul(grad_outputs[0], ctx->get_saved_variables()[0])};
//     }
//   };
//   Tensor y = MyExp::apply(x);   // y.grad_fn() is MyExp's node
//
// forward takes any arguments: Tensors, TensorLists (flattened, each element an input) and other
// values (not inputs of the graph); it returns a Tensor or a TensorList. backward gets one gradient
// per output (zeros where an output got none) and returns one entry per forward argument, tensors of
// a TensorList counted one by one, an undefined Tensor for non-tensor arguments and for inputs that
// need no gradient; each must have its input's shape. Differences from PyTorch: no double backward
// through a custom function's backward unless it is written with differentiable ops (it runs with
// grad mode as the engine sets it), and set_materialize_grads(false) is not offered (undefined
// gradients are always given as zeros).
#pragma once

#include <any>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace chorus::autograd {

class AutogradContext {
 public:
  // Tensors backward needs; checked for in-place changes when unpacked (as every op's saved tensors).
  void save_for_backward(TensorList tensors);
  // The saved tensors; chorus::Error if one was modified in place after saving, or after the graph
  // was freed by a backward without retain_graph.
  TensorList get_saved_variables() const;
  // Whether input i (counted as backward's return values are) needs a gradient.
  bool needs_input_grad(size_t i) const;
  // Outputs that are not differentiable (indices, masks): they get no grad_fn and never a gradient.
  void mark_non_differentiable(const TensorList& outputs);
  // Inputs forward modified in place: their history becomes this function's node.
  void mark_dirty(const TensorList& inputs);
  // Anything else backward needs (sizes, flags, scalars), by name: ctx->saved_data["k"] = 2.0, then
  // std::any_cast<double>(ctx->saved_data.at("k")).
  std::map<std::string, std::any> saved_data;

  // ---- used by Function::apply ----
  void set_needs_input_grad(std::vector<bool> needs) { needs_input_grad_ = std::move(needs); }
  bool is_non_differentiable(const Tensor& t) const { return non_differentiable_.count(t.unsafe_impl()) > 0; }
  bool is_dirty(const Tensor& t) const { return dirty_.count(t.unsafe_impl()) > 0; }
  void release();

 private:
  std::vector<SavedTensor> saved_;
  bool released_ = false;
  std::vector<bool> needs_input_grad_;
  std::unordered_set<const TensorImpl*> non_differentiable_, dirty_;
};

namespace detail {

// One entry per forward argument as backward returns them: a tensor input (possibly undefined) or
// a non-tensor argument (no graph input, but it has its slot in backward's results).
struct InputSlot {
  bool is_tensor = false;
  Tensor tensor;
};

template <typename A>
void collect_input(std::vector<InputSlot>& slots, const A& arg) {
  using D = std::decay_t<A>;
  if constexpr (std::is_same_v<D, Tensor>) {
    slots.push_back({true, arg});
  } else if constexpr (std::is_same_v<D, TensorList>) {
    for (const Tensor& t : arg) slots.push_back({true, t});
  } else {
    slots.push_back({false, Tensor()});
  }
}

// The node a custom function records: edges to the tensor inputs, and what backward's results are
// checked against (which arguments are tensors, and their shapes; not the tensors themselves, which
// the node must not keep alive).
class CustomFunctionNode final : public Node {
 public:
  using Backward = std::function<TensorList(AutogradContext*, TensorList)>;
  CustomFunctionNode(std::string name, Backward backward, const std::vector<InputSlot>& slots);
  TensorList apply(TensorList&& grad_outputs) override;
  void release_saved() override { ctx.release(); }
  AutogradContext ctx;

 private:
  struct Expected {
    bool is_tensor = false;
    bool defined = false;
    Shape shape;
  };
  Backward backward_;
  std::vector<Expected> expected_;
};

// Demangled type name + "Backward" ("MyExpBackward").
std::string function_node_name(const std::type_info& type);

// After forward: wires `outputs` to `node` (or, without a node, only marks dirty/non-differentiable
// bookkeeping), returning the tensors the caller gets (an output that is an unmodified input comes
// back as an alias so the input's own history is untouched).
TensorList wrap_outputs(const std::shared_ptr<CustomFunctionNode>& node, AutogradContext& ctx,
                        const std::vector<InputSlot>& slots, const TensorList& outputs);

}  // namespace detail

template <typename T>
struct Function {
  template <typename... Args>
  static auto apply(Args&&... args) {
    std::vector<detail::InputSlot> slots;
    (detail::collect_input(slots, args), ...);
    std::vector<bool> needs;
    TensorList tensor_inputs;
    bool any = false;
    for (const detail::InputSlot& s : slots) {
      const bool n = s.is_tensor && s.tensor.defined() && GradMode::is_enabled() && s.tensor.requires_grad();
      needs.push_back(n);
      any = any || n;
    }
    std::shared_ptr<detail::CustomFunctionNode> node;
    AutogradContext local;
    if (any) {
      node = std::make_shared<detail::CustomFunctionNode>(
          detail::function_node_name(typeid(T)),
          [](AutogradContext* c, TensorList grads) { return T::backward(c, std::move(grads)); }, slots);
    }
    AutogradContext& ctx = node ? node->ctx : local;
    ctx.set_needs_input_grad(needs);
    using Out = decltype(T::forward(&ctx, std::forward<Args>(args)...));
    static_assert(std::is_same_v<Out, Tensor> || std::is_same_v<Out, TensorList>,
                  "autograd::Function: forward must return a Tensor or a TensorList");
    Out out;
    {
      NoGradGuard no_grad;
      out = T::forward(&ctx, std::forward<Args>(args)...);
    }
    if constexpr (std::is_same_v<Out, Tensor>) {
      return detail::wrap_outputs(node, ctx, slots, TensorList{out})[0];
    } else {
      return detail::wrap_outputs(node, ctx, slots, out);
    }
  }
};

// As torch::InferenceMode: a scope without autograd recording. In chorus it is NoGradGuard (PyTorch
// also skips version counting and marks inference tensors; chorus keeps both, so tensors made inside
// can be used in training afterwards without the errors PyTorch gives).
class InferenceMode {
 public:
  // enabled = false turns recording back on inside an inference scope (grad mode = !enabled, as PyTorch's).
  explicit InferenceMode(bool enabled = true) : previous_(GradMode::is_enabled()) { GradMode::set_enabled(!enabled); }
  ~InferenceMode() { GradMode::set_enabled(previous_); }
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;

 private:
  bool previous_;
};

}  // namespace chorus::autograd
