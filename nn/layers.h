// Dropout (elementwise and channel-wise), Embedding, EmbeddingBag and LayerNorm modules.
#pragma once

#include <optional>

#include "nn/functional/embedding_bag.h"
#include "nn/module.h"

namespace chorus::nn {

// Seeded through the default generator (manual_seed) unless given its own; identity in eval().
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  double p;

 protected:
  std::string extra_repr() const override;
};

// Whole channels zeroed (F::dropout1d / dropout2d); identity in eval().
class Dropout1d : public Module {
 public:
  explicit Dropout1d(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  double p;

 protected:
  std::string extra_repr() const override;
};

class Dropout2d : public Module {
 public:
  explicit Dropout2d(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  double p;

 protected:
  std::string extra_repr() const override;
};

// weight [num_embeddings, embedding_dim] ~ N(0, 1); the padding_idx row starts at zero and gets
// no gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;
  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;
  Tensor weight;

 protected:
  std::string extra_repr() const override;
};

struct EmbeddingBagOptions {
  functional::EmbeddingBagMode mode = functional::EmbeddingBagMode::Mean;  // PyTorch's default
  bool include_last_offset = false;
  std::optional<int64_t> padding_idx;
};

// weight [num_embeddings, embedding_dim] ~ N(0, 1), the padding_idx row zero, as PyTorch's
// EmbeddingBag; forward is F::embedding_bag with the options' mode, include_last_offset and
// padding_idx.
class EmbeddingBag : public Module {
 public:
  EmbeddingBag(int64_t num_embeddings, int64_t embedding_dim, const EmbeddingBagOptions& options = {});
  Tensor forward(const Tensor& indices) override { return forward(indices, Tensor()); }
  Tensor forward(const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights = Tensor());
  int64_t num_embeddings, embedding_dim;
  EmbeddingBagOptions options;
  Tensor weight;

 protected:
  std::string extra_repr() const override;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  // ones / zeros; undefined without elementwise_affine

 protected:
  std::string extra_repr() const override;
};

}  // namespace chorus::nn
