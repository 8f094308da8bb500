// Losses, as torch.nn.functional: cross_entropy (fused, numerically stable log-softmax), nll_loss,
// mse_loss, binary_cross_entropy_with_logits.
#pragma once

#include "tensor/tensor.h"

namespace chorus::nn::functional {

enum class Reduction { None, Mean, Sum };

// `Tensor weight{}` (not `Tensor weight;`): a default member initializer keeps GCC's
// -Wmissing-field-initializers quiet when callers leave it out of a designated initializer.
struct CrossEntropyOptions {
  Tensor weight{};             // optional per-class weights [C]
  int64_t ignore_index = -100;  // targets equal to it contribute nothing (and are not counted)
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};

// input: logits [N, C] or [N, C, d1, ...]; target: int64 class indices [N] or [N, d1, ...].
Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options = {});

struct NLLLossOptions {
  Tensor weight{};
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
};
// input: log-probabilities [N, C] (or [N, C, d...]).
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options = {});

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// Stable sigmoid + binary cross-entropy: max(x,0) - x*y + log(1 + exp(-|x|)), with pos_weight
// (broadcast over the last dim) weighting the positive term as PyTorch does.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction = Reduction::Mean,
                                        const Tensor& pos_weight = Tensor());

}  // namespace chorus::nn::functional
