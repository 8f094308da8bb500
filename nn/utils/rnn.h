// Variable-length batches for the recurrent layers, as torch::nn::utils::rnn: a PackedSequence keeps
// only the real time steps of each sequence, time-major, so an RNN run over it never sees padding
// and its h_n is each sequence's state after its own last step.
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::nn::utils::rnn {

// data [sum(batch_sizes), *]: step 0 of every sequence, then step 1 of those still running, ...,
// the sequences ordered longest first. batch_sizes (int64, on the CPU) [T]: how many sequences step t
// has. sorted_indices maps that order to the caller's batch (sorted[i] = caller's index of row i),
// unsorted_indices back again; both undefined when the batch came sorted (enforce_sorted).
struct PackedSequence {
  Tensor data;
  Tensor batch_sizes;
  Tensor sorted_indices;
  Tensor unsorted_indices;

  // batch_sizes as host integers.
  std::vector<int64_t> batch_sizes_vector() const;
};

// input [T, B, *] ([B, T, *] with batch_first), lengths [B] (int64 tensor or host values, each in
// 1..T). With enforce_sorted the lengths must not increase; otherwise the batch is sorted here and
// the indices recorded so pad_packed_sequence and the RNNs' h_n come back in the caller's order.
PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first = false,
                                    bool enforce_sorted = true);
PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                    bool batch_first = false, bool enforce_sorted = true);

// The inverse: (padded [T, B, *] or [B, T, *], lengths int64 [B]) in the caller's batch order, the
// steps past each length set to padding_value. total_length pads T further (it may not be shorter).
std::tuple<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence, bool batch_first = false,
                                               double padding_value = 0.0,
                                               std::optional<int64_t> total_length = std::nullopt);

// Sequences [L_i, *] (same trailing shape) stacked into [max L, B, *] ([B, max L, *] with
// batch_first), the steps past each length set to padding_value.
Tensor pad_sequence(const TensorList& sequences, bool batch_first = false, double padding_value = 0.0);
// pad_sequence then pack_padded_sequence with the sequences' own lengths.
PackedSequence pack_sequence(const TensorList& sequences, bool enforce_sorted = true);

}  // namespace chorus::nn::utils::rnn
