#include "data/sampler.h"

#include <numeric>

#include "tensor/error.h"

namespace chorus::data {

std::vector<int64_t> randperm(int64_t n, Generator& gen) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(p.begin(), p.end(), 0);
  if (n < 2) return p;
  // One Philox block (four 32-bit words) gives two 64-bit draws.
  const uint64_t start = gen.reserve_blocks(static_cast<uint64_t>((n + 1) / 2));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t k = n - 1 - i;
    const auto words = Generator::philox(gen.seed(), start + static_cast<uint64_t>(k / 2));
    const int w = static_cast<int>(k % 2) * 2;
    const uint64_t r = (static_cast<uint64_t>(words[w]) << 32) | words[w + 1];
    const int64_t j = static_cast<int64_t>(r % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  if (n < 0) fail("SequentialSampler: size must be >= 0, got {}", n);
}
std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> p(n_);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  if (n < 0) fail("RandomSampler: size must be >= 0, got {}", n);
}
std::vector<int64_t> RandomSampler::indices() const {
  Generator gen(seed_ + static_cast<uint64_t>(epoch_));
  return randperm(n_, gen);
}

DistributedSampler::DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle, uint64_t seed, bool drop_last)
    : n_(n), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (num_replicas < 1) fail("DistributedSampler: num_replicas must be >= 1, got {}", num_replicas);
  if (rank < 0 || rank >= num_replicas) {
    fail("DistributedSampler: invalid rank {}, rank should be in the interval [0, {}]", rank, num_replicas - 1);
  }
  if (n < 0) fail("DistributedSampler: dataset size must be >= 0, got {}", n);
  num_samples_ = drop_last && n % num_replicas != 0 ? n / num_replicas : (n + num_replicas - 1) / num_replicas;
  total_size_ = num_samples_ * num_replicas;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (shuffle_) {
    Generator gen(seed_ + static_cast<uint64_t>(epoch_));
    all = randperm(n_, gen);
  } else {
    all.resize(n_);
    std::iota(all.begin(), all.end(), 0);
  }
  if (!drop_last_) {
    // Pad by repeating from the start (several times when the padding exceeds the dataset).
    const int64_t padding = total_size_ - n_;
    for (int64_t i = 0; i < padding && n_ > 0; ++i) all.push_back(all[i % n_]);
  } else {
    all.resize(total_size_);
  }
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = rank_; i < total_size_; i += num_replicas_) mine.push_back(all[i]);
  return mine;
}

}  // namespace chorus::data
