// StreamOrderedGroup: see stream_group.h for the ordering rule ([Sync Streams]).
#include "distributed/stream_group.h"

#include <atomic>
#include <condition_variable>
#include <map>

#include "tensor/caching_allocator.h"
#include "tensor/ops.h"

namespace chorus::distributed {
namespace {

std::atomic<bool> g_skip_waits{false};

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

StreamOrderedGroup::StreamOrderedGroup(std::shared_ptr<ProcessGroup> host)
    : ProcessGroup(host->rank(), host->size()), host_(std::move(host)) {}

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

// Collectives reach the host communicator in the order the caller issued them, on every rank: a
// CPU collective issued after device collectives waits (on the host) until the communication
// streams have handed those to the communicator. Otherwise ranks whose streams run at different
// speeds would pair different collectives.
namespace {
struct IssueOrder {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t submitted = 0, issued = 0;
};
IssueOrder& issue_order(const void* group) {
  static std::mutex m;
  static std::map<const void*, std::unique_ptr<IssueOrder>>* orders = new std::map<const void*, std::unique_ptr<IssueOrder>>();
  std::lock_guard<std::mutex> lock(m);
  auto& slot = (*orders)[group];
  if (!slot) slot = std::make_unique<IssueOrder>();
  return *slot;
}
void wait_until_issued(const void* group) {
  IssueOrder& o = issue_order(group);
  std::unique_lock<std::mutex> lock(o.mutex);
  if (o.issued == o.submitted) return;
  note_host_sync();
  o.cv.wait(lock, [&] { return o.issued == o.submitted; });
}
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
    std::function<std::shared_ptr<Work>(ProcessGroup&, const TensorList&)> collective, Lane lane) {
  raise_async_error();
  const Device device = tensors.front().device();
  for (const Tensor& t : tensors) {
    if (t.device() != device) {
      fail("ProcessGroup {} {}: expected all tensors on one device, got {} and {}", backend_name(), name,
           device.str(), t.device().str());
    }
  }
  if (device.is_cuda()) {
    fail("ProcessGroup {} {}: CUDA tensors need the NCCL backend or host staging through Gloo, which this build of "
         "chorus does not have yet; use CPU or sim tensors",
         backend_name(), name);
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
  for (const Tensor& t : tensors) {
    aliases.push_back(host_alias(t));
    keep.push_back(alias_without_history(t));
    buffers.push_back(t.storage()->data());
  }
  IssueOrder* order = &issue_order(this);
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
  work->end_event().record(comm);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(work);
  }
  // The caller may drop its tensors at once: their blocks are not reused before `comm` passes here.
  for (const Tensor& t : tensors) record_stream(t.storage(), comm);
  return work;
}

std::shared_ptr<Work> StreamOrderedGroup::allreduce(const TensorList& tensors, ReduceOp op) {
  if (tensors.empty() || all_cpu(tensors)) {
    raise_async_error();
    wait_until_issued(this);
    return host_->allreduce(tensors, op);
  }
  return ordered("allreduce", tensors, tensors,
                 [op](ProcessGroup& g, const TensorList& t) { return g.allreduce(t, op); });
}

std::shared_ptr<Work> StreamOrderedGroup::broadcast(const TensorList& tensors, int root) {
  if (tensors.empty() || all_cpu(tensors)) {
    raise_async_error();
    wait_until_issued(this);
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
    wait_until_issued(this);
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
    wait_until_issued(this);
    return host_->reduce_scatter(output, inputs, op);
  }
  return ordered("reduce_scatter", all, {output}, [op](ProcessGroup& g, const TensorList& t) {
    return g.reduce_scatter(t[0], TensorList(t.begin() + 1, t.end()), op);
  });
}

std::shared_ptr<Work> StreamOrderedGroup::barrier() {
  raise_async_error();
  wait_until_issued(this);
  return host_->barrier();
}

std::shared_ptr<Work> StreamOrderedGroup::send(const Tensor& tensor, int dst, int tag) {
  if (tensor.device().is_cpu()) {
    raise_async_error();
    wait_until_issued(this);
    return host_->send(tensor, dst, tag);
  }
  return ordered("send", {tensor}, {tensor}, [dst, tag](ProcessGroup& g, const TensorList& t) { return g.send(t[0], dst, tag); },
                 Lane::Send);
}

std::shared_ptr<Work> StreamOrderedGroup::recv(const Tensor& tensor, int src, int tag) {
  if (tensor.device().is_cpu()) {
    raise_async_error();
    wait_until_issued(this);
    return host_->recv(tensor, src, tag);
  }
  return ordered("recv", {tensor}, {tensor}, [src, tag](ProcessGroup& g, const TensorList& t) { return g.recv(t[0], src, tag); },
                 Lane::Recv);
}

}  // namespace chorus::distributed
