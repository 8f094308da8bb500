#include "distributed/process_group.h"

#include <signal.h>

namespace chorus::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "unknown";
}

bool Work::is_completed() const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return true;
  }
  complete_in_background();
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::wait(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout) {
    if (!done_cv_.wait_for(lock, *timeout, [&] { return done_; })) {
      fail("{}: not finished after waiting {} ms", description_, timeout->count());
    }
  } else {
    done_cv_.wait(lock, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::wait_finished() {
  complete_in_background();
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return done_; });
}

void Work::then(std::function<void(Work&)> fn) {
  complete_in_background();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!has_result_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn(*this);
}

void Work::finish(TensorList result, std::exception_ptr error) {
  // Callbacks run before waiters wake, as a future's continuations would: whoever returns from
  // wait() sees everything the callbacks recorded (e.g. DDP's communication timings).
  std::vector<std::function<void(Work&)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result_ = std::move(result);
    error_ = error;
    has_result_ = true;
    callbacks.swap(callbacks_);
  }
  for (auto& cb : callbacks) cb(*this);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
}

std::shared_ptr<Work> completed_work(std::string description, TensorList result) {
  auto w = std::make_shared<Work>(std::move(description));
  w->finish(std::move(result));
  return w;
}

std::shared_ptr<Work> joined_work(std::string description, std::vector<std::shared_ptr<Work>> parts) {
  auto joined = std::make_shared<Work>(std::move(description));
  if (parts.empty()) {
    joined->finish({});
    return joined;
  }
  struct Count {
    std::mutex mutex;
    size_t left;
  };
  auto count = std::make_shared<Count>();
  count->left = parts.size();
  for (auto& part : parts) {
    part->then([joined, count, parts](Work&) {
      {
        std::lock_guard<std::mutex> lock(count->mutex);
        if (--count->left != 0) return;
      }
      // The last part to finish: every part has its result now.
      TensorList all;
      std::exception_ptr error;
      for (const auto& p : parts) {
        if (!error) error = p->exception();
        const TensorList& r = p->result();
        all.insert(all.end(), r.begin(), r.end());
      }
      joined->finish(std::move(all), error);
    });
  }
  return joined;
}

void ProcessGroup::start_coalescing() {
  if (coalescing_) fail("ProcessGroup {} start_coalescing: already coalescing (end_coalescing() first)", backend_name());
  coalescing_ = true;
  coalesced_.clear();
}

std::shared_ptr<Work> ProcessGroup::end_coalescing() {
  if (!coalescing_) fail("ProcessGroup {} end_coalescing: start_coalescing() was not called", backend_name());
  coalescing_ = false;
  std::vector<std::shared_ptr<Work>> parts;
  parts.swap(coalesced_);
  return joined_work(fmt::format("ProcessGroup {} coalesced group of {} ops (rank {} of {})", backend_name(),
                                 parts.size(), rank_, size_),
                     std::move(parts));
}

std::shared_ptr<Work> ProcessGroup::track(std::shared_ptr<Work> work) {
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

void ignore_sigpipe() {
  static const bool done = [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)done;
}

}  // namespace chorus::distributed
