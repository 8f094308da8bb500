// Measures a ModelProfile (profile.h) of a model given as a sequence of layers, in this process:
// each layer's forward and backward time (median of `repeats` after `warmup` runs, on the CPU, all
// forwards in order then all backwards in reverse as a stage runs them, so each layer meets the
// caches a training step leaves it; each layer fed the previous layer's real output), its output bytes, its parameter bytes, and the bytes
// one forward leaves allocated until backward (output + everything autograd saved), read from the
// caching allocator's statistics while the layer runs once on a memory device (the simulated
// device "sim" by default: the CPU has no allocator statistics, sim runs the same kernels).
// Optionally also: the times at other batch sizes (`extra_batches`, the rows of the profiled input
// cut or repeated), the time to accumulate one micro-batch's parameter gradients into existing
// ones (what every micro-batch's backward after the first pays: AccumulateGrad's in-place add),
// and one optimizer step over the layer's parameters (`make_optimizer`).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/pipeline/planner/profile.h"
#include "nn/container.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace chorus::distributed::pipeline::planner {

struct ProfileOptions {
  int warmup = 2;
  int repeats = 5;
  bool measure_saved_bytes = true;
  Device memory_device = Device::sim(0);
  std::vector<int64_t> extra_batches{};  // also time these batch sizes (LayerProfile::timings)
  bool measure_grad_accumulate = true;
  // Builds the optimizer the training will use over a layer's parameters; its step is timed (the
  // parameters are restored afterwards). Empty: optimizer_ms stays 0.
  std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)> make_optimizer{};
};

using NamedLayers = std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>>;

// `input` feeds layer 0 (its first dimension is the batch). Layers are left on the CPU with no
// gradients and their parameters unchanged. chorus::Error when there are no layers, repeats < 1,
// warmup < 0 or an extra batch size < 1. A layer that fails on
// the memory device keeps saved_bytes unmeasured (-1) and the reason is appended to `notes`.
ModelProfile profile_layers(const NamedLayers& layers, const Tensor& input, const ProfileOptions& options = {},
                            std::vector<std::string>* notes = nullptr);
// The Sequential's modules as the layers, named "0", "1", ... as in its state dict.
ModelProfile profile_sequential(const nn::Sequential& model, const Tensor& input, const ProfileOptions& options = {},
                                std::vector<std::string>* notes = nullptr);

}  // namespace chorus::distributed::pipeline::planner
