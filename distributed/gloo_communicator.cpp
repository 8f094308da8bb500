// GlooStreamCommunicator: see gloo_communicator.h.
#include "distributed/gloo_communicator.h"

#include <condition_variable>
#include <deque>
#include <thread>

#include "distributed/stream_group.h"
#include "tensor/ops.h"

namespace chorus::distributed {

namespace {
// A one-shot gate: wait() returns once open() has been called.
class Latch {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};
}  // namespace

struct GlooStreamCommunicator::State {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t submitted = 0, issued = 0;  // stream tasks queued / that have issued their collectives
  std::string aborted;                 // why, once abort() ran
};

// Host work in the order of one stream, run on a thread of its own (see group_end): each job waits
// for its event, then runs.
class GlooStreamCommunicator::LaneWorker {
 public:
  LaneWorker() : thread_([this] { loop(); }) {}
  ~LaneWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Copies `src` into `dst` (one of them on `device`, the other a host tensor of the same size) on
  // this worker's own stream, and waits for the copy. Only the worker's thread calls this.
  void copy(const Tensor& dst, const Tensor& src, Device device) {
    DeviceRuntime& rt = runtime_for(device, "ProcessGroup");
    if (!copy_stream_) copy_stream_ = rt.create_stream(device.index, /*high_priority=*/false);
    const CopyKind kind = dst.device().is_cpu() ? CopyKind::DeviceToHost : CopyKind::HostToDevice;
    rt.memcpy_async(dst.raw_data_ptr(), src.raw_data_ptr(), static_cast<size_t>(src.numel()) * src.element_size(),
                    kind, copy_stream_);
    rt.synchronize_stream(copy_stream_);
  }
  void push(Event ready, std::function<void(std::exception_ptr)> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back({std::move(ready), std::move(job)});
    }
    cv_.notify_all();
  }

 private:
  struct Job {
    Event ready;
    std::function<void(std::exception_ptr)> run;  // given the error of waiting for `ready`, if any
  };
  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopped, and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::exception_ptr error;
      try {
        // Not Event::synchronize(): that counts as the host blocking (host_sync_count), which a
        // thread of the communicator's own waiting is not.
        runtime_for(job.ready.device(), "ProcessGroup").synchronize_event(job.ready.handle());
      } catch (...) {
        error = std::current_exception();
      }
      job.run(error);
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  StreamHandle copy_stream_ = nullptr;  // made at the first copy, on the lane's device
  std::thread thread_;
};

GlooStreamCommunicator::GlooStreamCommunicator(std::shared_ptr<ProcessGroup> host)
    : host_(std::move(host)), state_(std::make_shared<State>()) {
  if (!host_) fail("GlooStreamCommunicator: the host process group is null");
}

GlooStreamCommunicator::~GlooStreamCommunicator() {
  try {
    release_staging(/*all=*/true);
  } catch (...) {  // a failed device at teardown: the buffers are lost, nothing else to do
  }
}

void GlooStreamCommunicator::release_staging(bool all) {
  std::vector<Staging> done;
  {
    std::lock_guard<std::mutex> lock(staging_mutex_);
    std::vector<Staging> still;
    for (Staging& st : staging_) {
      if (all || st.done.query()) done.push_back(std::move(st));
      else still.push_back(std::move(st));
    }
    staging_.swap(still);
  }
  if (all)
    for (Staging& st : done) st.done.synchronize();
  // `done` goes out of scope here: the tensors and works the stream no longer needs are let go.
}

GlooStreamCommunicator::LaneWorker& GlooStreamCommunicator::worker_for(const Stream& stream) {
  std::lock_guard<std::mutex> lock(workers_mutex_);
  for (auto& [s, w] : workers_)
    if (s == stream) return *w;
  workers_.emplace_back(stream, std::make_unique<LaneWorker>());
  return *workers_.back().second;
}

void GlooStreamCommunicator::group_start() {
  if (depth_++ > 0) return;
  release_staging(/*all=*/false);
}

void GlooStreamCommunicator::add(const char* op, const TensorList& tensors, const TensorList& written,
                                 const Stream& stream, const std::shared_ptr<StreamWork>& work, Issue issue) {
  const bool implicit = depth_ == 0;
  if (implicit) group_start();
  if (stream_ && !(*stream_ == stream)) fail("gloo {}: every op of a coalesced group must use one stream", op);
  stream_ = stream;
  const Device device = stream.device();
  const size_t first = aliases_.size();
  for (const Tensor& t : tensors) {
    if (!t.is_contiguous()) {
      fail("ProcessGroup gloo {}: a {} tensor goes to Gloo through host memory and must be contiguous (got strides "
           "{} for shape {}); call .contiguous() first",
           op, device.str(), shape_str(t.strides()), shape_str(t.sizes()));
    }
    // Gloo works on a host copy, which the lane worker fills and copies back (group_end).
    Tensor host = make_tensor(t.sizes(), t.dtype(), Device::cpu());
    aliases_.push_back(host);
    bool writes = false;
    for (const Tensor& w : written) writes = writes || w.is_same(t);
    staged_.push_back({alias_without_history(t), host, writes});
  }
  jobs_.push_back({std::move(issue), first, tensors.size(), work});
  if (implicit) group_end();
}

void GlooStreamCommunicator::group_end() {
  if (depth_ == 0) fail("GlooStreamCommunicator: group_end() without group_start()");
  if (--depth_ > 0) return;
  if (jobs_.empty()) {
    stream_.reset();
    return;
  }
  const Stream stream = *stream_;
  std::vector<Job> jobs;
  jobs.swap(jobs_);
  TensorList aliases;
  aliases.swap(aliases_);
  std::vector<StagedTensor> staged_tensors;
  staged_tensors.swap(staged_);
  stream_.reset();

  std::shared_ptr<State> state = state_;  // the task may outlive the communicator
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    ++state->submitted;
  }
  auto host = host_;
  DeviceRuntime& rt = runtime_for(stream.device(), "ProcessGroup");
  // The host function on a CUDA stream may make no CUDA call: it must not hold the last reference
  // to a device tensor (freeing one records an event on its stream) or to a work (its events). The
  // device tensors and the works stay with the staging record instead, released on this side once
  // the stream has passed the task.
  std::vector<std::shared_ptr<StreamWork>> works;
  for (const Job& job : jobs) works.push_back(job.work);
  // The collectives of the group, issued on the host copies and waited for. `error`: why they
  // cannot run at all.
  auto run = [jobs, host, aliases, state](std::exception_ptr error) {
    std::string aborted;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      aborted = state->aborted;
    }
    // Issue every collective of the group before waiting for any (a send and a receive of one
    // group must both be posted), then wait for each.
    std::vector<std::shared_ptr<Work>> inner(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (error) {
        jobs[j].work->note_error(error);
        continue;
      }
      if (!aborted.empty()) {
        jobs[j].work->note_error(std::make_exception_ptr(Error(fmt::format("the communicator was aborted: {}", aborted))));
        continue;
      }
      try {
        const auto b = aliases.begin() + static_cast<std::ptrdiff_t>(jobs[j].first);
        inner[j] = jobs[j].issue(*host, TensorList(b, b + static_cast<std::ptrdiff_t>(jobs[j].count)));
      } catch (...) {
        jobs[j].work->note_error(std::current_exception());
      }
    }
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      ++state->issued;
    }
    state->cv.notify_all();
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (!inner[j]) continue;
      try {
        inner[j]->wait();
      } catch (...) {
        jobs[j].work->note_error(std::current_exception());
      }
    }
  };
  {
    // Once an event after the caller's work has passed, the stream's lane worker copies the
    // tensors to host memory on a stream of its own, runs the collectives and copies the results
    // back, while the communication stream waits in a host function until it is done. What the
    // first GPU run taught (2026-11-26):
    // - no CUDA call inside a host function (cudaErrorNotPermitted): the worker does the copies;
    // - CUDA may run the host functions of all streams on one thread, so the collectives must not
    //   run inside one: a send waiting there for its peer's receive would keep this process's own
    //   receive (another stream's host function) from being posted, and a ring would deadlock;
    // - allocating or freeing page-locked memory orders all later device work after everything
    //   issued before (an implicit synchronization): copies through pinned buffers made for a
    //   receive would queue behind the send still waiting for its peer. The host copies are
    //   pageable memory, made and freed without CUDA.
    // The host function still waits for the worker, so with several lanes in flight a waiting one
    // can hold up another's host function (gloo_communicator.h, "Known limit").
    auto done = std::make_shared<Latch>();
    Event ready;
    ready.record(stream);
    const Device device = stream.device();
    LaneWorker& worker = worker_for(stream);
    worker.push(std::move(ready), [run, done, jobs, device, staged_tensors, &worker](std::exception_ptr error) {
      if (!error) {
        try {
          for (const StagedTensor& st : staged_tensors) worker.copy(st.host, st.device, device);
        } catch (...) {
          error = std::current_exception();
        }
      }
      run(error);
      if (!error) {
        try {
          for (const StagedTensor& st : staged_tensors)
            if (st.written) worker.copy(st.device, st.host, device);
        } catch (...) {
          for (const Job& job : jobs) job.work->note_error(std::current_exception());
        }
      }
      done->open();
    });
    rt.launch_host_task(stream.handle(), [done] { done->wait(); }, {});
  }
  // The device tensors and works stay here until the stream has passed the task (see Staging).
  Staging st{Event(), {}, std::move(works)};
  for (const StagedTensor& t : staged_tensors) st.tensors.push_back(t.device);
  st.done.record(stream);
  std::lock_guard<std::mutex> lock(staging_mutex_);
  staging_.push_back(std::move(st));
}

void GlooStreamCommunicator::abort(const std::string& why) {
  // A collective already inside Gloo ends at Gloo's own timeout (the group's); later ones fail at once.
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->aborted.empty()) state_->aborted = why;
}

void GlooStreamCommunicator::wait_until_issued() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.issued == s.submitted) return;
  note_host_sync();
  s.cv.wait(lock, [&] { return s.issued == s.submitted; });
}

void GlooStreamCommunicator::allreduce(const TensorList& tensors, ReduceOp op, const Stream& stream,
                                       const std::shared_ptr<StreamWork>& work) {
  add("allreduce", tensors, tensors, stream, work,
      [op](ProcessGroup& g, const TensorList& t) { return g.allreduce(t, op); });
}

void GlooStreamCommunicator::broadcast(const TensorList& tensors, int root, const Stream& stream,
                                       const std::shared_ptr<StreamWork>& work) {
  add("broadcast", tensors, tensors, stream, work,
      [root](ProcessGroup& g, const TensorList& t) { return g.broadcast(t, root); });
}

void GlooStreamCommunicator::allgather(const TensorList& outputs, const Tensor& input, const Stream& stream,
                                       const std::shared_ptr<StreamWork>& work) {
  TensorList all = outputs;
  all.push_back(input);
  const size_t n = outputs.size();
  add("allgather", all, outputs, stream, work, [n](ProcessGroup& g, const TensorList& t) {
    return g.allgather(TensorList(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)), t[n]);
  });
}

void GlooStreamCommunicator::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op,
                                            const Stream& stream, const std::shared_ptr<StreamWork>& work) {
  TensorList all{output};
  all.insert(all.end(), inputs.begin(), inputs.end());
  add("reduce_scatter", all, {output}, stream, work, [op](ProcessGroup& g, const TensorList& t) {
    return g.reduce_scatter(t[0], TensorList(t.begin() + 1, t.end()), op);
  });
}

void GlooStreamCommunicator::all_to_all(const TensorList& outputs, const TensorList& inputs, const Stream& stream,
                                        const std::shared_ptr<StreamWork>& work) {
  TensorList all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  const size_t n = outputs.size();
  add("all_to_all", all, outputs, stream, work, [n](ProcessGroup& g, const TensorList& t) {
    const auto mid = t.begin() + static_cast<std::ptrdiff_t>(n);
    return g.all_to_all(TensorList(t.begin(), mid), TensorList(mid, t.end()));
  });
}

void GlooStreamCommunicator::send(const Tensor& tensor, int dst, int tag, const Stream& stream,
                                  const std::shared_ptr<StreamWork>& work) {
  add("send", {tensor}, {}, stream, work,
      [dst, tag](ProcessGroup& g, const TensorList& t) { return g.send(t[0], dst, tag); });
}

void GlooStreamCommunicator::recv(const Tensor& tensor, int src, int tag, const Stream& stream,
                                  const std::shared_ptr<StreamWork>& work) {
  add("recv", {tensor}, {tensor}, stream, work,
      [src, tag](ProcessGroup& g, const TensorList& t) { return g.recv(t[0], src, tag); });
}

}  // namespace chorus::distributed
