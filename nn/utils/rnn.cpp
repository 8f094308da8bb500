#include "nn/utils/rnn.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::nn::utils::rnn {

namespace {

std::vector<int64_t> host_int64(const Tensor& t) {
  const Tensor c = t.detach().to(kCPU).to(kInt64).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

Tensor index_tensor(const std::vector<int64_t>& values, Device device) {
  return tensor(values).to(device);
}

}  // namespace

std::vector<int64_t> PackedSequence::batch_sizes_vector() const {
  if (!batch_sizes.defined()) fail("PackedSequence: batch_sizes is undefined");
  return host_int64(batch_sizes);
}

PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first,
                                    bool enforce_sorted) {
  if (!lengths.defined() || lengths.dim() != 1) {
    fail("pack_padded_sequence: expected lengths as a 1-D tensor, got {}",
         lengths.defined() ? shape_str(lengths.sizes()) : "an undefined tensor");
  }
  if (is_floating(lengths.dtype())) {
    fail("pack_padded_sequence: expected integer lengths, got {}", dtype_name(lengths.dtype()));
  }
  return pack_padded_sequence(input, host_int64(lengths), batch_first, enforce_sorted);
}

PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths, bool batch_first,
                                    bool enforce_sorted) {
  if (!input.defined() || input.dim() < 2) {
    fail("pack_padded_sequence: expected input [T, B, *] (or [B, T, *] with batch_first), got {}",
         input.defined() ? shape_str(input.sizes()) : "an undefined tensor");
  }
  const Tensor time_major = batch_first ? transpose(input, 0, 1) : input;
  const int64_t steps = time_major.size(0), batch = time_major.size(1);
  if (static_cast<int64_t>(lengths.size()) != batch) {
    fail("pack_padded_sequence: got {} lengths for a batch of {} sequences (input {}, batch_first={})",
         lengths.size(), batch, shape_str(input.sizes()), batch_first);
  }
  for (int64_t length : lengths) {
    if (length < 1 || length > steps) {
      fail("pack_padded_sequence: lengths {} must each be between 1 and the input's {} time steps", lengths, steps);
    }
  }

  PackedSequence packed;
  std::vector<int64_t> order(batch);
  std::iota(order.begin(), order.end(), 0);
  Tensor sorted_input = time_major;
  if (enforce_sorted) {
    if (!std::is_sorted(lengths.rbegin(), lengths.rend())) {
      fail("pack_padded_sequence: lengths {} are not sorted longest first; sort the batch or pass "
           "enforce_sorted = false",
           lengths);
    }
  } else {
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    std::vector<int64_t> inverse(batch);
    for (int64_t i = 0; i < batch; ++i) inverse[order[i]] = i;
    packed.sorted_indices = index_tensor(order, input.device());
    packed.unsorted_indices = index_tensor(inverse, input.device());
    sorted_input = index_select(time_major, 1, packed.sorted_indices);
  }

  // Step t keeps the first batch_sizes[t] rows: those (longest first) whose length exceeds t. The
  // steps are one split of the input ([One node for a split], autograd/ops/index.cpp): a select per
  // step gave each step's gradient a zero tensor of the whole input, quadratic in the length when
  // the input requires grad (an embedding's output, say).
  const TensorList per_step = split(sorted_input, 1, 0);  // [1, B, *] each
  std::vector<int64_t> batch_sizes;
  TensorList pieces;
  for (int64_t t = 0; t < lengths[order[0]]; ++t) {
    int64_t running = 0;
    while (running < batch && lengths[order[running]] > t) ++running;
    batch_sizes.push_back(running);
    pieces.push_back(narrow(per_step[t], 1, 0, running));
  }
  Shape rows = sorted_input.sizes();  // [1, sum(batch_sizes), *] -> [sum(batch_sizes), *]: a view
  rows.erase(rows.begin());
  rows[0] = std::accumulate(batch_sizes.begin(), batch_sizes.end(), int64_t{0});
  packed.data = cat(pieces, 1).reshape(rows);
  packed.batch_sizes = tensor(batch_sizes);
  return packed;
}

std::tuple<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence, bool batch_first, double padding_value,
                                               std::optional<int64_t> total_length) {
  if (!sequence.data.defined() || sequence.data.dim() < 1) fail("pad_packed_sequence: the sequence has no data");
  const std::vector<int64_t> batch_sizes = sequence.batch_sizes_vector();
  const int64_t steps = static_cast<int64_t>(batch_sizes.size());
  const int64_t total = std::accumulate(batch_sizes.begin(), batch_sizes.end(), int64_t{0});
  if (steps == 0 || total != sequence.data.size(0)) {
    fail("pad_packed_sequence: batch_sizes {} add up to {} rows, but data has shape {}", batch_sizes, total,
         shape_str(sequence.data.sizes()));
  }
  if (total_length && *total_length < steps) {
    fail("pad_packed_sequence: total_length {} is shorter than the longest sequence ({} steps)", *total_length, steps);
  }
  const int64_t batch = batch_sizes[0];
  const int64_t padded_steps = total_length.value_or(steps);
  Shape row_shape = sequence.data.sizes();
  row_shape.erase(row_shape.begin());
  const TensorOptions options{.dtype = sequence.data.dtype(), .device = sequence.data.device()};
  auto padding = [&](int64_t rows) {
    Shape s{rows};
    s.insert(s.end(), row_shape.begin(), row_shape.end());
    return full(s, padding_value, options);
  };

  TensorList rows_per_step = split(sequence.data, batch_sizes, 0);
  TensorList steps_out;
  for (int64_t t = 0; t < padded_steps; ++t) {
    const int64_t running = t < steps ? batch_sizes[t] : 0;
    if (running == batch) {
      steps_out.push_back(rows_per_step[t]);
    } else if (running == 0) {
      steps_out.push_back(padding(batch));
    } else {
      steps_out.push_back(cat({rows_per_step[t], padding(batch - running)}, 0));
    }
  }
  Tensor padded = stack(steps_out, 0);  // [T, B, *], rows in sorted order

  // A sorted row's length: the number of steps whose batch size exceeds its index.
  std::vector<int64_t> lengths(batch, 0);
  for (int64_t running : batch_sizes) {
    for (int64_t i = 0; i < running; ++i) ++lengths[i];
  }
  if (sequence.unsorted_indices.defined()) {
    padded = index_select(padded, 1, sequence.unsorted_indices);
    const std::vector<int64_t> unsorted = host_int64(sequence.unsorted_indices);
    std::vector<int64_t> caller_order(batch);
    for (int64_t i = 0; i < batch; ++i) caller_order[i] = lengths[unsorted[i]];
    lengths = caller_order;
  }
  if (batch_first) padded = transpose(padded, 0, 1);
  return {padded, tensor(lengths)};
}

Tensor pad_sequence(const TensorList& sequences, bool batch_first, double padding_value) {
  if (sequences.empty()) fail("pad_sequence: got no sequences");
  int64_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Tensor& s = sequences[i];
    if (!s.defined() || s.dim() < 1 ||
        !std::equal(s.sizes().begin() + 1, s.sizes().end(), sequences[0].sizes().begin() + 1,
                    sequences[0].sizes().end())) {
      fail("pad_sequence: sequence {} has shape {}; every sequence must be [L_i, *] with the trailing shape of "
           "sequence 0, {}",
           i, s.defined() ? shape_str(s.sizes()) : "undefined", shape_str(sequences[0].sizes()));
    }
    longest = std::max(longest, s.size(0));
  }
  TensorList padded;
  for (const Tensor& s : sequences) {
    Shape rest = s.sizes();
    rest[0] = longest - s.size(0);
    padded.push_back(rest[0] == 0 ? s : cat({s, full(rest, padding_value, {.dtype = s.dtype(), .device = s.device()})}, 0));
  }
  return stack(padded, batch_first ? 0 : 1);
}

PackedSequence pack_sequence(const TensorList& sequences, bool enforce_sorted) {
  const Tensor padded = pad_sequence(sequences);
  std::vector<int64_t> lengths;
  for (const Tensor& s : sequences) lengths.push_back(s.size(0));
  return pack_padded_sequence(padded, lengths, false, enforce_sorted);
}

}  // namespace chorus::nn::utils::rnn
