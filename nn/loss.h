// Loss modules, as torch::nn's: each holds its options and has forward(input, target) calling the
// functional form (nn/functional/loss.h); defaults are PyTorch's (reduction mean).
#pragma once

#include "nn/functional/loss.h"
#include "nn/module.h"

namespace chorus::nn {

using functional::Reduction;

class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean) : Module("MSELoss"), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target) { return functional::mse_loss(input, target, reduction); }
  Reduction reduction;
};

class L1Loss : public Module {
 public:
  explicit L1Loss(Reduction reduction = Reduction::Mean) : Module("L1Loss"), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target) { return functional::l1_loss(input, target, reduction); }
  Reduction reduction;
};

class SmoothL1Loss : public Module {
 public:
  explicit SmoothL1Loss(Reduction reduction = Reduction::Mean, double beta = 1.0)
      : Module("SmoothL1Loss"), reduction(reduction), beta(beta) {}
  Tensor forward(const Tensor& input, const Tensor& target) {
    return functional::smooth_l1_loss(input, target, reduction, beta);
  }
  Reduction reduction;
  double beta;
};

class HuberLoss : public Module {
 public:
  explicit HuberLoss(Reduction reduction = Reduction::Mean, double delta = 1.0)
      : Module("HuberLoss"), reduction(reduction), delta(delta) {}
  Tensor forward(const Tensor& input, const Tensor& target) {
    return functional::huber_loss(input, target, reduction, delta);
  }
  Reduction reduction;
  double delta;
};

class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(functional::CrossEntropyOptions options = {})
      : Module("CrossEntropyLoss"), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target) { return functional::cross_entropy(input, target, options); }
  functional::CrossEntropyOptions options;
};

class NLLLoss : public Module {
 public:
  explicit NLLLoss(functional::NLLLossOptions options = {}) : Module("NLLLoss"), options(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target) { return functional::nll_loss(input, target, options); }
  functional::NLLLossOptions options;
};

class BCELoss : public Module {
 public:
  explicit BCELoss(Tensor weight = Tensor(), Reduction reduction = Reduction::Mean)
      : Module("BCELoss"), weight(std::move(weight)), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target) {
    return functional::binary_cross_entropy(input, target, weight, reduction);
  }
  Tensor weight;
  Reduction reduction;
};

class BCEWithLogitsLoss : public Module {
 public:
  explicit BCEWithLogitsLoss(Reduction reduction = Reduction::Mean, Tensor pos_weight = Tensor())
      : Module("BCEWithLogitsLoss"), reduction(reduction), pos_weight(std::move(pos_weight)) {}
  Tensor forward(const Tensor& input, const Tensor& target) {
    return functional::binary_cross_entropy_with_logits(input, target, reduction, pos_weight);
  }
  Reduction reduction;
  Tensor pos_weight;
};

class KLDivLoss : public Module {
 public:
  explicit KLDivLoss(functional::KLDivOptions options = {}) : Module("KLDivLoss"), options(options) {}
  Tensor forward(const Tensor& input, const Tensor& target) { return functional::kl_div(input, target, options); }
  functional::KLDivOptions options;
};

class CosineEmbeddingLoss : public Module {
 public:
  explicit CosineEmbeddingLoss(double margin = 0.0, Reduction reduction = Reduction::Mean)
      : Module("CosineEmbeddingLoss"), margin(margin), reduction(reduction) {}
  Tensor forward(const Tensor& input1, const Tensor& input2, const Tensor& target) {
    return functional::cosine_embedding_loss(input1, input2, target, margin, reduction);
  }
  double margin;
  Reduction reduction;
};

}  // namespace chorus::nn
