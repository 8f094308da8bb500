#include "autograd/engine.h"

#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "kernels/layout_conversions.h"
#include "tensor/caching_allocator.h"
#include "tensor/fault.h"
#include "tensor/ops.h"

namespace chorus::autograd {

bool sole_owner_of_memory(const Tensor& t);  // node.cpp: [Sole owner of a gradient]

namespace {

struct GraphTask {
  std::vector<std::function<void()>> callbacks;
};
thread_local GraphTask* g_current_task = nullptr;

// The gradients summed so far for one node's outputs, and for each the stream it was made (summed)
// on: none on the CPU ([Backward runs on the forward's streams]).
struct InputBuffer {
  TensorList grads;
  std::vector<std::optional<Stream>> made_on;
};
using InputBuffers = std::unordered_map<Node*, InputBuffer>;

// [Gradient into the pending sum] The node whose backward is running, and the input buffers of the
// backward pass running it (for pending_gradient below).
struct Running {
  Node* node = nullptr;
  InputBuffers* buffers = nullptr;
};
thread_local Running g_running;

struct RunningScope {
  RunningScope(Node* node, InputBuffers* buffers) : previous(g_running) {
    g_running = {node, buffers};
  }
  ~RunningScope() { g_running = previous; }
  Running previous;
};

// Sums a gradient that was broadcast in the forward back to the shape it must have.
Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.sizes() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < g.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && g.size(d) != 1)) dims.push_back(d);
  }
  Tensor r = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  if (lead > 0 || r.sizes() != shape) r = r.reshape(shape);
  return r;
}

// Makes the gradient for output `nr` of `fn` match its recorded shape, dtype and device.
Tensor conform(const Tensor& g, const Node& fn, uint32_t nr) {
  const Node::OutputMeta& meta = const_cast<Node&>(fn).output_meta()[nr];
  Tensor r = g;
  if (r.sizes() != meta.shape) {
    if (!is_expandable_to(meta.shape, r.sizes())) {
      fail("autograd: {} received a gradient of shape {} for an output of shape {}", fn.name(),
           shape_str(r.sizes()), shape_str(meta.shape));
    }
    r = sum_to_shape(r, meta.shape);
  }
  if (r.dtype() != meta.dtype) r = r.to(meta.dtype);
  if (r.device() != meta.device) r = r.to(meta.device);
  return r;
}

struct ReadyOrder {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    // priority_queue pops the largest: AccumulateGrad first, then the highest sequence number.
    if (a->is_accumulate_grad() != b->is_accumulate_grad()) return b->is_accumulate_grad();
    return a->sequence_nr() < b->sequence_nr();
  }
};

// Whether a summed gradient `slot` may take the next one (of `shape`, `dtype`, `device`) in place:
// nothing else holds its memory (no other handle, no view of its storage), it is contiguous, and
// it matches. The engine's input buffer (add_to_buffer) and pending_gradient below share the rule.
bool adds_in_place(const Tensor& slot, const Shape& shape, DType dtype, Device device) {
  return sole_owner_of_memory(slot) && slot.is_contiguous() && slot.sizes() == shape && slot.dtype() == dtype &&
         slot.device() == device;
}

// [Backward runs on the forward's streams] As PyTorch's engine: each node's backward runs on the
// stream its forward ran on (Node::stream), so work the forward spread over streams keeps that
// parallelism, and its kernels read the activations in the order that wrote them. A gradient made
// on one stream and used on another is ordered by an event: where it is summed into a node's input
// buffer, the sum runs on the consumer's stream (if on the gradient's device; else on the stream
// that made it) after the streams that made both terms; the gradients' memory is recorded on the
// stream that uses it, for the caching allocator. The seeds are made on the caller's current
// streams, so the first nodes wait for those; when the pass ends, the caller's current stream of
// each device waits for every stream a node ran on, before the callbacks (DDP's finalize) run and
// before backward() returns: the .grad a caller then reads is ordered as any op's output. With
// every node on one stream (the common case) none of this queues anything. Removed
// (fault::Point::kAutogradStreams, engine_test): every backward op runs on the caller's current
// stream, unordered against a forward on another stream, as chorus did before 2026-12-04.
bool follows_forward_streams() { return !fault::removed(fault::Point::kAutogradStreams); }

// Later work on `consumer` waits for what `producer` has queued so far, and `t`'s memory stays
// out of reuse until `consumer` has passed this point.
void order_after(const Stream& consumer, const Stream& producer, const Tensor& t) {
  if (consumer == producer) return;
  Event made;
  made.record(producer);
  consumer.wait(made);
  // (Memory the allocator does not own, a from_blob seed, is the caller's to keep alive.)
  if (t.defined() && from_caching_allocator(t.storage())) record_stream(t.storage(), consumer);
}

}  // namespace

// [Gradient into the pending sum] While a node's backward runs, the gradient already summed for its
// input `input` (the engine's input buffer of the node that input leads to), when the backward may
// add to it in place: defined, held by nothing else, contiguous, and of the shape, dtype and device
// given, which are those the edge's node expects. The backward that adds to it returns an undefined
// gradient for that input. Used where a gradient is a few rows of a large one: the embedding's
// backward (nn/functional/basic.cpp) adds its rows into the tied weight's other gradient (BERT's
// and GPT's output projection) instead of making a zero table, adding the rows and summing two
// tables. nullptr when nothing is pending or outside a backward pass. Declared where it is used.
Tensor* pending_gradient(size_t input, const Shape& shape, DType dtype, Device device) {
  if (g_running.node == nullptr || g_running.buffers == nullptr) return nullptr;
  const std::vector<Edge>& edges = g_running.node->next_edges();
  if (input >= edges.size() || !edges[input].valid()) return nullptr;
  const Edge& e = edges[input];
  const Node::OutputMeta& meta = e.fn->output_meta()[e.input_nr];
  if (meta.shape != shape || meta.dtype != dtype || meta.device != device) return nullptr;
  auto it = g_running.buffers->find(e.fn.get());
  if (it == g_running.buffers->end() || e.input_nr >= it->second.grads.size()) return nullptr;
  Tensor& slot = it->second.grads[e.input_nr];
  if (!slot.defined() || !adds_in_place(slot, shape, dtype, device)) return nullptr;
  // Only a sum made on the stream the adding backward runs on ([Backward runs on the forward's
  // streams]): the add is not ordered against another.
  const auto& made = it->second.made_on;
  if (e.input_nr < made.size() && made[e.input_nr] && *made[e.input_nr] != current_stream(device)) return nullptr;
  return &slot;
}

Engine& Engine::get() {
  static Engine engine;
  return engine;
}

bool Engine::is_running() const { return g_current_task != nullptr; }

void Engine::queue_callback(std::function<void()> callback) {
  if (g_current_task == nullptr) {
    fail("Engine::queue_callback: no backward pass is running on this thread; call it from a hook "
         "that runs during backward()");
  }
  g_current_task->callbacks.push_back(std::move(callback));
}

TensorList Engine::execute(const std::vector<Edge>& roots, const TensorList& grad_roots, bool keep_graph,
                           const std::vector<Edge>& inputs) {
  // Gradients are computed in the dtype each forward op ran in, whatever autocast says now.
  autocast::DisableGuard no_autocast;
  // 1. Count, for each node reachable from the roots, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& e : roots) {
    if (e.valid() && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++dependencies[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  // 2. For autograd::grad: only nodes on a path to a captured input need to run, and no leaf
  //    accumulates.
  const bool capture_mode = !inputs.empty();
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> capture_at;  // node -> (input_nr, slot)
  std::unordered_set<Node*> needed;
  TensorList captured(inputs.size());
  if (capture_mode) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].valid()) capture_at[inputs[i].fn.get()].emplace_back(inputs[i].input_nr, i);
    }
    // A node is needed if a captured node is reachable from it: iterate to a fixed point in reverse
    // topological order by repeated passes (graphs here are small enough).
    for (auto& [n, v] : capture_at) needed.insert(n);
    bool changed = true;
    while (changed) {
      changed = false;
      for (Node* n : seen) {
        if (needed.count(n)) continue;
        for (const Edge& e : n->next_edges()) {
          if (e.valid() && needed.count(e.fn.get())) {
            needed.insert(n);
            changed = true;
            break;
          }
        }
      }
    }
  }

  // 3. Seed the input buffers of the roots and run nodes as they become ready. Gradients are
  // computed and summed without recording history (the in-place sums below included).
  NoGradGuard no_grad;
  InputBuffers buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, ReadyOrder> ready;
  const bool follow_streams = follows_forward_streams();
  std::vector<Stream> streams_run;  // the streams nodes ran on ([Backward runs on the forward's streams])
  auto add_to_buffer = [&](const Edge& e, Tensor g) {
    InputBuffer& buf = buffers[e.fn.get()];
    if (buf.grads.empty()) buf.grads.resize(e.fn->output_meta().size());
    Tensor& slot = buf.grads[e.input_nr];
    // Where the sum is made: the consumer's stream when it is on the gradient's device, else the
    // one that made the gradient (current: the producing node's, or the caller's for a seed).
    // (made_on is sized at the first device gradient: a CPU graph allocates none.)
    std::optional<StreamGuard> on_stream;
    if (follow_streams && g.device().type != DeviceType::CPU) {
      if (buf.made_on.empty()) buf.made_on.resize(buf.grads.size());
      std::optional<Stream>& made_on = buf.made_on[e.input_nr];
      const Stream made = current_stream(g.device());
      const std::optional<Stream>& consumer = e.fn->stream();
      const Stream sum_on = consumer && consumer->device() == g.device() ? *consumer : made;
      order_after(sum_on, made, g);
      if (slot.defined() && made_on) order_after(sum_on, *made_on, slot);
      if (sum_on != made) on_stream.emplace(sum_on);
      made_on = sum_on;
    }
    if (!slot.defined()) {
      slot = std::move(g);
    } else if (adds_in_place(slot, g.sizes(), g.dtype(), g.device())) {
      // A buffer nothing else holds (no other handle, no view of its storage) takes the next
      // gradient in place, as PyTorch's InputBuffer does: no new tensor per use of a shared input
      // (BERT's tied word embeddings: 31 MB a step). Same values as add(slot, g).
      slot.add_(g);
    } else {
      slot = add(slot, g);
    }
    owners.emplace(e.fn.get(), e.fn);
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    // A seed of another dtype is cast like any gradient along an edge: otherwise a leaf root's .grad
    // (or a retained one) would take the seed's dtype.
    if (roots[i].valid()) add_to_buffer(roots[i], conform(grad_roots[i], *roots[i].fn, roots[i].input_nr));
  }
  for (const Edge& e : roots) {
    if (e.valid() && dependencies[e.fn.get()] == 0) {
      dependencies[e.fn.get()] = -1;  // queued
      ready.push(e.fn);
    }
  }

  GraphTask task;
  GraphTask* previous_task = g_current_task;
  g_current_task = &task;
  try {
    while (!ready.empty()) {
      std::shared_ptr<Node> node = ready.top();
      ready.pop();
      InputBuffer buf = std::move(buffers[node.get()]);
      buffers.erase(node.get());
      TensorList grads = std::move(buf.grads);
      grads.resize(node->output_meta().size());
      // On the forward's stream, after the streams that made its gradients; kept current while its
      // gradients go into the next nodes' buffers (they were made on it).
      std::optional<StreamGuard> on_stream;
      if (follow_streams && node->stream()) {
        const Stream& s = *node->stream();
        for (size_t i = 0; i < grads.size() && i < buf.made_on.size(); ++i) {
          if (grads[i].defined() && buf.made_on[i] && buf.made_on[i]->device() == s.device()) {
            order_after(s, *buf.made_on[i], grads[i]);
          }
        }
        on_stream.emplace(s);
        if (std::find(streams_run.begin(), streams_run.end(), s) == streams_run.end()) streams_run.push_back(s);
      }
      for (size_t i = 0; i < grads.size(); ++i) {
        const auto& meta = node->output_meta()[i];
        if (!grads[i].defined()) grads[i] = zeros(meta.shape, {.dtype = meta.dtype, .device = meta.device});
      }
      // Tensor hooks of non-leaf outputs see (or replace) the summed gradient.
      for (auto& [nr, hooks] : node->tensor_hooks()) {
        auto copy = hooks;
        for (auto& [id, hook] : copy) {
          Tensor r = hook(grads[nr]);
          if (r.defined()) grads[nr] = conform(r, *node, nr);
        }
      }
      for (auto& [nr, retain] : node->retain_grad_hooks()) retain(grads[nr]);
      if (capture_mode) {
        auto it = capture_at.find(node.get());
        if (it != capture_at.end()) {
          // A leaf's hooks run inside AccumulateGrad::apply, which capture mode skips.
          if (node->is_accumulate_grad()) grads[0] = static_cast<AccumulateGrad&>(*node).run_tensor_hooks(grads[0]);
          for (auto [nr, slot] : it->second) captured[slot] = grads[nr];
        }
        if (!needed.count(node.get()) || node->is_accumulate_grad()) continue;
      }
      // Copies that change a gradient's memory format are counted under this node's name.
      layout_conversions::PhaseScope phase(node->name());
      TensorList input_grads;
      {
        RunningScope running(node.get(), &buffers);
        input_grads = node->apply(std::move(grads));
      }
      if (!keep_graph) node->release_saved();
      auto& edges = node->next_edges();
      for (size_t i = 0; i < edges.size(); ++i) {
        const Edge& e = edges[i];
        if (!e.valid()) continue;
        if (i < input_grads.size() && input_grads[i].defined()) {
          add_to_buffer(e, conform(input_grads[i], *e.fn, e.input_nr));
        }
        int& deps = dependencies[e.fn.get()];
        if (--deps == 0) {
          deps = -1;
          auto owner = owners.find(e.fn.get());
          ready.push(owner != owners.end() ? owner->second : e.fn);
        }
      }
    }
    // The caller's current streams after every stream a node ran on.
    for (const Stream& s : streams_run) order_after(current_stream(s.device()), s, Tensor());
    // Callbacks may queue further callbacks; run until none are left.
    static const std::string kCallbacks = "backward callbacks";  // DDP's finalize, e.g.
    layout_conversions::PhaseScope phase(kCallbacks);
    for (size_t i = 0; i < task.callbacks.size(); ++i) {
      auto cb = std::move(task.callbacks[i]);
      cb();
    }
  } catch (...) {
    g_current_task = previous_task;
    throw;
  }
  g_current_task = previous_task;
  return captured;
}

namespace {

void make_roots(const TensorList& tensors, const TensorList& grad_tensors, const char* what,
                std::vector<Edge>& roots, TensorList& grads) {
  if (!grad_tensors.empty() && grad_tensors.size() != tensors.size()) {
    fail("{}: got {} tensors but {} gradients; pass one gradient per tensor (or none)", what,
         tensors.size(), grad_tensors.size());
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined()) fail("{}: tensor {} is undefined", what, i);
    if (!t.requires_grad()) {
      fail("{}: element {} of tensors does not require grad and does not have a grad_fn (shape {}); "
           "did you forget requires_grad_() on a leaf, or compute it under NoGradGuard?",
           what, i, shape_str(t.sizes()));
    }
    Tensor g = grad_tensors.empty() ? Tensor() : grad_tensors[i];
    if (!g.defined()) {
      if (t.numel() != 1) {
        fail("{}: grad can be implicitly created only for scalar outputs; got a tensor of shape {} — "
             "pass a gradient of that shape", what, shape_str(t.sizes()));
      }
      g = ones_like(t);
    } else if (g.sizes() != t.sizes()) {
      fail("{}: gradient of shape {} does not match the tensor's shape {}", what, shape_str(g.sizes()),
           shape_str(t.sizes()));
    }
    roots.push_back(gradient_edge(t));
    grads.push_back(g);
  }
}

}  // namespace

void backward(const TensorList& tensors, const TensorList& grad_tensors, bool retain_graph) {
  std::vector<Edge> roots;
  TensorList grads;
  make_roots(tensors, grad_tensors, "backward", roots, grads);
  Engine::get().execute(roots, grads, retain_graph);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph, bool allow_unused) {
  std::vector<Edge> roots;
  TensorList grads;
  make_roots(outputs, grad_outputs, "autograd::grad", roots, grads);
  std::vector<Edge> input_edges;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad()) {
      fail("autograd::grad: input {} does not require grad", i);
    }
    input_edges.push_back(gradient_edge(inputs[i]));
  }
  TensorList result = Engine::get().execute(roots, grads, retain_graph, input_edges);
  for (size_t i = 0; i < result.size(); ++i) {
    if (!result[i].defined() && !allow_unused) {
      fail("autograd::grad: input {} (shape {}) was not used in the graph of the outputs; pass "
           "allow_unused=true if this is expected", i, shape_str(inputs[i].sizes()));
    }
  }
  return result;
}

}  // namespace chorus::autograd
