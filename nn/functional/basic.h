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
// Zeroes elements with probability p and scales the rest by 1/(1-p) in training; identity otherwise.
Tensor dropout(const Tensor& input, double p = 0.5, bool training = true, Generator* generator = nullptr);
// Rows of weight [num_embeddings, dim] picked by integer indices of any shape -> [..., dim]. The
// row at padding_idx gets no gradient.
Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace chorus::nn::functional
