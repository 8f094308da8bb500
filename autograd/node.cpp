#include "autograd/node.h"

#include <atomic>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::autograd {
namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
thread_local bool g_grad_enabled = true;
}  // namespace

bool GradMode::is_enabled() { return g_grad_enabled; }
void GradMode::set_enabled(bool enabled) { g_grad_enabled = enabled; }

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    data_ = alias_without_history(t);
    saved_version_ = t.version();
  }
}

Tensor SavedTensor::unpack(const char* op) const {
  if (data_.defined() && data_.version() != saved_version_) {
    fail("autograd: one of the variables needed for gradient computation has been modified by an "
         "inplace operation: a tensor of shape {} saved by {} is at version {}; expected version {} "
         "instead. Use an out-of-place op, or clone() the tensor before modifying it.",
         shape_str(data_.sizes()), op, data_.version(), saved_version_);
  }
  return data_;
}

Node::Node(std::string name)
    : name_(std::move(name)), sequence_nr_(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

Node::~Node() {
  // Left to the default, the last reference to a long chain destroys it recursively (each node's
  // edges release the next node) and a graph of ~100k ops (a loss summed over many steps without
  // detach) overflows the stack. Instead, take over the edges of every node this one owns last,
  // so each is destroyed with no edges left.
  std::vector<std::shared_ptr<Node>> owned;
  for (Edge& e : next_edges_) {
    if (e.fn) owned.push_back(std::move(e.fn));
  }
  while (!owned.empty()) {
    std::shared_ptr<Node> n = std::move(owned.back());
    owned.pop_back();
    if (n.use_count() == 1) {
      for (Edge& e : n->next_edges_) {
        if (e.fn) owned.push_back(std::move(e.fn));
      }
    }
  }
}

int Node::add_tensor_hook(uint32_t output_nr, TensorHook hook) {
  int id = next_hook_id_++;
  tensor_hooks_[output_nr].emplace_back(id, std::move(hook));
  return id;
}

void Node::remove_tensor_hook(uint32_t output_nr, int id) {
  auto it = tensor_hooks_.find(output_nr);
  if (it == tensor_hooks_.end()) return;
  auto& v = it->second;
  std::erase_if(v, [id](const auto& p) { return p.first == id; });
}

TensorList FunctionNode::apply(TensorList&& grad_outputs) {
  if (!backward_) {
    fail("autograd: trying to backward through the graph a second time (or directly access saved "
         "tensors after they have already been freed) at {}. Saved intermediate values of the graph "
         "are freed when you call backward(); pass retain_graph=true to backward the first time if "
         "you need to backward through the graph again.",
         name());
  }
  return backward_(grad_outputs);
}

AccumulateGrad::AccumulateGrad(const Tensor& leaf) : Node("AccumulateGrad"), leaf_(leaf.impl_ptr()) {
  add_output(leaf);
}

Tensor AccumulateGrad::leaf() const {
  auto impl = leaf_.lock();
  return impl ? Tensor(impl) : Tensor();
}

Tensor AccumulateGrad::run_tensor_hooks(Tensor g) const {
  Tensor leaf_tensor = leaf();
  if (!leaf_tensor.defined()) return g;
  // Copy the hook list: a hook may remove itself.
  auto hooks = leaf_tensor.unsafe_impl()->ensure_autograd_meta().hooks;
  for (auto& [id, hook] : hooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = replaced;
  }
  return g;
}

// [Sole owner of a gradient] Whether t is the only tensor through which its memory can be read or
// written: no other handle to t, and no other tensor over its storage but, for a view, the root it
// views when t alone holds that root and covers its storage whole. A gradient computed in a
// parameter's layout is often such a view (linear's weight: t(mm(t(g), x)), then the t() backward),
// and without the second case each one was copied into .grad every step (51 parameters of BERT-mini),
// where PyTorch's AccumulateGrad keeps the tensor it is given. The engine's in-place sums of a
// shared input's gradients (engine.cpp) ask the same question.
bool sole_owner_of_memory(const Tensor& t) {
  if (t.impl_ptr().use_count() != 1) return false;
  const long owners = t.storage().use_count();
  if (owners == 1) return true;
  const AutogradMeta* meta = t.unsafe_impl()->autograd_meta();
  if (owners != 2 || meta == nullptr || !meta->is_view()) return false;
  return meta->view_base.impl_ptr().use_count() == 1 && t.storage_offset() == 0 &&
         static_cast<size_t>(t.numel()) * t.element_size() == t.storage()->nbytes();
}

TensorList AccumulateGrad::apply(TensorList&& grad_outputs) {
  Tensor leaf_tensor = leaf();
  if (!leaf_tensor.defined()) return {};
  AutogradMeta& meta = leaf_tensor.unsafe_impl()->ensure_autograd_meta();
  const Tensor& incoming = grad_outputs[0];
  if (incoming.defined() && (incoming.dtype() != leaf_tensor.dtype() || incoming.device() != leaf_tensor.device())) {
    // A graph built before the leaf's data was replaced by another dtype or device (Module::to,
    // set_data) reaches the leaf with gradients of the old kind.
    fail("autograd: a gradient of {} on {} reached a leaf that now holds {} on {} (of shape {}): the graph was built "
         "before the leaf's data was replaced (Module::to or set_data); run the forward again after moving the model",
         dtype_name(incoming.dtype()), incoming.device().str(), dtype_name(leaf_tensor.dtype()),
         leaf_tensor.device().str(), shape_str(leaf_tensor.sizes()));
  }
  Tensor g = run_tensor_hooks(std::move(grad_outputs[0]));
  if (!meta.grad.defined()) {
    // Steal the incoming buffer when nothing else refers to it; otherwise keep our own copy so a
    // later in-place accumulation cannot write into someone else's tensor. Either way .grad is dense
    // in the leaf's layout (PyTorch's gradient layout contract): a channels-last parameter gets a
    // channels-last gradient, whatever layout the op that produced it chose.
    // What is kept is a plain tensor over the same memory (a view's root is freed with the view).
    const MemoryFormat format = leaf_tensor.suggest_memory_format();
    const bool keep = sole_owner_of_memory(g) && g.is_contiguous(format);
    meta.grad = keep ? alias_without_history(g) : g.clone(format);
  } else {
    meta.grad.add_(g);
  }
  auto post_hooks = meta.post_accumulate_hooks;
  for (auto& [id, hook] : post_hooks) hook(leaf_tensor);
  return {};
}

bool any_requires_grad(std::initializer_list<const Tensor*> tensors) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : tensors) {
    if (t != nullptr && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

bool any_requires_grad(const TensorList& tensors) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : tensors) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.unsafe_impl()->ensure_autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

std::shared_ptr<Node> record(const char* name, const TensorList& inputs, const TensorList& outputs,
                             BackwardFn backward) {
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->next_edges().reserve(inputs.size());
  for (const Tensor& in : inputs) node->next_edges().push_back(gradient_edge(in));
  for (const Tensor& out : outputs) {
    AutogradMeta& meta = out.unsafe_impl()->ensure_autograd_meta();
    meta.grad_fn = node;
    meta.output_nr = node->add_output(out);
    meta.requires_grad = false;  // a non-leaf requires grad through its grad_fn
  }
  return node;
}

}  // namespace chorus::autograd
