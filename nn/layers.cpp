#include "nn/layers.h"

#include "autograd/grad_mode.h"
#include "nn/functional/basic.h"
#include "nn/functional/normalization.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::nn {

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  if (p < 0.0 || p > 1.0) fail("Dropout: probability has to be between 0 and 1, but got {}", p);
}
Tensor Dropout::forward(const Tensor& input) { return functional::dropout(input, p, is_training()); }
std::string Dropout::extra_repr() const { return fmt::format("p={}", p); }

Dropout1d::Dropout1d(double p_) : Module("Dropout1d"), p(p_) {
  if (p < 0.0 || p > 1.0) fail("Dropout1d: probability has to be between 0 and 1, but got {}", p);
}
Tensor Dropout1d::forward(const Tensor& input) { return functional::dropout1d(input, p, is_training()); }
std::string Dropout1d::extra_repr() const { return fmt::format("p={}", p); }

Dropout2d::Dropout2d(double p_) : Module("Dropout2d"), p(p_) {
  if (p < 0.0 || p > 1.0) fail("Dropout2d: probability has to be between 0 and 1, but got {}", p);
}
Tensor Dropout2d::forward(const Tensor& input) { return functional::dropout2d(input, p, is_training()); }
std::string Dropout2d::extra_repr() const { return fmt::format("p={}", p); }

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad)
    : Module("Embedding"), num_embeddings(num), embedding_dim(dim), padding_idx(pad) {
  if (num <= 0 || dim <= 0) fail("Embedding: num_embeddings ({}) and embedding_dim ({}) must be positive", num, dim);
  if (padding_idx) {
    if (*padding_idx < -num || *padding_idx >= num) {
      fail("Embedding: padding_idx {} must be within num_embeddings {}", *padding_idx, num);
    }
    if (*padding_idx < 0) *padding_idx += num;
  }
  weight = register_parameter("weight", empty({num, dim}));
  init::normal_(weight);
  if (padding_idx) {
    NoGradGuard no_grad;
    weight.select(0, *padding_idx).fill_(0);
  }
}
Tensor Embedding::forward(const Tensor& indices) { return functional::embedding(indices, weight, padding_idx); }
std::string Embedding::extra_repr() const {
  return padding_idx ? fmt::format("{}, {}, padding_idx={}", num_embeddings, embedding_dim, *padding_idx)
                     : fmt::format("{}, {}", num_embeddings, embedding_dim);
}

EmbeddingBag::EmbeddingBag(int64_t num, int64_t dim, const EmbeddingBagOptions& opts)
    : Module("EmbeddingBag"), num_embeddings(num), embedding_dim(dim), options(opts) {
  if (num <= 0 || dim <= 0) {
    fail("EmbeddingBag: num_embeddings ({}) and embedding_dim ({}) must be positive", num, dim);
  }
  std::optional<int64_t>& pad = options.padding_idx;
  if (pad) {
    if (*pad < -num || *pad >= num) fail("EmbeddingBag: padding_idx {} must be within num_embeddings {}", *pad, num);
    if (*pad < 0) *pad += num;
  }
  weight = register_parameter("weight", empty({num, dim}));
  init::normal_(weight);
  if (pad) {
    NoGradGuard no_grad;
    weight.select(0, *pad).fill_(0);
  }
}
Tensor EmbeddingBag::forward(const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights) {
  return functional::embedding_bag(indices, weight, offsets, options.mode, per_sample_weights,
                                   options.include_last_offset, options.padding_idx);
}
std::string EmbeddingBag::extra_repr() const {
  std::string s = fmt::format("{}, {}, mode={}", num_embeddings, embedding_dim,
                              functional::embedding_bag_mode_name(options.mode));
  if (options.include_last_offset) s += ", include_last_offset=true";
  if (options.padding_idx) s += fmt::format(", padding_idx={}", *options.padding_idx);
  return s;
}

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine) : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  if (normalized_shape.empty()) fail("LayerNorm: normalized_shape must not be empty");
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}
Tensor LayerNorm::forward(const Tensor& input) {
  return functional::layer_norm(input, normalized_shape, weight, bias, eps);
}
std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", shape_str(normalized_shape), eps, weight.defined());
}

}  // namespace chorus::nn
