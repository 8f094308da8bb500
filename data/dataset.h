// Datasets, as torch.utils.data: a Dataset has size() and get(i); get_batch(indices) collates a
// batch (stacking along a new dim 0), and datasets held in memory override it with one gather.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::data {

struct Example {
  Tensor data;
  Tensor target;
};

struct Batch {
  Tensor data;
  Tensor target;
  int64_t size() const { return data.defined() ? data.size(0) : 0; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // Default collation: get() each index and stack. Must be safe to call from several threads.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;

 protected:
  void check_index(int64_t index) const;
};

// Examples are rows of `data` and `targets` (their first dims must agree).
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor data, Tensor targets);
  int64_t size() const override { return data_.size(0); }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor data_, targets_;
};

}  // namespace chorus::data
