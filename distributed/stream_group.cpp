// StreamOrderedGroup: see stream_group.h for the ordering rule ([Sync Streams]).
#include "distributed/stream_group.h"

#include <atomic>
#include <condition_variable>

#include "tensor/caching_allocator.h"
#include "tensor/ops.h"

namespace chorus::distributed {
namespace {

std::atomic<bool> g_skip_waits{false};
std::atomic<bool> g_force_staging{false};

// A CPU-device tensor over the same memory as device tensor `t` (the host communicator reads and
// writes it from the communication stream's task, while the sim device has the memory open).
Tensor host_alias(const Tensor& t) {
  return from_blob(t.raw_data_ptr(), t.sizes(), t.strides(), {.dtype = t.dtype()});
}

}  // namespace

StreamWork::StreamWork(std::string description, Device device, TensorList outputs)
    : Work(std::move(description)), device_(device), outputs_(std::move(outputs)) {}

void StreamWork::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (timeout) {
    Work::wait(timeout);  // a bounded wait is a host wait, by definition
    return;
  }
  if (!g_skip_waits.load()) current_stream(device_).wait(end_);
  if (is_completed()) {
    if (auto error = exception()) std::rethrow_exception(error);
  }
}

void StreamWork::synchronize() {
  note_host_sync();
  Work::wait();
}

void StreamOrderedGroup::skip_stream_waits_for_testing(bool skip) { g_skip_waits.store(skip); }
void StreamOrderedGroup::stage_through_host_for_testing(bool stage) { g_force_staging.store(stage); }

StreamOrderedGroup::~StreamOrderedGroup() {
  try {
    release_staging(/*all=*/true);
  } catch (...) {  // a failed device at teardown: the buffers are lost, nothing else to do
  }
}

void StreamOrderedGroup::release_staging(bool all) {
  std::vector<Staging> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Staging> still;
    for (Staging& st : staging_) {
      if (all || st.work->end_event().query()) done.push_back(std::move(st));
      else still.push_back(std::move(st));
    }
    staging_.swap(still);
  }
  for (Staging& st : done) {
    if (all) st.work->end_event().synchronize();
    DeviceRuntime& rt = runtime_for(st.device, "ProcessGroup");
    for (void* p : st.buffers) rt.host_free(p);
  }
}

StreamOrderedGroup::StreamOrderedGroup(std::shared_ptr<ProcessGroup> host)
    : ProcessGroup(host->rank(), host->size()), host_(std::move(host)), issue_order_(std::make_shared<IssueOrder>()) {}

Stream StreamOrderedGroup::comm_stream(Device device, Lane lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, s] : comm_streams_)
    if (key.first == device && key.second == lane) return s;
  // Each lane its own stream, made for it (not from the round-robin pool, which could hand two lanes
  // one stream and put a receive behind a send again).
  DeviceRuntime& rt = runtime_for(device, "ProcessGroup");
  comm_streams_.emplace_back(std::make_pair(device, lane),
                             Stream(device, rt.create_stream(device.index, /*high_priority=*/true)));
  return comm_streams_.back().second;
}

struct StreamOrderedGroup::IssueOrder {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t submitted = 0, issued = 0;
};

void StreamOrderedGroup::wait_until_issued() {
  IssueOrder& o = *issue_order_;
  std::unique_lock<std::mutex> lock(o.mutex);
  if (o.issued == o.submitted) return;
  note_host_sync();
  o.cv.wait(lock, [&] { return o.issued == o.submitted; });
}

namespace {
bool all_cpu(const TensorList& tensors) {
  for (const Tensor& t : tensors)
    if (t.defined() && !t.device().is_cpu()) return false;
  return true;
}
}  // namespace

void StreamOrderedGroup::raise_async_error() {
  std::shared_ptr<StreamWork> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<StreamWork>> still;
    for (auto& w : in_flight_) {
      if (!w->is_completed()) {
        still.push_back(w);
      } else if (w->exception() && !failed) {
        failed = w;
      }
    }
    in_flight_.swap(still);
  }
  if (!failed) return;
  try {
    std::rethrow_exception(failed->exception());
  } catch (const std::exception& e) {
    fail("{} failed on the communication stream: {}", failed->description(), e.what());
  }
}

std::shared_ptr<Work> StreamOrderedGroup::ordered(
    const std::string& name, const TensorList& tensors, TensorList outputs,
    std::function<std::shared_ptr<Work>(ProcessGroup&, const TensorList&)> collective, Lane lane, bool writes) {
  raise_async_error();
  release_staging(/*all=*/false);
  const Device device = tensors.front().device();
  for (const Tensor& t : tensors) {
    if (t.device() != device) {
      fail("ProcessGroup {} {}: expected all tensors on one device, got {} and {}", backend_name(), name,
           device.str(), t.device().str());
    }
  }
  const bool staged = device.is_cuda() || g_force_staging.load();
  if (staged) {
    for (const Tensor& t : tensors) {
      if (!t.is_contiguous()) {
        fail("ProcessGroup {} {}: a {} tensor goes to Gloo through host memory and must be contiguous (got strides "
             "{} for shape {}); call .contiguous() first",
             backend_name(), name, device.str(), shape_str(t.strides()), shape_str(t.sizes()));
      }
    }
  }
  DeviceRuntime& rt = runtime_for(device, "ProcessGroup");
  const Stream comm = comm_stream(device, lane);
  // [Sync Streams] the collective reads what the caller's stream has written so far.
  if (!g_skip_waits.load()) {
    Event ready;
    ready.record(current_stream(device));
    comm.wait(ready);
  }
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = ++sequence_;
  }
  auto work = std::make_shared<StreamWork>(
      fmt::format("{} {} #{} on {} (rank {} of {})", backend_name(), name, seq, device.str(), rank_, size_), device,
      std::move(outputs));
  TensorList aliases, keep;
  std::vector<const void*> buffers;
  std::vector<void*> pinned;
  for (const Tensor& t : tensors) {
    keep.push_back(alias_without_history(t));
    if (staged) {
      // Copy to pinned host memory on the communication stream; Gloo works on the host copy.
      const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
      void* p = rt.host_malloc(std::max<size_t>(n, 1));
      pinned.push_back(p);
      rt.memcpy_async(p, t.raw_data_ptr(), n, CopyKind::DeviceToHost, comm.handle());
      aliases.push_back(from_blob(p, t.sizes(), {.dtype = t.dtype()}));
    } else {
      aliases.push_back(host_alias(t));
      buffers.push_back(t.storage()->data());
    }
  }
  std::shared_ptr<IssueOrder> order = issue_order_;  // the task may outlive the group
  {
    std::lock_guard<std::mutex> lock(order->mutex);
    ++order->submitted;
  }
  auto host = host_;
  rt.launch_host_task(
      comm.handle(),
      [work, host, aliases, keep, collective, order]() {
        std::exception_ptr error;
        std::shared_ptr<Work> inner;
        try {
          inner = collective(*host, aliases);
        } catch (...) {
          error = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(order->mutex);
          ++order->issued;
        }
        order->cv.notify_all();
        if (inner) {
          try {
            inner->wait();
          } catch (...) {
            error = std::current_exception();
          }
        }
        work->finish({}, error);
      },
      std::move(buffers));
  if (staged && writes) {
    // Copy the results back (every tensor the collective may write: in-place ones and outputs).
    const TensorList& outs = work->result();
    for (size_t i = 0; i < tensors.size(); ++i) {
      bool is_output = false;
      for (const Tensor& o : outs) is_output = is_output || o.is_same(tensors[i]);
      if (!is_output) continue;
      const size_t n = static_cast<size_t>(tensors[i].numel()) * tensors[i].element_size();
      rt.memcpy_async(tensors[i].raw_data_ptr(), pinned[i], n, CopyKind::HostToDevice, comm.handle());
    }
  }
  work->end_event().record(comm);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(work);
    if (staged) staging_.push_back({device, work, std::move(pinned)});
  }
  // The caller may drop its tensors at once: their blocks are not reused before `comm` passes here.
  for (const Tensor& t : tensors) record_stream(t.storage(), comm);
  return work;
}

std::shared_ptr<Work> StreamOrderedGroup::allreduce(const TensorList& tensors, ReduceOp op) {
  if (tensors.empty() || all_cpu(tensors)) {
    raise_async_error();
    wait_until_issued();
    return host_->allreduce(tensors, op);
  }
  return ordered("allreduce", tensors, tensors,
                 [op](ProcessGroup& g, const TensorList& t) { return g.allreduce(t, op); });
}

std::shared_ptr<Work> StreamOrderedGroup::broadcast(const TensorList& tensors, int root) {
  if (tensors.empty() || all_cpu(tensors)) {
    raise_async_error();
    wait_until_issued();
    return host_->broadcast(tensors, root);
  }
  return ordered("broadcast", tensors, tensors,
                 [root](ProcessGroup& g, const TensorList& t) { return g.broadcast(t, root); });
}

std::shared_ptr<Work> StreamOrderedGroup::allgather(const TensorList& outputs, const Tensor& input) {
  TensorList all = outputs;
  all.push_back(input);
  if (all_cpu(all)) {
    raise_async_error();
    wait_until_issued();
    return host_->allgather(outputs, input);
  }
  const size_t n = outputs.size();
  return ordered("allgather", all, outputs, [n](ProcessGroup& g, const TensorList& t) {
    return g.allgather(TensorList(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)), t[n]);
  });
}

std::shared_ptr<Work> StreamOrderedGroup::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op) {
  TensorList all{output};
  all.insert(all.end(), inputs.begin(), inputs.end());
  if (all_cpu(all)) {
    raise_async_error();
    wait_until_issued();
    return host_->reduce_scatter(output, inputs, op);
  }
  return ordered("reduce_scatter", all, {output}, [op](ProcessGroup& g, const TensorList& t) {
    return g.reduce_scatter(t[0], TensorList(t.begin() + 1, t.end()), op);
  });
}

std::shared_ptr<Work> StreamOrderedGroup::barrier() {
  raise_async_error();
  wait_until_issued();
  return host_->barrier();
}

std::shared_ptr<Work> StreamOrderedGroup::send(const Tensor& tensor, int dst, int tag) {
  if (tensor.device().is_cpu()) {
    raise_async_error();
    wait_until_issued();
    return host_->send(tensor, dst, tag);
  }
  return ordered("send", {tensor}, {tensor}, [dst, tag](ProcessGroup& g, const TensorList& t) { return g.send(t[0], dst, tag); },
                 Lane::Send, /*writes=*/false);
}

std::shared_ptr<Work> StreamOrderedGroup::recv(const Tensor& tensor, int src, int tag) {
  if (tensor.device().is_cpu()) {
    raise_async_error();
    wait_until_issued();
    return host_->recv(tensor, src, tag);
  }
  return ordered("recv", {tensor}, {tensor}, [src, tag](ProcessGroup& g, const TensorList& t) { return g.recv(t[0], src, tag); },
                 Lane::Recv);
}

}  // namespace chorus::distributed
