// The backward engine: walks the graph from the roots in dependency order on the calling thread.
// A node runs once all gradients flowing into it have arrived (dependency counting); among ready
// nodes, AccumulateGrad runs first (so gradient-ready hooks fire as early as possible, which is
// what lets data parallelism overlap communication with the rest of backward), then the most
// recently created node (reverse order of the forward).
#pragma once

#include <functional>

#include "autograd/node.h"

namespace chorus::autograd {

class Engine {
 public:
  static Engine& get();

  // Runs backward from `roots` seeded with `grad_roots`. With `inputs` given, gradients are captured
  // for those edges and returned instead of being accumulated into leaves (autograd::grad).
  TensorList execute(const std::vector<Edge>& roots, const TensorList& grad_roots, bool keep_graph,
                     const std::vector<Edge>& inputs = {});

  // Runs `callback` once after the current backward pass finishes (all nodes, all hooks). Only
  // valid while a backward is running (from a hook); throws chorus::Error otherwise.
  void queue_callback(std::function<void()> callback);
  bool is_running() const;
};

// backward(tensors, grad_tensors): accumulates into the leaves' .grad.
void backward(const TensorList& tensors, const TensorList& grad_tensors = {}, bool retain_graph = false);
// Gradients of outputs with respect to inputs, without touching .grad. allow_unused=false raises
// when an input is not reachable; with true, its gradient is undefined.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false, bool allow_unused = false);

}  // namespace chorus::autograd
