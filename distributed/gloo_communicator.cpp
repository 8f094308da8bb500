// GlooStreamCommunicator: see gloo_communicator.h.
#include "distributed/gloo_communicator.h"

#include <condition_variable>

#include "distributed/stream_group.h"
#include "tensor/ops.h"

namespace chorus::distributed {

struct GlooStreamCommunicator::State {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t submitted = 0, issued = 0;  // stream tasks queued / that have issued their collectives
  std::string aborted;                 // why, once abort() ran
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
  for (Staging& st : done) {
    if (all) st.done.synchronize();
    DeviceRuntime& rt = runtime_for(st.device, "ProcessGroup");
    for (void* p : st.buffers) rt.host_free(p);
  }
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
  const bool staged = device.is_cuda() || StreamOrderedGroup::stage_through_host();
  DeviceRuntime& rt = runtime_for(device, "ProcessGroup");
  const size_t first = aliases_.size();
  for (const Tensor& t : tensors) {
    keep_.push_back(alias_without_history(t));
    if (staged) {
      if (!t.is_contiguous()) {
        fail("ProcessGroup gloo {}: a {} tensor goes to Gloo through host memory and must be contiguous (got strides "
             "{} for shape {}); call .contiguous() first",
             op, device.str(), shape_str(t.strides()), shape_str(t.sizes()));
      }
      // Copy to pinned host memory on the communication stream; Gloo works on the host copy.
      const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
      void* p = rt.host_malloc(std::max<size_t>(n, 1));
      pinned_.push_back(p);
      rt.memcpy_async(p, t.raw_data_ptr(), n, CopyKind::DeviceToHost, stream.handle());
      aliases_.push_back(from_blob(p, t.sizes(), {.dtype = t.dtype()}));
      bool writes = false;
      for (const Tensor& w : written) writes = writes || w.is_same(t);
      if (writes) copy_back_.emplace_back(t, p);
    } else {
      // A CPU-device tensor over the same memory (the task runs while the sim device has it open).
      aliases_.push_back(from_blob(t.raw_data_ptr(), t.sizes(), t.strides(), {.dtype = t.dtype()}));
      open_.push_back(t.storage()->data());
    }
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
  TensorList aliases, keep;
  aliases.swap(aliases_);
  keep.swap(keep_);
  std::vector<const void*> open;
  open.swap(open_);
  auto copy_back = std::move(copy_back_);
  copy_back_.clear();
  std::vector<void*> pinned;
  pinned.swap(pinned_);
  stream_.reset();

  std::shared_ptr<State> state = state_;  // the task may outlive the communicator
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    ++state->submitted;
  }
  auto host = host_;
  DeviceRuntime& rt = runtime_for(stream.device(), "ProcessGroup");
  rt.launch_host_task(
      stream.handle(),
      [jobs, host, aliases, keep, state]() {
        std::string aborted;
        {
          std::lock_guard<std::mutex> lock(state->mutex);
          aborted = state->aborted;
        }
        // Issue every collective of the group before waiting for any (a send and a receive of one
        // group must both be posted), then wait for each.
        std::vector<std::shared_ptr<Work>> inner(jobs.size());
        for (size_t j = 0; j < jobs.size(); ++j) {
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
      },
      std::move(open));
  if (!pinned.empty()) {
    // Copy the results back (every tensor the collectives write), then free the host copies once
    // the stream has passed here.
    for (const auto& [t, p] : copy_back) {
      rt.memcpy_async(t.raw_data_ptr(), p, static_cast<size_t>(t.numel()) * t.element_size(), CopyKind::HostToDevice,
                      stream.handle());
    }
    Staging st{stream.device(), Event(), std::move(pinned)};
    st.done.record(stream);
    std::lock_guard<std::mutex> lock(staging_mutex_);
    staging_.push_back(std::move(st));
  }
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
