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

// input: logits [N, C] or [N, C, d1, ...]; target: int64 class indices [N] or [N, d1, ...], or
// class probabilities of the input's shape and dtype (soft labels; ignore_index does not apply and
// the mean is over the N * d1 * ... positions, as PyTorch).
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

// input: probabilities in [0, 1]; each log is clamped at -100, as PyTorch's, so p = 0 or 1 stays finite.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                            Reduction reduction = Reduction::Mean);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta = 0: l1).
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                      double beta = 1.0);
// 0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta).
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                  double delta = 1.0);
// input: log-probabilities; target: probabilities (log-probabilities with log_target). batch_mean:
// the sum divided by the batch size (PyTorch's reduction='batchmean', the mathematically right
// KL divergence per sample); otherwise `reduction` as usual.
struct KLDivOptions {
  Reduction reduction = Reduction::Mean;
  bool batch_mean = false;
  bool log_target = false;
};
Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivOptions& options = {});
// 1 - cos(x1, x2) where y = 1; max(0, cos(x1, x2) - margin) where y = -1. x1, x2: [N, D], y: [N].
Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target, double margin = 0.0,
                             Reduction reduction = Reduction::Mean);

}  // namespace chorus::nn::functional
