// Measures a ModelProfile (profile.h) of a model given as a sequence of layers, in this process:
// each layer's forward and backward time (median of `repeats` after `warmup` runs, on the CPU, the
// layer fed the previous layer's real output), its output bytes, its parameter bytes, and the bytes
// one forward leaves allocated until backward (output + everything autograd saved), read from the
// caching allocator's statistics while the layer runs once on a memory device (the simulated
// device "sim" by default: the CPU has no allocator statistics, sim runs the same kernels).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/pipeline/planner/profile.h"
#include "nn/container.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace chorus::distributed::pipeline::planner {

struct ProfileOptions {
  int warmup = 2;
  int repeats = 5;
  bool measure_saved_bytes = true;
  Device memory_device = Device::sim(0);
};

using NamedLayers = std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>>;

// `input` feeds layer 0 (its first dimension is the batch). Layers are left on the CPU with no
// gradients. chorus::Error when there are no layers, repeats < 1 or warmup < 0. A layer that fails on
// the memory device keeps saved_bytes unmeasured (-1) and the reason is appended to `notes`.
ModelProfile profile_layers(const NamedLayers& layers, const Tensor& input, const ProfileOptions& options = {},
                            std::vector<std::string>* notes = nullptr);
// The Sequential's modules as the layers, named "0", "1", ... as in its state dict.
ModelProfile profile_sequential(const nn::Sequential& model, const Tensor& input, const ProfileOptions& options = {},
                                std::vector<std::string>* notes = nullptr);

}  // namespace chorus::distributed::pipeline::planner
