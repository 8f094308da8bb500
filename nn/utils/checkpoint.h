// Activation checkpointing, as torch.utils.checkpoint: run a piece of the model without keeping
// its intermediate activations, and run it again in backward to get them back. Memory for time:
// only the piece's inputs are kept, and its forward runs twice.
//
//   // inside a forward: x -> block -> y, block's activations recomputed in backward
//   Tensor y = nn::utils::checkpoint([&](const TensorList& in) { return TensorList{block->forward(in[0])}; },
//                                    {x}, block->parameters());
//   Tensor y = nn::utils::checkpoint(block, x);   // the same for a module of one input
//
// - Gradients are those of running the piece normally, bit for bit: backward restores the default
//   generator's state (seed, offset) the forward saw, so dropout draws the same masks, and the
//   autocast state (device type, dtype, on or off) it ran under.
// - The piece's gradients reach its inputs (those that require grad) and `params`: pass every tensor
//   the piece uses that needs a gradient and is not an input (a module's parameters()). Parameters
//   left out get no gradient, as they would be invisible to autograd (PyTorch's reentrant variant
//   has the same rule for inputs; here the parameters are named instead).
// - The recomputation in backward runs the engine again, inside the outer backward, so gradient
//   hooks (DDP's) fire for the piece's parameters as in a normal backward.
// - fn must be deterministic given its inputs and the generator's state, and must not change its
//   inputs in place.
#pragma once

#include <functional>
#include <memory>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace chorus::nn::utils {

using CheckpointFn = std::function<TensorList(const TensorList&)>;

// fn's outputs, computed without recording history inside fn; one autograd node stands for it.
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, const TensorList& params = {});
// module->forward(input), checkpointed, with the module's parameters.
Tensor checkpoint(const std::shared_ptr<Module>& module, const Tensor& input);

}  // namespace chorus::nn::utils
