// Functional forms of the basic layers: linear, activations, dropout, embedding.
#pragma once

#include <optional>
#include <string>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace chorus::nn::functional {

// input [..., in_features] @ weight[out_features, in_features]^T + bias[out_features].
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());
Tensor relu(const Tensor& input);
Tensor gelu(const Tensor& input, const std::string& approximate = "none");
Tensor silu(const Tensor& input);
Tensor tanh(const Tensor& input);
Tensor sigmoid(const Tensor& input);
Tensor softmax(const Tensor& input, int64_t dim);
Tensor log_softmax(const Tensor& input, int64_t dim);
// activations_extra.cpp; PyTorch's defaults.
Tensor leaky_relu(const Tensor& input, double negative_slope = 0.01);
Tensor elu(const Tensor& input, double alpha = 1.0);
// log(1 + exp(beta x)) / beta, and x itself where beta x > threshold.
Tensor softplus(const Tensor& input, double beta = 1.0, double threshold = 20.0);
Tensor hardswish(const Tensor& input);
Tensor mish(const Tensor& input);
// weight: 1 value, or one per channel (dim 1 of the input).
Tensor prelu(const Tensor& input, const Tensor& weight);
// Zeroes elements with probability p and scales the rest by 1/(1-p) in training; identity otherwise.
Tensor dropout(const Tensor& input, double p = 0.5, bool training = true, Generator* generator = nullptr);
// Channel-wise dropout: zeroes whole channels (dim 1 of [N, C, L] / [N, C, H, W]; dim 0 of an
// unbatched [C, L] / [C, H, W]) with probability p and scales the rest by 1/(1-p) in training.
Tensor dropout1d(const Tensor& input, double p = 0.5, bool training = true, Generator* generator = nullptr);
Tensor dropout2d(const Tensor& input, double p = 0.5, bool training = true, Generator* generator = nullptr);
// Rows of weight [num_embeddings, dim] picked by integer indices of any shape -> [..., dim]. The
// row at padding_idx gets no gradient.
Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace chorus::nn::functional
