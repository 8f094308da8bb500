// ProcessGroupNCCL (see nccl.h): NCCL calls on the communication stream, ordered by events, with a
// watchdog for timeouts and asynchronous errors. CPU tensors go to a Gloo group.
#include "distributed/nccl.h"

#include <nccl.h>

#include <atomic>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "distributed/gloo.h"
#include "distributed/init.h"
#include "distributed/stream_group.h"
#include "tensor/caching_allocator.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus::distributed {
namespace {

void check_nccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) fail("NCCL error in {}: {} ({})", call, ncclGetErrorString(r), static_cast<int>(r));
}
#define CHORUS_NCCL(call) check_nccl((call), #call)

ncclDataType_t nccl_dtype(DType d, const char* op) {
  switch (d) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::UInt8:
    case DType::Bool: return ncclUint8;
  }
  fail("ProcessGroupNCCL {}: dtype {} is not supported", op, dtype_name(d));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, NcclOptions options)
      : ProcessGroup(rank, size), store_(std::move(store)), options_(options) {
    runtime_for(Device::cuda(current_device_index(DeviceType::CUDA)), "ProcessGroupNCCL");  // "no CUDA device"
    GlooOptions gloo;
    gloo.timeout = options.timeout;
    cpu_ = std::make_shared<ProcessGroupGloo>(std::make_shared<PrefixStore>("cpu", store_), rank, size, gloo);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~ProcessGroupNCCL() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    for (auto& [device, c] : comms_) ncclCommDestroy(c.comm);
  }

  std::string backend_name() const override { return "nccl"; }

  std::shared_ptr<Work> allreduce(const TensorList& tensors, ReduceOp op) override {
    if (on_cpu(tensors)) return cpu_->allreduce(tensors, op);
    return launch("allreduce", tensors, tensors, [op](const TensorList& t, ncclComm_t comm, cudaStream_t s) {
      for (const Tensor& x : t) {
        CHORUS_NCCL(ncclAllReduce(x.raw_data_ptr(), x.raw_data_ptr(), static_cast<size_t>(x.numel()),
                                  nccl_dtype(x.dtype(), "allreduce"), nccl_op(op), comm, s));
      }
    });
  }
  std::shared_ptr<Work> broadcast(const TensorList& tensors, int root) override {
    if (on_cpu(tensors)) return cpu_->broadcast(tensors, root);
    return launch("broadcast", tensors, tensors, [root](const TensorList& t, ncclComm_t comm, cudaStream_t s) {
      for (const Tensor& x : t) {
        CHORUS_NCCL(ncclBroadcast(x.raw_data_ptr(), x.raw_data_ptr(), static_cast<size_t>(x.numel()),
                                  nccl_dtype(x.dtype(), "broadcast"), root, comm, s));
      }
    });
  }
  std::shared_ptr<Work> allgather(const TensorList& outputs, const Tensor& input) override {
    TensorList all = outputs;
    all.push_back(input);
    if (on_cpu(all)) return cpu_->allgather(outputs, input);
    const size_t n = outputs.size();
    return launch("allgather", all, outputs, [n](const TensorList& t, ncclComm_t comm, cudaStream_t s) {
      const Tensor& in = t[n];
      const size_t count = static_cast<size_t>(in.numel());
      // Output r receives rank r's input: a send to and a receive from every rank, in one group.
      for (size_t r = 0; r < n; ++r) {
        CHORUS_NCCL(ncclSend(in.raw_data_ptr(), count, nccl_dtype(in.dtype(), "allgather"), static_cast<int>(r), comm, s));
        CHORUS_NCCL(ncclRecv(t[r].raw_data_ptr(), count, nccl_dtype(in.dtype(), "allgather"), static_cast<int>(r), comm, s));
      }
    });
  }
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op) override {
    TensorList all{output};
    all.insert(all.end(), inputs.begin(), inputs.end());
    if (on_cpu(all)) return cpu_->reduce_scatter(output, inputs, op);
    // ncclReduceScatter wants the inputs back to back: stack them on the device first (ordered on
    // the caller's stream, before the ready event).
    Tensor flat = stack(inputs).contiguous();
    TensorList args{output, flat};
    return launch("reduce_scatter", args, {output}, [op](const TensorList& t, ncclComm_t comm, cudaStream_t s) {
      CHORUS_NCCL(ncclReduceScatter(t[1].raw_data_ptr(), t[0].raw_data_ptr(), static_cast<size_t>(t[0].numel()),
                                    nccl_dtype(t[0].dtype(), "reduce_scatter"), nccl_op(op), comm, s));
    });
  }
  std::shared_ptr<Work> barrier() override { return cpu_->barrier(); }
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag) override {
    if (tensor.device().is_cpu()) return cpu_->send(tensor, dst, tag);
    return launch("send", {tensor}, {tensor}, [dst](const TensorList& t, ncclComm_t comm, cudaStream_t s) {
      CHORUS_NCCL(ncclSend(t[0].raw_data_ptr(), static_cast<size_t>(t[0].numel()), nccl_dtype(t[0].dtype(), "send"),
                           dst, comm, s));
    });
  }
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag) override {
    if (tensor.device().is_cpu()) return cpu_->recv(tensor, src, tag);
    return launch("recv", {tensor}, {tensor}, [src](const TensorList& t, ncclComm_t comm, cudaStream_t s) {
      CHORUS_NCCL(ncclRecv(t[0].raw_data_ptr(), static_cast<size_t>(t[0].numel()), nccl_dtype(t[0].dtype(), "recv"),
                           src, comm, s));
    });
  }

 private:
  struct Comm {
    ncclComm_t comm = nullptr;
    Stream stream{Device::cuda(0), nullptr};
  };
  struct InFlight {
    std::shared_ptr<StreamWork> work;
    Device device;
    std::chrono::steady_clock::time_point started;
  };

  bool on_cpu(const TensorList& tensors) const {
    for (const Tensor& t : tensors)
      if (t.defined() && !t.device().is_cpu()) return false;
    return true;
  }

  // The device's communicator and communication stream, made at first use: rank 0 publishes a
  // unique id in the store, every rank joins with it.
  Comm& comm_for(Device device) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    auto it = comms_.find(device.index);
    if (it != comms_.end()) return it->second;
    const std::string key = fmt::format("nccl_unique_id_{}", device.index);
    ncclUniqueId id{};
    if (rank_ == 0) {
      CHORUS_NCCL(ncclGetUniqueId(&id));
      store_->set(key, Bytes(reinterpret_cast<const uint8_t*>(&id), reinterpret_cast<const uint8_t*>(&id) + sizeof(id)));
    } else {
      const Bytes b = store_->get(key);
      if (b.size() != sizeof(id)) fail("ProcessGroupNCCL: malformed NCCL unique id in the store ({} bytes)", b.size());
      std::memcpy(&id, b.data(), sizeof(id));
    }
    DeviceGuard guard(device);
    Comm c;
    CHORUS_NCCL(ncclCommInitRank(&c.comm, size_, id, rank_));
    c.stream = stream_from_pool(device, /*high_priority=*/true);
    return comms_.emplace(device.index, c).first->second;
  }

  std::shared_ptr<Work> launch(const std::string& name, const TensorList& tensors, TensorList outputs,
                               const std::function<void(const TensorList&, ncclComm_t, cudaStream_t)>& call) {
    raise_async_error();
    const Device device = tensors.front().device();
    for (const Tensor& t : tensors) {
      if (t.device() != device || !t.device().is_cuda()) {
        fail("ProcessGroupNCCL {}: expected CUDA tensors on one device, got {} and {}", name, device.str(),
             t.device().str());
      }
      if (!t.is_contiguous()) fail("ProcessGroupNCCL {}: tensors must be contiguous", name);
    }
    DeviceGuard guard(device);
    Comm& c = comm_for(device);
    Event ready;
    ready.record(current_stream(device));  // [Sync Streams]
    c.stream.wait(ready);
    const uint64_t seq = ++sequence_;
    auto work = std::make_shared<StreamWork>(
        fmt::format("ProcessGroupNCCL {} (sequence number {}, rank {} of {}, timeout {} ms) on {}", name, seq, rank_,
                    size_, options_.timeout.count(), device.str()),
        device, std::move(outputs));
    CHORUS_NCCL(ncclGroupStart());
    call(tensors, c.comm, static_cast<cudaStream_t>(c.stream.handle()));
    CHORUS_NCCL(ncclGroupEnd());
    work->end_event().record(c.stream);
    // Inputs and outputs stay allocated until the collective ends: the caching allocator does not
    // reuse their blocks before the communication stream passes this point.
    for (const Tensor& t : tensors) record_stream(t.storage(), c.stream);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_.push_back({work, device, std::chrono::steady_clock::now()});
    }
    cv_.notify_all();
    return work;
  }

  void raise_async_error() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) fail("{}", failure_);
  }

  // The watchdog: completes works whose end event has passed; aborts on timeout or async error.
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(in_flight_.empty() ? 1000 : 2));
      std::vector<InFlight> still;
      for (InFlight& f : in_flight_) {
        if (f.work->end_event().query()) {
          f.work->finish({});
          continue;
        }
        ncclResult_t async = ncclSuccess;
        ncclComm_t comm = nullptr;
        {
          std::lock_guard<std::mutex> comm_lock(comm_mutex_);
          if (comms_.count(f.device.index)) comm = comms_[f.device.index].comm;
        }
        if (comm) ncclCommGetAsyncError(comm, &async);
        const bool timed_out = std::chrono::steady_clock::now() - f.started > options_.timeout;
        if (timed_out || async != ncclSuccess) {
          const std::string why = timed_out ? fmt::format("timed out after {} ms", options_.timeout.count())
                                            : fmt::format("NCCL asynchronous error: {}", ncclGetErrorString(async));
          failure_ = fmt::format("{} failed: {}; the communicator was aborted", f.work->description(), why);
          if (comm) ncclCommAbort(comm);
          {
            std::lock_guard<std::mutex> comm_lock(comm_mutex_);
            comms_.erase(f.device.index);
          }
          f.work->finish({}, std::make_exception_ptr(Error(failure_)));
          continue;
        }
        still.push_back(f);
      }
      in_flight_.swap(still);
    }
  }

  std::shared_ptr<Store> store_;
  NcclOptions options_;
  std::shared_ptr<ProcessGroup> cpu_;
  std::mutex comm_mutex_;
  std::map<int, Comm> comms_;
  std::atomic<uint64_t> sequence_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<InFlight> in_flight_;
  std::string failure_;
  bool stop_ = false;
  std::thread watchdog_;
};

const bool g_registered = [] {
  register_backend("nccl", [](std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout) {
    return make_process_group_nccl(std::move(store), rank, size, {.timeout = timeout});
  });
  return true;
}();

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store> store, int rank, int size,
                                                      NcclOptions options) {
  return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, options);
}

}  // namespace chorus::distributed
