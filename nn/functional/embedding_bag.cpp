// embedding_bag as a composite of differentiable ops (index_select, scatter_add, max over a padded
// bag matrix), so every device runs it and autograd derives the gradients of weight and
// per_sample_weights. Only the bag layout (which kept index goes to which bag) is worked out on the
// host, from indices and offsets.
#include "nn/functional/embedding_bag.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/ops/common.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

const char* embedding_bag_mode_name(EmbeddingBagMode mode) {
  switch (mode) {
    case EmbeddingBagMode::Sum: return "sum";
    case EmbeddingBagMode::Mean: return "mean";
    case EmbeddingBagMode::Max: return "max";
  }
  return "?";
}

namespace {

std::vector<int64_t> host_int64(const Tensor& t) {
  Tensor c = t.to(kCPU).to(kInt64).contiguous().reshape({-1});
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// Which bag each index belongs to, and the positions (into the flat indices) that stay after
// padding_idx entries are dropped.
struct BagLayout {
  int64_t bags = 0;
  std::vector<int64_t> kept;     // positions into the flat indices
  std::vector<int64_t> bag_of;   // bag of each kept position
  std::vector<int64_t> counts;   // kept entries per bag
};

BagLayout bag_layout(const Tensor& indices, const Tensor& offsets, bool include_last_offset, int64_t num_embeddings,
                     std::optional<int64_t> padding_idx) {
  const std::vector<int64_t> idx = host_int64(indices);
  const int64_t total = static_cast<int64_t>(idx.size());
  std::vector<int64_t> starts;
  const int64_t end = total;
  if (indices.dim() == 2) {
    for (int64_t b = 0; b < indices.size(0); ++b) starts.push_back(b * indices.size(1));
  } else {
    starts = host_int64(offsets);
    if (include_last_offset) {
      if (starts.empty()) fail("embedding_bag: include_last_offset needs at least one offset, got none");
      // CSR layout, as PyTorch documents it: the last offset is the number of indices.
      if (starts.back() != total) {
        fail("embedding_bag: with include_last_offset the last offset must be the number of indices {}, got {}",
             total, starts.back());
      }
      starts.pop_back();
    }
    if (!starts.empty() && starts[0] != 0) {
      fail("embedding_bag: offsets[0] must be 0 (the first bag starts at the first index), got {}", starts[0]);
    }
    for (size_t b = 0; b < starts.size(); ++b) {
      const int64_t next = b + 1 < starts.size() ? starts[b + 1] : end;
      if (next < starts[b] || next > total) {
        fail("embedding_bag: offsets must be non-decreasing and at most the number of indices {}, got {}", total,
             fmt::join(host_int64(offsets), ", "));
      }
    }
  }
  BagLayout layout;
  layout.bags = static_cast<int64_t>(starts.size());
  layout.counts.assign(starts.size(), 0);
  for (int64_t b = 0; b < layout.bags; ++b) {
    const int64_t stop = b + 1 < layout.bags ? starts[b + 1] : end;
    for (int64_t t = starts[b]; t < stop; ++t) {
      if (idx[t] < 0 || idx[t] >= num_embeddings) {
        fail("embedding_bag: index {} at position {} is out of range for {} embeddings", idx[t], t, num_embeddings);
      }
      if (padding_idx && idx[t] == *padding_idx) continue;
      layout.kept.push_back(t);
      layout.bag_of.push_back(b);
      ++layout.counts[b];
    }
  }
  return layout;
}

Tensor int64_tensor(const std::vector<int64_t>& values, Device device) {
  return tensor<int64_t>(values, Shape{static_cast<int64_t>(values.size())}).to(device);
}

}  // namespace

Tensor embedding_bag(const Tensor& indices, const Tensor& weight, const Tensor& offsets, EmbeddingBagMode mode,
                     const Tensor& per_sample_weights, bool include_last_offset, std::optional<int64_t> padding_idx) {
  ops::check_defined(indices, "embedding_bag", "indices");
  ops::check_defined(weight, "embedding_bag", "weight");
  if (weight.dim() != 2) {
    fail("embedding_bag: weight must be 2-D [num_embeddings, dim], got shape {}", shape_str(weight.sizes()));
  }
  if (indices.dtype() != kInt64 && indices.dtype() != kInt32) {
    fail("embedding_bag: expected int64 or int32 indices, got {}", dtype_name(indices.dtype()));
  }
  if (indices.dim() == 2) {
    if (offsets.defined()) {
      fail("embedding_bag: 2-D indices of shape {} are one bag per row and take no offsets, got offsets of shape {}",
           shape_str(indices.sizes()), shape_str(offsets.sizes()));
    }
  } else if (indices.dim() == 1) {
    if (!offsets.defined() || offsets.dim() != 1) {
      fail("embedding_bag: 1-D indices need 1-D offsets (where each bag starts), got {}",
           offsets.defined() ? shape_str(offsets.sizes()) : std::string("none"));
    }
    if (offsets.dtype() != kInt64 && offsets.dtype() != kInt32) {
      fail("embedding_bag: expected int64 or int32 offsets, got {}", dtype_name(offsets.dtype()));
    }
  } else {
    fail("embedding_bag: expected 1-D indices with offsets or 2-D [bags, length] indices, got shape {}",
         shape_str(indices.sizes()));
  }
  if (per_sample_weights.defined()) {
    if (mode != EmbeddingBagMode::Sum) {
      fail("embedding_bag: per_sample_weights is only supported for mode sum, got mode {}",
           embedding_bag_mode_name(mode));
    }
    if (per_sample_weights.sizes() != indices.sizes()) {
      fail("embedding_bag: per_sample_weights of shape {} must have the shape of indices {}",
           shape_str(per_sample_weights.sizes()), shape_str(indices.sizes()));
    }
    if (per_sample_weights.dtype() != weight.dtype()) {
      fail("embedding_bag: per_sample_weights ({}) must have weight's dtype ({})",
           dtype_name(per_sample_weights.dtype()), dtype_name(weight.dtype()));
    }
  }
  const int64_t num = weight.size(0), dim = weight.size(1);
  std::optional<int64_t> pad = padding_idx;
  if (pad && *pad < 0) *pad += num;
  if (pad && (*pad < 0 || *pad >= num)) {
    fail("embedding_bag: padding_idx {} must be within the {} embeddings", *padding_idx, num);
  }
  const BagLayout layout = bag_layout(indices, offsets, include_last_offset, num, pad);
  const Device device = weight.device();
  const int64_t bags = layout.bags, kept = static_cast<int64_t>(layout.kept.size());
  const Tensor kept_pos = int64_tensor(layout.kept, device);
  const Tensor rows = index_select(weight, 0, index_select(indices.reshape({-1}).to(kInt64), 0, kept_pos));  // [kept, dim]

  if (mode == EmbeddingBagMode::Max) {
    // Bag b's rows in slots [b, 0..count_b), the rest pointing at a -inf row; max over the slots.
    int64_t longest = 0;
    for (int64_t c : layout.counts) longest = std::max(longest, c);
    if (longest == 0) return zeros({bags, dim}, weight.options());
    std::vector<int64_t> slots(static_cast<size_t>(bags * longest), kept);
    std::vector<int64_t> filled(static_cast<size_t>(bags), 0);
    for (int64_t k = 0; k < kept; ++k) {
      const int64_t b = layout.bag_of[k];
      slots[b * longest + filled[b]++] = k;
    }
    const Tensor with_floor = cat({rows, full({1, dim}, -std::numeric_limits<double>::infinity(), weight.options())}, 0);
    const Tensor grid = index_select(with_floor, 0, int64_tensor(slots, device)).view({bags, longest, dim});
    const Tensor best = max(grid, 1).first;
    std::vector<int64_t> empty_bag(layout.counts.size());
    for (size_t b = 0; b < empty_bag.size(); ++b) empty_bag[b] = layout.counts[b] == 0;
    const Tensor is_empty = eq(int64_tensor(empty_bag, device), 1).unsqueeze(1);
    return where(is_empty, zeros({1}, weight.options()), best);
  }

  Tensor scaled = rows;
  if (per_sample_weights.defined()) {
    scaled = mul(rows, index_select(per_sample_weights.reshape({-1}), 0, kept_pos).unsqueeze(1));
  }
  const Tensor target = int64_tensor(layout.bag_of, device).unsqueeze(1).expand({kept, dim}).contiguous();
  Tensor out = scatter_add(zeros({bags, dim}, weight.options()), 0, target, scaled);
  if (mode == EmbeddingBagMode::Mean) {
    std::vector<double> divisor(layout.counts.size());  // an empty bag's zeros stay zeros
    for (size_t b = 0; b < divisor.size(); ++b) divisor[b] = static_cast<double>(std::max<int64_t>(layout.counts[b], 1));
    out = div(out, tensor<double>(divisor, Shape{bags, 1}).to(device, weight.dtype()));
  }
  return out;
}

}  // namespace chorus::nn::functional
