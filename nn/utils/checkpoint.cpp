#include "nn/utils/checkpoint.h"

#include <any>
#include <optional>
#include <unordered_set>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "tensor/error.h"
#include "tensor/generator.h"

namespace chorus::nn::utils {
namespace {

constexpr DeviceType kAutocastTypes[] = {DeviceType::CPU, DeviceType::CUDA, DeviceType::Sim};

struct AutocastState {
  bool enabled[3] = {false, false, false};
  DType dtype[3] = {kFloat32, kFloat32, kFloat32};
};

AutocastState autocast_state() {
  AutocastState s;
  for (int i = 0; i < 3; ++i) {
    s.enabled[i] = autocast::is_enabled(kAutocastTypes[i]);
    s.dtype[i] = autocast::get_dtype(kAutocastTypes[i]);
  }
  return s;
}

// Every leaf requiring grad that the recomputed graph reaches and that is neither a (detached)
// input nor a named parameter: its gradient would be lost, so it is an error.
void check_leaves(const TensorList& outputs, const std::unordered_set<const TensorImpl*>& known) {
  std::vector<std::shared_ptr<autograd::Node>> stack;
  std::unordered_set<const autograd::Node*> seen;
  for (const Tensor& o : outputs) {
    autograd::Edge e = autograd::gradient_edge(o);
    if (e.valid()) stack.push_back(e.fn);
  }
  int unknown = 0;
  std::string shapes;
  while (!stack.empty()) {
    std::shared_ptr<autograd::Node> node = stack.back();
    stack.pop_back();
    if (!seen.insert(node.get()).second) continue;
    if (node->is_accumulate_grad()) {
      const Tensor leaf = static_cast<const autograd::AccumulateGrad&>(*node).leaf();
      if (leaf.defined() && known.count(leaf.unsafe_impl()) == 0) {
        if (++unknown <= 3) shapes += (shapes.empty() ? "" : ", ") + shape_str(leaf.sizes());
      }
      continue;
    }
    for (const autograd::Edge& e : node->next_edges())
      if (e.valid()) stack.push_back(e.fn);
  }
  if (unknown > 0) {
    fail("nn::utils::checkpoint: the checkpointed function uses {} tensor(s) that require grad but are neither its "
         "inputs nor in `params` (shapes {}{}); their gradients would be lost. Pass them in params (a module's "
         "parameters())",
         unknown, shapes, unknown > 3 ? ", ..." : "");
  }
}

struct Checkpoint : autograd::Function<Checkpoint> {
  static TensorList forward(autograd::AutogradContext* ctx, const CheckpointFn& fn, const TensorList& inputs,
                            const TensorList& params) {
    const Generator& g = default_generator();
    ctx->saved_data["fn"] = fn;
    ctx->saved_data["seed"] = g.seed();
    ctx->saved_data["offset"] = g.offset();
    ctx->saved_data["autocast"] = autocast_state();
    ctx->saved_data["inputs"] = inputs.size();
    ctx->saved_data["params"] = params;
    ctx->save_for_backward(inputs);
    TensorList out = fn(inputs);
    if (out.empty()) fail("nn::utils::checkpoint: the function returned no tensors");
    // Integer outputs, and inputs passed along unchanged that need no gradient (labels, masks),
    // have no gradient.
    TensorList constant;
    for (const Tensor& o : out) {
      if (!o.defined()) continue;
      bool passed_constant = false;
      for (const Tensor& in : inputs)
        if (in.defined() && in.unsafe_impl() == o.unsafe_impl() && !in.requires_grad()) passed_constant = true;
      if (!is_floating(o.dtype()) || passed_constant) constant.push_back(o);
    }
    if (!constant.empty()) ctx->mark_non_differentiable(constant);
    return out;
  }

  static TensorList backward(autograd::AutogradContext* ctx, TensorList grads) {
    const auto fn = std::any_cast<CheckpointFn>(ctx->saved_data.at("fn"));
    const auto n_inputs = std::any_cast<size_t>(ctx->saved_data.at("inputs"));
    const auto params = std::any_cast<TensorList>(ctx->saved_data.at("params"));
    const auto amp = std::any_cast<AutocastState>(ctx->saved_data.at("autocast"));
    const TensorList saved = ctx->get_saved_variables();
    // The inputs again, as leaves of a graph of their own (argument 0 is fn).
    TensorList detached;
    std::unordered_set<const TensorImpl*> known;
    for (size_t i = 0; i < n_inputs; ++i) {
      Tensor d = saved[i].detach();
      if (ctx->needs_input_grad(1 + i)) d.requires_grad_(true);
      known.insert(d.unsafe_impl());
      detached.push_back(d);
    }
    for (const Tensor& p : params) known.insert(p.unsafe_impl());
    // Recompute with the generator and autocast as the forward had them.
    Generator& g = default_generator();
    const uint64_t seed = g.seed(), offset = g.offset();
    TensorList outs;
    {
      struct RestoreGenerator {
        Generator& g;
        uint64_t seed, offset;
        ~RestoreGenerator() { g.set_state(seed, offset); }
      } restore{g, seed, offset};
      g.set_state(std::any_cast<uint64_t>(ctx->saved_data.at("seed")), std::any_cast<uint64_t>(ctx->saved_data.at("offset")));
      std::optional<autocast::AutocastGuard> guards[3];
      for (int i = 0; i < 3; ++i) {
        if (amp.enabled[i]) guards[i].emplace(kAutocastTypes[i], amp.dtype[i], true);
        else if (autocast::is_enabled(kAutocastTypes[i])) guards[i].emplace(kAutocastTypes[i], std::nullopt, false);
      }
      autograd::EnableGradGuard grad_on;
      outs = fn(detached);
    }
    if (outs.size() != grads.size()) {
      fail("nn::utils::checkpoint: the function returned {} tensors when recomputed, {} in forward: it must be "
           "deterministic",
           outs.size(), grads.size());
    }
    // Gradients of the inputs and the parameters, captured (not accumulated) and handed back to the
    // outer backward, which accumulates them once, hooks included.
    TensorList roots, root_grads, wrt;
    for (size_t j = 0; j < outs.size(); ++j) {
      if (outs[j].requires_grad() && grads[j].defined()) {
        roots.push_back(outs[j]);
        root_grads.push_back(grads[j]);
      }
    }
    std::vector<size_t> wrt_slot;  // backward's result index for each entry of wrt
    for (size_t i = 0; i < n_inputs; ++i) {
      if (detached[i].requires_grad()) {
        wrt.push_back(detached[i]);
        wrt_slot.push_back(1 + i);
      }
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (ctx->needs_input_grad(1 + n_inputs + k)) {
        wrt.push_back(params[k]);
        wrt_slot.push_back(1 + n_inputs + k);
      }
    }
    TensorList result(1 + n_inputs + params.size());
    if (roots.empty() || wrt.empty()) return result;
    check_leaves(roots, known);
    const TensorList got = autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false, /*allow_unused=*/true);
    for (size_t w = 0; w < wrt.size(); ++w) result[wrt_slot[w]] = got[w];
    return result;
  }
};

}  // namespace

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, const TensorList& params) {
  if (!fn) fail("nn::utils::checkpoint: no function given");
  return Checkpoint::apply(fn, inputs, params);
}

Tensor checkpoint(const std::shared_ptr<Module>& module, const Tensor& input) {
  if (!module) fail("nn::utils::checkpoint: no module given");
  Module* m = module.get();
  return checkpoint([m](const TensorList& in) { return TensorList{m->forward(in[0])}; }, {input},
                    module->parameters())[0];
}

}  // namespace chorus::nn::utils
