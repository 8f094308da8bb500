#include "optim/foreach.h"

#include <cmath>

#include "kernels/dispatch.h"

namespace chorus::optim {
namespace {

struct NamedList {
  const char* name;
  const std::vector<Tensor>& tensors;
  bool optional;  // may be empty (momentum buffers without momentum, max_exp_avg_sqs without amsgrad)
};

// One kernel call takes one dtype and one device, and state buffers shaped as their parameters:
// what the multi-tensor kernels assume, checked once here with the list and index named.
void check_lists(const char* fn, const std::vector<NamedList>& lists) {
  const std::vector<Tensor>& params = lists.front().tensors;
  if (params.empty()) return;
  const Tensor& first = params.front();
  if (!first.defined()) fail("{}: params[0] is an undefined tensor", fn);
  if (first.dtype() != kFloat32 && first.dtype() != kFloat64) {
    fail("{}: params[0] is {}; the multi-tensor optimizer steps take float32 or float64 tensors", fn,
         dtype_name(first.dtype()));
  }
  for (const NamedList& list : lists) {
    if (list.optional && list.tensors.empty()) continue;
    if (list.tensors.size() != params.size()) {
      fail("{}: {} has {} tensors, expected {} (one per tensor of params{})", fn, list.name, list.tensors.size(),
           params.size(), list.optional ? ", or none" : "");
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& t = list.tensors[i];
      if (!t.defined()) fail("{}: {}[{}] is an undefined tensor", fn, list.name, i);
      if (t.dtype() != first.dtype()) {
        fail("{}: {}[{}] is {}, expected {} (the dtype of params[0]): one call takes one dtype", fn, list.name, i,
             dtype_name(t.dtype()), dtype_name(first.dtype()));
      }
      if (t.device() != first.device()) {
        fail("{}: {}[{}] is on {}, expected {} (the device of params[0]): one call takes one device", fn, list.name,
             i, t.device().str(), first.device().str());
      }
      if (t.sizes() != params[i].sizes()) {
        fail("{}: {}[{}] has shape {}, expected {} (the shape of params[{}])", fn, list.name, i,
             shape_str(t.sizes()), shape_str(params[i].sizes()), i);
      }
      // Elements are paired by memory position: every tensor dense in params[i]'s layout (row-major,
      // or channels-last for all of a parameter's tensors).
      const MemoryFormat format = params[i].suggest_memory_format();
      if (!t.is_contiguous(format) || !params[i].is_contiguous(format)) {
        fail("{}: {}[{}] is not dense in the layout of params[{}] ({}); pass .contiguous() tensors, or a "
             "parameter's tensors all in one memory format",
             fn, list.name, i, i, memory_format_name(format));
      }
    }
  }
}

}  // namespace

AdamBiasCorrection adam_bias_correction(double lr, double beta1, double beta2, double step) {
  const double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
  return {lr / bc1, std::sqrt(bc2)};
}

void foreach_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      const std::vector<Tensor>& momentum_buffers, const SgdStepOptions& o) {
  check_lists("foreach_sgd_step",
              {{"params", params, false}, {"grads", grads, false}, {"momentum_buffers", momentum_buffers, true}});
  // The buffers come with momentum and only with it (SGD keeps none without): a list without them
  // would silently step without momentum.
  if (o.momentum != 0 && momentum_buffers.empty() && !params.empty()) {
    fail("foreach_sgd_step: momentum is {} but momentum_buffers is empty (pass one buffer per parameter)",
         o.momentum);
  }
  if (o.momentum == 0 && !momentum_buffers.empty()) {
    fail("foreach_sgd_step: momentum is 0 but {} momentum_buffers were given (pass none without momentum)",
         momentum_buffers.size());
  }
  if (params.empty()) return;
  kernels::sgd_step_multi(params, grads, momentum_buffers, o.lr, o.weight_decay, o.momentum, o.dampening, o.nesterov,
                          o.first_step);
  for (const Tensor& p : params) p.bump_version();
}

void foreach_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                       const std::vector<Tensor>& max_exp_avg_sqs, const AdamStepOptions& o) {
  check_lists("foreach_adam_step", {{"params", params, false},
                                    {"grads", grads, false},
                                    {"exp_avgs", exp_avgs, false},
                                    {"exp_avg_sqs", exp_avg_sqs, false},
                                    {"max_exp_avg_sqs", max_exp_avg_sqs, true}});
  if (params.empty()) return;
  const AdamBiasCorrection bc = adam_bias_correction(o.lr, o.beta1, o.beta2, o.step);
  kernels::adam_step_multi(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, o.lr, o.beta1, o.beta2, o.eps,
                           o.weight_decay, bc.step_size, bc.bias_correction2_sqrt, o.decoupled);
  for (const Tensor& p : params) p.bump_version();
}

}  // namespace chorus::optim
