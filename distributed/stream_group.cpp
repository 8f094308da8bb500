// StreamOrderedGroup: see stream_group.h for the ordering rule ([Sync Streams]) and the watchdog.
#include "distributed/stream_group.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <thread>

#include "distributed/gloo.h"
#include "distributed/gloo_communicator.h"
#include "tensor/caching_allocator.h"
#include "tensor/fault.h"
#include "tensor/ops.h"
#include "tensor/stream_sanitizer.h"

namespace chorus::distributed {
namespace {

bool all_cpu(const TensorList& tensors) {
  for (const Tensor& t : tensors)
    if (t.defined() && !t.device().is_cpu()) return false;
  return true;
}

// How often the watchdog looks at the works in flight (and so how soon after its end event a work
// reports completion to is_completed() and then() callbacks; Work::wait() does not depend on it).
constexpr auto kWatchdogPoll = std::chrono::milliseconds(1);

}  // namespace

// ---------------------------------------------------------------------------------------------
// StreamWork

StreamWork::StreamWork(std::string description, Device device, TensorList outputs)
    : Work(std::move(description)), device_(device), outputs_(std::move(outputs)) {}

void StreamWork::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (timeout) {
    Work::wait(timeout);  // a bounded wait is a host wait, by definition
    return;
  }
  // [Sync Streams] the caller's current stream, whichever it is, waits (not the default stream).
  if (!fault::removed(fault::Point::kEndWait)) {
    (fault::removed(fault::Point::kCallerStream) ? default_stream(device_) : current_stream(device_)).wait(end_);
  }
  if (is_completed()) {
    if (auto error = exception()) std::rethrow_exception(error);
  }
}

void StreamWork::synchronize() {
  note_host_sync();
  Work::wait();
}

double StreamWork::elapsed_ms() const {
  if (!is_completed()) fail("{}: elapsed_ms() before the work has completed", description());
  return start_.elapsed_time(end_);
}

void StreamWork::note_error(std::exception_ptr error) {
  // The message is read here, by the thread that caught the error while the failed work is still
  // alive: an exception object's reference count lives in libstdc++ (not instrumented), so a
  // watchdog reading what() while the backend's thread drops the last reference would look like a
  // race to ThreadSanitizer; a string copied under this mutex is plainly ordered.
  std::string message;
  try {
    if (error) std::rethrow_exception(error);
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "an unknown error";
  }
  std::lock_guard<std::mutex> lock(note_mutex_);
  if (!noted_) {
    noted_ = error;
    noted_message_ = std::move(message);
  }
}

std::optional<std::string> StreamWork::noted_message() const {
  std::lock_guard<std::mutex> lock(note_mutex_);
  if (!noted_) return std::nullopt;
  return noted_message_;
}

std::exception_ptr StreamWork::noted_error() const {
  std::lock_guard<std::mutex> lock(note_mutex_);
  return noted_;
}

void StreamWork::add_outputs(const TensorList& outputs) { outputs_.insert(outputs_.end(), outputs.begin(), outputs.end()); }

// ---------------------------------------------------------------------------------------------
// StreamOrderedGroup


StreamOrderedGroup::StreamOrderedGroup(std::shared_ptr<ProcessGroup> cpu, DeviceCommunicators devices,
                                       std::chrono::milliseconds timeout, std::string name)
    : ProcessGroup(cpu ? cpu->rank() : 0, cpu ? cpu->size() : 1),
      cpu_(std::move(cpu)),
      devices_(std::move(devices)),
      timeout_(timeout),
      name_(std::move(name)) {
  if (!cpu_) fail("StreamOrderedGroup: the CPU process group is null");
  for (const auto& [type, comm] : devices_) {
    if (!comm) fail("StreamOrderedGroup: the communicator for {} tensors is null", device_type_name(type));
  }
  watchdog_ = std::thread([this] { watch(); });
}

namespace {
StreamOrderedGroup::DeviceCommunicators gloo_everywhere(const std::shared_ptr<ProcessGroup>& host) {
  auto comm = std::make_shared<GlooStreamCommunicator>(host);
  return {{DeviceType::Sim, comm}, {DeviceType::CUDA, comm}};
}
}  // namespace

StreamOrderedGroup::StreamOrderedGroup(std::shared_ptr<ProcessGroupGloo> host)
    : StreamOrderedGroup(host, gloo_everywhere(host), host ? host->timeout() : std::chrono::milliseconds(0), "gloo") {}

StreamOrderedGroup::~StreamOrderedGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  // [A destroyed group ends its works as the watchdog would] Works still in flight finish when
  // their collectives do; the communicators (and their stream tasks' state) outlive this, being
  // shared. Each is polled up to the group's timeout from its issue (the watchdog's clock), and an
  // error its communicator reports (NCCL's async error) or its device raises ends the wait at once.
  // The first failure aborts its communicator, as the watchdog does: a Gloo collective ends at
  // Gloo's own timeout, but an NCCL kernel waiting for a peer that is gone runs until its
  // communicator is aborted, so a synchronize alone would never return (written for NCCL; not yet
  // run on a GPU, docs/gpu.md); and a later group of another device that waits for this one's turn
  // to reach Gloo (gloo_communicator.cpp, [Collectives reach Gloo in the order they were issued])
  // would hold its end event forever. Every later work then fails naming that failure, with its
  // communicator aborted too, as the watchdog fails the rest of a failed group: none is reported
  // a success over an aborted communicator. fault::Point::kGroupDestroyAborts removes the timeout
  // and the error checks (a plain synchronize, as before 2026-12-05; stream_group_test).
  std::optional<std::string> cause;
  auto abort_quietly = [](InFlight& f, const std::string& why) {
    try {
      f.communicator->abort(why);
    } catch (...) {
    }
  };
  auto finish_quietly = [](InFlight& f, std::exception_ptr error) {
    try {
      f.work->finish({}, std::move(error));
    } catch (...) {
    }
  };
  const bool checked = !fault::removed(fault::Point::kGroupDestroyAborts);
  for (InFlight& f : in_flight_) {
    if (cause) {
      abort_quietly(f, *cause);
      finish_quietly(f, std::make_exception_ptr(Error(fmt::format(
                            "{} was aborted: an earlier collective of the group failed ({})", f.work->description(), *cause))));
      continue;
    }
    std::string why;
    try {
      while (checked && !f.work->end_event().query()) {
        if (std::optional<std::string> error = f.communicator->async_error()) {
          why = *error;
          break;
        }
        if (std::chrono::steady_clock::now() - f.issued > timeout_) {
          why = fmt::format("timed out after {} ms", timeout_.count());
          break;
        }
        std::this_thread::sleep_for(kWatchdogPoll);
      }
      if (why.empty()) {
        f.work->end_event().synchronize();
        if (std::optional<std::string> noted = f.work->noted_message()) {
          why = *noted;
        } else {
          finish_quietly(f, nullptr);
          continue;
        }
      }
    } catch (const DeviceUnloading&) {
      // The process is exiting and the runtime has unloaded: counted as finished, as the watchdog does.
      finish_quietly(f, nullptr);
      continue;
    } catch (const std::exception& e) {
      why = fmt::format("the device reported an error: {}", e.what());
    } catch (...) {
      why = "the device reported an error";
    }
    cause = fmt::format("{} failed on the communication stream as the group was destroyed: {}", f.work->description(), why);
    abort_quietly(f, *cause);
    finish_quietly(f, std::make_exception_ptr(Error(*cause)));
  }
}

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

Communicator& StreamOrderedGroup::communicator(Device device, const std::string& op) {
  for (const auto& [type, comm] : devices_)
    if (type == device.type) return *comm;
  std::vector<std::string> have{"cpu"};
  for (const auto& [type, comm] : devices_) have.push_back(device_type_name(type));
  fail("ProcessGroup {} {}: no backend for {} tensors in this group (it has one for: {}); use backend \"gloo\" or a "
       "spec naming one, e.g. \"cpu:gloo,{}:gloo\"",
       name_, op, device_type_name(device.type), fmt::join(have, ", "), device_type_name(device.type));
}

void StreamOrderedGroup::raise_async_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) fail("{}", failure_);
}

void StreamOrderedGroup::before_cpu_op() {
  raise_async_error();
  if (coalescing_) {
    if (!pending_.empty()) {
      fail("ProcessGroup {}: a coalesced group mixes CPU and device tensors; coalesce each kind on its own", name_);
    }
    cpu_in_group_ = true;
  }
  for (const auto& [type, comm] : devices_) comm->wait_until_issued();
}

void StreamOrderedGroup::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (in_flight_.empty()) {
      cv_.wait(lock, [&] { return stop_ || !in_flight_.empty(); });
      continue;
    }
    cv_.wait_for(lock, kWatchdogPoll);
    std::vector<InFlight> done, still;
    std::vector<std::pair<InFlight, std::string>> failed;
    const auto now = std::chrono::steady_clock::now();
    for (InFlight& f : in_flight_) {
      // A device error (CUDA's sticky errors after a kernel fault; sim's injected stream failure)
      // makes the query itself fail: the collective will never finish, whatever the peers do.
      std::optional<std::string> device_error;
      bool passed = false;
      try {
        passed = f.work->end_event().query();
      } catch (const DeviceUnloading&) {
        // The process is exiting and the runtime has unloaded (a group destroyed in static
        // destruction): the work can no longer be observed; counted as finished, as PyTorch's
        // watchdog does on "driver shutting down", not as a failure to report.
        passed = true;
      } catch (const std::exception& e) {
        device_error = fmt::format("the device reported an error: {}", e.what());
      }
      if (device_error) {
        failed.emplace_back(f, *device_error);
      } else if (passed) {
        done.push_back(f);
      } else if (now - f.issued > timeout_) {
        failed.emplace_back(f, fmt::format("timed out after {} ms", timeout_.count()));
      } else {
        still.push_back(f);
      }
    }
    in_flight_.swap(still);
    lock.unlock();
    // Outside the lock: callbacks run here, and communicators are polled.
    for (InFlight& f : done) {
      if (std::optional<std::string> why = f.work->noted_message()) {
        failed.emplace_back(f, *why);
        continue;
      }
      f.work->finish({});
    }
    if (failed.empty()) {
      // Asynchronous errors the backend reports per communicator (NCCL).
      lock.lock();
      std::vector<InFlight> polled = in_flight_;
      lock.unlock();
      for (InFlight& f : polled) {
        if (auto why = f.communicator->async_error()) {
          failed.emplace_back(f, *why);
          break;
        }
      }
    }
    for (auto& [f, why] : failed) {
      const std::string message = fmt::format("{} failed on the communication stream: {}", f.work->description(), why);
      bool first = false;
      {
        std::lock_guard<std::mutex> guard(mutex_);
        if (failure_.empty()) {
          failure_ = message;
          first = true;
        }
      }
      // Said at once, as PyTorch's watchdog logs it: the caller's thread may be busy (or stuck in a
      // device call) long before it calls into the group again and sees the error.
      if (first) std::fprintf(stderr, "[rank %d] watchdog: %s; aborting the communicator\n", rank_, message.c_str());
      f.communicator->abort(message);
      f.work->finish({}, std::make_exception_ptr(Error(message)));
    }
    if (!failed.empty()) {
      // Everything else in flight on a failed group is failed too (its communicator is aborted).
      lock.lock();
      std::vector<InFlight> rest;
      rest.swap(in_flight_);
      lock.unlock();
      // Each names the failure that aborted it: whoever waits on a later collective learns why.
      const std::string cause = fmt::format("{} failed on the communication stream: {}",
                                            failed.front().first.work->description(), failed.front().second);
      for (InFlight& f : rest) {
        f.work->finish({}, std::make_exception_ptr(Error(fmt::format(
                               "{} was aborted: an earlier collective of the group failed ({})", f.work->description(), cause))));
      }
    }
    lock.lock();
  }
}

std::shared_ptr<StreamWork> StreamOrderedGroup::launch(const std::string& name, Device device, Lane lane,
                                                       std::vector<PendingOp> ops, std::shared_ptr<StreamWork> work) {
  Communicator& comm = communicator(device, name);
  DeviceGuard device_guard(device);
  const Stream stream = comm_stream(device, lane);
  // [Sync Streams] the collective reads what the caller's stream has written so far.
  if (!fault::removed(fault::Point::kReadyWait)) {
    Event ready;
    ready.record(fault::removed(fault::Point::kCallerStream) ? default_stream(device) : current_stream(device));
    stream.wait(ready);
  }
  work->start_event().record(stream);
  // What each op reads and writes on the communication stream, for the stream-order sanitizer (one
  // launch for the group: its ops run as one on the stream). Checked before the communicator takes
  // any op, so that a report stops the group before its copies run (an unordered collective must
  // not touch memory another stream is using, on sim as under a real race); recorded after it took
  // them (an op it refused touched nothing), before the end event (whose clock must include them).
  const bool sanitized = stream_sanitizer::active(device.type);
  std::vector<stream_sanitizer::Access> accesses;
  if (sanitized) {
    for (const PendingOp& op : ops) {
      for (const Tensor& t : op.tensors) {
        bool written = false;
        for (const Tensor& o : op.written) written = written || (o.raw_data_ptr() == t.raw_data_ptr() && o.numel() == t.numel());
        accesses.push_back(stream_sanitizer::access_of(t, written));
      }
    }
    stream_sanitizer::check_launch(name.c_str(), device, stream.handle(), accesses);
  }
  // The caller may drop its tensors at once: their blocks are not reused before `stream` passes
  // where this is called.
  auto hold_tensors = [&] {
    if (fault::removed(fault::Point::kGroupRecordStream)) return;
    // (Device memory from from_blob is the caller's to keep alive, as in the engine: record_stream
    // refuses it, and refused here, after the group was issued, the caller got an error for a
    // collective that still ran, with no end event to wait for, and a failing group's error path
    // threw before group_end, leaving the communicator's group open.)
    for (const PendingOp& op : ops)
      for (const Tensor& t : op.tensors)
        if (from_caching_allocator(t.storage())) record_stream(t.storage(), stream);
  };
  comm.group_start();
  try {
    for (PendingOp& op : ops) op.call(comm, stream, work);
  } catch (...) {
    // [A group that fails partway] An op that throws after earlier ops of the group were taken
    // (NCCL: queued in the open group, and launched by its ncclGroupEnd below) leaves those running
    // on `stream` with no end event for anyone to wait for. So, as a launch that succeeds: the
    // tensors' blocks are held until `stream` passes here, and the caller's stream waits for it,
    // before the error goes up. (Gloo checks every op before taking any, so its groups never get
    // here with work queued; a NCCL op's checks run as it is issued. Found by a read-only audit,
    // 2026-12-04.)
    hold_tensors();
    comm.group_end();
    Event issued;
    issued.record(stream);
    current_stream(device).wait(issued);
    throw;
  }
  comm.group_end();
  if (sanitized) stream_sanitizer::on_launch(name.c_str(), device, stream.handle(), accesses);
  work->end_event().record(stream);
  hold_tensors();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back({work, &comm, std::chrono::steady_clock::now()});
  }
  cv_.notify_all();
  return work;
}

std::shared_ptr<Work> StreamOrderedGroup::device_op(const std::string& name, const TensorList& tensors,
                                                    const TensorList& outputs, Lane lane, Call call, bool reads_only) {
  raise_async_error();
  const Device device = tensors.front().device();
  for (const Tensor& t : tensors) {
    if (!t.defined()) fail("ProcessGroup {} {}: got an undefined tensor", name_, name);
    if (t.device() != device) {
      fail("ProcessGroup {} {}: expected all tensors on one device, got {} and {}", name_, name, device.str(),
           t.device().str());
    }
  }
  communicator(device, name);  // a clear error now, not at launch
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seq = ++sequence_;
  }
  if (coalescing_) {
    if (cpu_in_group_) {
      fail("ProcessGroup {} {}: a coalesced group mixes CPU and device tensors; coalesce each kind on its own", name_,
           name);
    }
    if (pending_work_ && pending_work_->device() != device) {
      fail("ProcessGroup {} {}: a coalesced group must stay on one device, got {} after {}", name_, name, device.str(),
           pending_work_->device().str());
    }
    if (!pending_work_) {
      pending_work_ = std::make_shared<StreamWork>(
          fmt::format("{} coalesced group from #{} on {} (rank {} of {}, timeout {} ms)", name_, seq, device.str(), rank_,
                      size_, timeout_.count()),
          device, TensorList{});
    }
    pending_work_->add_outputs(outputs);
    pending_.push_back({name, tensors, reads_only ? TensorList{} : outputs, std::move(call)});
    return pending_work_;
  }
  auto work = std::make_shared<StreamWork>(fmt::format("{} {} #{} on {} (rank {} of {}, timeout {} ms)", name_, name, seq,
                                                       device.str(), rank_, size_, timeout_.count()),
                                           device, outputs);
  std::vector<PendingOp> ops;
  ops.push_back({name, tensors, reads_only ? TensorList{} : outputs, std::move(call)});
  return launch(name, device, lane, std::move(ops), work);
}

void StreamOrderedGroup::start_coalescing() {
  raise_async_error();
  ProcessGroup::start_coalescing();
  cpu_->start_coalescing();
  cpu_in_group_ = false;
}

std::shared_ptr<Work> StreamOrderedGroup::end_coalescing() {
  ProcessGroup::end_coalescing();  // checks that start_coalescing() ran; device ops are tracked below
  std::shared_ptr<Work> cpu_work = cpu_->end_coalescing();
  std::vector<PendingOp> ops;
  ops.swap(pending_);
  std::shared_ptr<StreamWork> work;
  work.swap(pending_work_);
  if (!work) return cpu_work;
  return launch("coalesced group", work->device(), Lane::Collective, std::move(ops), work);
}

std::shared_ptr<Work> StreamOrderedGroup::allreduce(const TensorList& tensors, ReduceOp op) {
  if (tensors.empty() || all_cpu(tensors)) {
    before_cpu_op();
    return cpu_->allreduce(tensors, op);
  }
  return device_op("allreduce", tensors, tensors, Lane::Collective,
                   [tensors, op](Communicator& c, const Stream& s, const std::shared_ptr<StreamWork>& w) {
                     c.allreduce(tensors, op, s, w);
                   });
}

std::shared_ptr<Work> StreamOrderedGroup::broadcast(const TensorList& tensors, int root) {
  if (tensors.empty() || all_cpu(tensors)) {
    before_cpu_op();
    return cpu_->broadcast(tensors, root);
  }
  // Checked here, not first on the lane worker: there every rank would take itself for a non-root
  // and its tensors for outputs only (gloo_communicator.cpp), and the refusal would leave them
  // undefined.
  if (root < 0 || root >= size_) {
    fail("ProcessGroup {} broadcast: root {} is not a rank of a group of size {}", name_, root, size_);
  }
  return device_op("broadcast", tensors, tensors, Lane::Collective,
                   [tensors, root](Communicator& c, const Stream& s, const std::shared_ptr<StreamWork>& w) {
                     c.broadcast(tensors, root, s, w);
                   });
}

std::shared_ptr<Work> StreamOrderedGroup::allgather(const TensorList& outputs, const Tensor& input) {
  TensorList all = outputs;
  all.push_back(input);
  if (all_cpu(all)) {
    before_cpu_op();
    return cpu_->allgather(outputs, input);
  }
  if (static_cast<int>(outputs.size()) != size_) {
    fail("ProcessGroup {} allgather: expected {} output tensors (one per rank), got {}", name_, size_, outputs.size());
  }
  for (const Tensor& o : outputs) {
    if (o.sizes() != input.sizes() || o.dtype() != input.dtype()) {
      fail("ProcessGroup {} allgather: every output must match the input ({} {}), got {} {}", name_,
           shape_str(input.sizes()), dtype_name(input.dtype()), shape_str(o.sizes()), dtype_name(o.dtype()));
    }
  }
  return device_op("allgather", all, outputs, Lane::Collective,
                   [outputs, input](Communicator& c, const Stream& s, const std::shared_ptr<StreamWork>& w) {
                     c.allgather(outputs, input, s, w);
                   });
}

std::shared_ptr<Work> StreamOrderedGroup::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op) {
  TensorList all{output};
  all.insert(all.end(), inputs.begin(), inputs.end());
  if (all_cpu(all)) {
    before_cpu_op();
    return cpu_->reduce_scatter(output, inputs, op);
  }
  if (static_cast<int>(inputs.size()) != size_) {
    fail("ProcessGroup {} reduce_scatter: expected {} input tensors (one per rank), got {}", name_, size_, inputs.size());
  }
  for (const Tensor& i : inputs) {
    if (i.sizes() != output.sizes() || i.dtype() != output.dtype()) {
      fail("ProcessGroup {} reduce_scatter: every input must match the output ({} {}), got {} {}", name_,
           shape_str(output.sizes()), dtype_name(output.dtype()), shape_str(i.sizes()), dtype_name(i.dtype()));
    }
  }
  return device_op("reduce_scatter", all, {output}, Lane::Collective,
                   [output, inputs, op](Communicator& c, const Stream& s, const std::shared_ptr<StreamWork>& w) {
                     c.reduce_scatter(output, inputs, op, s, w);
                   });
}

std::shared_ptr<Work> StreamOrderedGroup::all_to_all(const TensorList& outputs, const TensorList& inputs) {
  TensorList all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  if (all_cpu(all)) {
    before_cpu_op();
    return cpu_->all_to_all(outputs, inputs);
  }
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_) {
    fail("ProcessGroup {} all_to_all: expected {} input and {} output tensors (one per rank), got {} and {}", name_, size_,
         size_, inputs.size(), outputs.size());
  }
  for (const Tensor& t : all) {
    if (t.defined() && t.dtype() != inputs.front().dtype()) {
      fail("ProcessGroup {} all_to_all: every tensor must have the dtype of inputs[0] ({}), got {}", name_,
           dtype_name(inputs.front().dtype()), dtype_name(t.dtype()));
    }
  }
  return device_op("all_to_all", all, outputs, Lane::Collective,
                   [outputs, inputs](Communicator& c, const Stream& s, const std::shared_ptr<StreamWork>& w) {
                     c.all_to_all(outputs, inputs, s, w);
                   });
}

std::shared_ptr<Work> StreamOrderedGroup::barrier() {
  before_cpu_op();
  return cpu_->barrier();
}

std::shared_ptr<Work> StreamOrderedGroup::send(const Tensor& tensor, int dst, int tag) {
  if (tensor.device().is_cpu()) {
    before_cpu_op();
    return cpu_->send(tensor, dst, tag);
  }
  if (dst < 0 || dst >= size_ || dst == rank_) {
    fail("ProcessGroup {} send: destination {} is not another rank of a group of size {} (this is rank {})", name_, dst,
         size_, rank_);
  }
  return device_op("send", {tensor}, {tensor}, Lane::Send,
                   [tensor, dst, tag](Communicator& c, const Stream& s, const std::shared_ptr<StreamWork>& w) {
                     c.send(tensor, dst, tag, s, w);
                   },
                   /*reads_only=*/true);
}

std::shared_ptr<Work> StreamOrderedGroup::recv(const Tensor& tensor, int src, int tag) {
  if (tensor.device().is_cpu()) {
    before_cpu_op();
    return cpu_->recv(tensor, src, tag);
  }
  if (src < 0 || src >= size_ || src == rank_) {
    fail("ProcessGroup {} recv: source {} is not another rank of a group of size {} (this is rank {})", name_, src, size_,
         rank_);
  }
  return device_op("recv", {tensor}, {tensor}, Lane::Recv,
                   [tensor, src, tag](Communicator& c, const Stream& s, const std::shared_ptr<StreamWork>& w) {
                     c.recv(tensor, src, tag, s, w);
                   });
}

}  // namespace chorus::distributed
