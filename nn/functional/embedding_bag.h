// F::embedding_bag: sums, means or maxima of bags of embedding rows without materializing the
// rows of every index per bag, as torch.nn.functional.embedding_bag.
#pragma once

#include <optional>

#include "tensor/tensor.h"

namespace chorus::nn::functional {

enum class EmbeddingBagMode { Sum, Mean, Max };

const char* embedding_bag_mode_name(EmbeddingBagMode mode);

// weight [num_embeddings, dim] -> [bags, dim]. indices are int64 or int32, either 1-D with
// `offsets` (1-D, where each bag starts; the first must be 0; with include_last_offset one more entry,
// the number of indices, as in CSR), or 2-D [bags, length] without offsets (each row
// a bag). per_sample_weights (the shape of indices, weight's dtype) scales each row before summing,
// mode Sum only. Indices equal to padding_idx are left out of their bag (not counted by Mean). An
// empty bag gives zeros. The bag boundaries are read on the host (a copy from a device).
Tensor embedding_bag(const Tensor& indices, const Tensor& weight, const Tensor& offsets = Tensor(),
                     EmbeddingBagMode mode = EmbeddingBagMode::Mean, const Tensor& per_sample_weights = Tensor(),
                     bool include_last_offset = false, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace chorus::nn::functional
