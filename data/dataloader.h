// DataLoader, as torch.utils.data.DataLoader: batches of a Dataset in the order a Sampler gives,
// collated into batch tensors, optionally prepared ahead by background worker threads (in order).
//
//   data::DataLoader loader(dataset, {.batch_size = 64, .shuffle = true, .seed = 1, .num_workers = 2});
//   for (int epoch = 0; epoch < 3; ++epoch)
//     for (data::Batch& b : loader) { ... b.data, b.target ... }
//
// Each pass (each begin()) is one epoch; the epoch number advances by itself and is handed to the
// sampler, so a shuffle differs per epoch and is the same for a seed on every run (set_epoch()
// chooses it explicitly, e.g. when resuming). An exception in a worker reaches the consumer when
// it gets to that batch. Leaving a loop early stops the workers cleanly.
#pragma once

#include <memory>

#include "data/dataset.h"
#include "data/sampler.h"

namespace chorus::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  int num_workers = 0;      // 0: batches are made on the consuming thread
  int prefetch_factor = 2;  // batches in flight per worker
  std::shared_ptr<Sampler> sampler{};  // replaces shuffle/seed (e.g. a DistributedSampler)
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);

  class Epoch;
  class Iterator {
   public:
    Batch& operator*();
    Batch* operator->() { return &**this; }
    Iterator& operator++();
    bool operator!=(const Iterator& other) const { return !(*this == other); }
    bool operator==(const Iterator& other) const;

   private:
    friend class DataLoader;
    std::shared_ptr<Epoch> epoch_;  // null: end
  };

  Iterator begin();
  Iterator end() { return Iterator(); }
  // Number of batches per epoch.
  int64_t size() const;
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  // The next pass starts at its batch k (0 <= k <= size()) without loading the batches before it:
  // resuming mid-epoch from a checkpoint sees exactly the batches the interrupted run had not. Only
  // the next pass; later ones start at 0.
  void skip_batches(int64_t k);
  int64_t epoch() const { return epoch_; }
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<Sampler> sampler_;
  int64_t epoch_ = 0;
  int64_t skip_ = 0;
};

}  // namespace chorus::data
