// Multi-tensor ("foreach") optimizer steps over lists of tensors, as torch.optim's functional
// sgd/adam with foreach=True: one kernel over every parameter of a list (kernels::sgd_step_multi,
// adam_step_multi) on the CPU, sim and CUDA, with the per-tensor steps' arithmetic. SGD and
// Adam/AdamW call these when their `foreach` or `fused` option is on; they are public for code
// that keeps its own state buffers. The lists are checked here, with errors naming the list and
// index; the kernels check nothing.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace chorus::optim {

struct SgdStepOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffers were just created: they take the update as it is
};

// params[i] -= lr * d for d as SGD computes it; momentum_buffers is empty without momentum, else
// one per parameter.
void foreach_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      const std::vector<Tensor>& momentum_buffers, const SgdStepOptions& options);

struct AdamStepOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;  // AdamW
  double step = 1;         // the step number every parameter of the call is at (1 for the first)
};

// One Adam (AdamW when decoupled) step of number options.step for every parameter;
// max_exp_avg_sqs is empty without amsgrad, else one per parameter.
void foreach_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                       const std::vector<Tensor>& max_exp_avg_sqs, const AdamStepOptions& options);

// Adam's per-step scalars, computed in double on the host: lr / (1 - beta1^step) and
// sqrt(1 - beta2^step). The per-tensor and multi-tensor steps both take them from here.
struct AdamBiasCorrection {
  double step_size, bias_correction2_sqrt;
};
AdamBiasCorrection adam_bias_correction(double lr, double beta1, double beta2, double step);

}  // namespace chorus::optim
