#include "data/dataset.h"

#include "tensor/ops.h"

namespace chorus::data {

void Dataset::check_index(int64_t index) const {
  if (index < 0 || index >= size()) fail("Dataset: index {} is out of range for a dataset of {} examples", index, size());
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  TensorList xs, ys;
  for (int64_t i : indices) {
    Example e = get(i);
    xs.push_back(e.data);
    ys.push_back(e.target);
  }
  if (xs.empty()) return {};
  return {stack(xs, 0), ys[0].defined() ? stack(ys, 0) : Tensor()};
}

TensorDataset::TensorDataset(Tensor data, Tensor targets) : data_(std::move(data)), targets_(std::move(targets)) {
  if (!data_.defined() || data_.dim() == 0) fail("TensorDataset: data must have at least one dim (the examples)");
  if (!targets_.defined() || targets_.dim() == 0 || targets_.size(0) != data_.size(0)) {
    fail("TensorDataset: data of shape {} and targets of shape {} must have the same size in dim 0",
         shape_str(data_.sizes()), targets_.defined() ? shape_str(targets_.sizes()) : std::string("(undefined)"));
  }
}

Example TensorDataset::get(int64_t index) const {
  check_index(index);
  return {data_.select(0, index), targets_.select(0, index)};
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices) check_index(i);
  Tensor idx = tensor(indices);
  return {index_select(data_, 0, idx), index_select(targets_, 0, idx)};
}

}  // namespace chorus::data
