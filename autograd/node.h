// The backward graph: a Node per recorded op, Edges to the nodes that produced its inputs, and
// SavedTensor for values the backward formula needs. Backward formulas are lambdas written next to
// their forward in autograd/ops/*.cpp and wrapped in a FunctionNode; leaves get an AccumulateGrad.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensor/runtime.h"
#include "tensor/tensor.h"

namespace chorus::autograd {

class Node;

// Input `input_nr` of node `fn`; an invalid edge (fn null) marks an input that needs no gradient.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// A tensor saved for backward. It holds the data without history (no reference cycles) and the
// storage version at save time; unpack() refuses if the tensor was modified in place since.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // `op` names the forward op in the error message.
  Tensor unpack(const char* op) const;

 private:
  Tensor data_;
  uint32_t saved_version_ = 0;
};

using TensorHook = std::function<Tensor(const Tensor&)>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name);
  // Unlinks the nodes it owns last iteratively, so dropping a deep graph cannot overflow the stack.
  virtual ~Node();

  // Gradients of the inputs (one per next edge; undefined where none) from the gradients of the
  // outputs (one per output, never undefined: the engine fills zeros).
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // Drops saved tensors after a backward without retain_graph.
  virtual void release_saved() {}
  virtual bool is_accumulate_grad() const { return false; }

  const std::string& name() const { return name_; }
  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge>& next_edges() { return next_edges_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }

  // Shape and dtype of each output, so the engine can check and adapt incoming gradients
  // (reduce a broadcast gradient to the shape, cast to the dtype) and make zeros for missing ones.
  struct OutputMeta {
    Shape shape;
    DType dtype;
    Device device;
  };
  std::vector<OutputMeta>& output_meta() { return output_meta_; }
  uint32_t add_output(const Tensor& t) {
    output_meta_.push_back({t.sizes(), t.dtype(), t.device()});
    if (!stream_ && t.device().type != DeviceType::CPU) stream_ = current_stream(t.device());
    return static_cast<uint32_t>(output_meta_.size() - 1);
  }
  // [Backward runs on the forward's streams] (engine.cpp) The stream the forward ran on: the
  // current stream of the first device output's device when the node recorded it (a leaf's
  // AccumulateGrad: when the forward first used the leaf). None when every output is on the CPU.
  const std::optional<Stream>& stream() const { return stream_; }

  // Hooks on non-leaf tensors, keyed by the output they belong to (run before apply).
  int add_tensor_hook(uint32_t output_nr, TensorHook hook);
  void remove_tensor_hook(uint32_t output_nr, int id);
  std::map<uint32_t, std::vector<std::pair<int, TensorHook>>>& tensor_hooks() { return tensor_hooks_; }
  // The retain_grad() hook of an output. Kept apart so the engine runs it after that output's
  // other hooks: .grad then holds the gradient they produced, whatever the registration order
  // (as in PyTorch).
  void set_retain_grad_hook(uint32_t output_nr, TensorHook hook) { retain_grad_hooks_[output_nr] = std::move(hook); }
  std::map<uint32_t, TensorHook>& retain_grad_hooks() { return retain_grad_hooks_; }

 private:
  std::string name_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> output_meta_;
  std::optional<Stream> stream_;
  std::map<uint32_t, std::vector<std::pair<int, TensorHook>>> tensor_hooks_;
  std::map<uint32_t, TensorHook> retain_grad_hooks_;
  int next_hook_id_ = 0;
};

using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

// A node whose backward is a lambda; release_saved() drops the lambda (and what it captured), so a
// second backward through a freed graph gets a clear error.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward) : Node(std::move(name)), backward_(std::move(backward)) {}
  TensorList apply(TensorList&& grad_outputs) override;
  void release_saved() override { backward_ = nullptr; }

 private:
  BackwardFn backward_;
};

// The sink of a leaf: adds the incoming gradient into leaf.grad, running the leaf's tensor hooks
// before and its post-accumulate-grad hooks after.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf);
  TensorList apply(TensorList&& grad_outputs) override;
  bool is_accumulate_grad() const override { return true; }
  // The leaf's tensor hooks applied to `grad` (what apply() accumulates). autograd::grad captures
  // a leaf's gradient without running apply(), and calls this so hooks act as on non-leaves.
  Tensor run_tensor_hooks(Tensor grad) const;
  // The leaf, or an undefined tensor if it no longer exists.
  Tensor leaf() const;

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// ---- helpers the op layer uses to record history ----

// True when grad mode is on and any of the tensors requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> tensors);
bool any_requires_grad(const TensorList& tensors);
// The edge a gradient for `t` flows into (grad_fn or the leaf's AccumulateGrad); invalid if none.
Edge gradient_edge(const Tensor& t);
// Records `backward` as the grad_fn of `outputs`, with edges to `inputs`.
std::shared_ptr<Node> record(const char* name, const TensorList& inputs, const TensorList& outputs,
                             BackwardFn backward);
}  // namespace chorus::autograd
