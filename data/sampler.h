// Samplers: the order in which a DataLoader visits a dataset's indices, as torch.utils.data.
// Shuffles use chorus's Philox generator seeded with seed + epoch, so every machine and every rank
// computes the same permutation for an epoch, and set_epoch() gives each epoch a new one.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/generator.h"

namespace chorus::data {

// A permutation of 0..n-1 drawn from gen (Fisher-Yates over Philox words).
std::vector<int64_t> randperm(int64_t n, Generator& gen);

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices of one epoch.
  virtual std::vector<int64_t> indices() const = 0;
  virtual int64_t size() const = 0;
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// This rank's share of the dataset, exactly as PyTorch's DistributedSampler: the (shuffled or
// ordered) indices are padded by repeating from their start to a multiple of num_replicas (or, with
// drop_last, cut to one), then rank r takes every num_replicas-th index starting at r. Every rank
// gets ceil(n / num_replicas) indices (floor with drop_last), so all ranks run the same number of
// steps.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return num_samples_; }

 private:
  int64_t n_;
  int num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_, total_size_;
};

}  // namespace chorus::data
