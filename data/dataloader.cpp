#include "data/dataloader.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "tensor/error.h"

namespace chorus::data {

// One pass over the data: the batches' index lists, and (with workers) the threads making them.
class DataLoader::Epoch {
 public:
  Epoch(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches, int workers, int prefetch)
      : dataset_(std::move(dataset)), batches_(std::move(batches)), window_(std::max(1, workers * prefetch)) {
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }
  ~Epoch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  bool done() const { return current_ >= static_cast<int64_t>(batches_.size()); }

  // Makes batch `current_` available in current_batch_.
  void load() {
    if (done()) return;
    if (threads_.empty()) {
      current_batch_ = dataset_->get_batch(batches_[current_]);
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return ready_.count(current_) > 0; });
    Slot slot = std::move(ready_[current_]);
    ready_.erase(current_);
    consumed_ = current_ + 1;
    lock.unlock();
    cv_.notify_all();  // a worker may now start a batch further ahead
    if (slot.error) std::rethrow_exception(slot.error);
    current_batch_ = std::move(slot.batch);
  }

  void advance() {
    ++current_;
    load();
  }

  Batch& batch() { return current_batch_; }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  void work() {
    for (;;) {
      int64_t index;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // Stay at most window_ batches ahead of the consumer.
        cv_.wait(lock, [&] { return stop_ || (next_ < static_cast<int64_t>(batches_.size()) && next_ < consumed_ + window_); });
        if (stop_) return;
        index = next_++;
      }
      Slot slot;
      try {
        slot.batch = dataset_->get_batch(batches_[index]);
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_[index] = std::move(slot);
      }
      cv_.notify_all();
    }
  }

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::vector<int64_t>> batches_;
  int64_t window_;
  int64_t current_ = 0;
  Batch current_batch_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Slot> ready_;
  int64_t next_ = 0, consumed_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  if (!dataset_) fail("DataLoader: the dataset is null");
  if (options_.batch_size < 1) fail("DataLoader: batch_size must be >= 1, got {}", options_.batch_size);
  if (options_.num_workers < 0) fail("DataLoader: num_workers must be >= 0, got {}", options_.num_workers);
  if (options_.prefetch_factor < 1) fail("DataLoader: prefetch_factor must be >= 1, got {}", options_.prefetch_factor);
  if (options_.sampler && options_.shuffle) fail("DataLoader: give either a sampler or shuffle=true, not both");
  sampler_ = options_.sampler;
  if (!sampler_) {
    if (options_.shuffle) sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    else sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
  }
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void DataLoader::skip_batches(int64_t k) {
  if (k < 0 || k > size()) fail("DataLoader::skip_batches: {} is outside [0, {}] batches per epoch", k, size());
  skip_ = k;
}

DataLoader::Iterator DataLoader::begin() {
  sampler_->set_epoch(epoch_);
  ++epoch_;
  const std::vector<int64_t> order = sampler_->indices();
  for (int64_t i : order) {
    if (i < 0 || i >= dataset_->size()) {
      fail("DataLoader: the sampler gave index {} for a dataset of {} examples", i, dataset_->size());
    }
  }
  std::vector<std::vector<int64_t>> batches;
  for (size_t start = 0; start < order.size(); start += options_.batch_size) {
    const size_t end = std::min(order.size(), start + static_cast<size_t>(options_.batch_size));
    if (options_.drop_last && end - start < static_cast<size_t>(options_.batch_size)) break;
    batches.emplace_back(order.begin() + start, order.begin() + end);
  }
  batches.erase(batches.begin(), batches.begin() + std::min<size_t>(batches.size(), static_cast<size_t>(skip_)));
  skip_ = 0;
  Iterator it;
  if (batches.empty()) return it;
  it.epoch_ = std::make_shared<Epoch>(dataset_, std::move(batches), options_.num_workers, options_.prefetch_factor);
  it.epoch_->load();
  return it;
}

Batch& DataLoader::Iterator::operator*() {
  if (!epoch_) fail("DataLoader: dereferencing the end iterator");
  return epoch_->batch();
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  if (!epoch_) return *this;
  epoch_->advance();
  if (epoch_->done()) epoch_.reset();
  return *this;
}

bool DataLoader::Iterator::operator==(const Iterator& other) const { return epoch_ == other.epoch_; }

}  // namespace chorus::data
