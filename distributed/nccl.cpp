// ProcessGroupNCCL (see nccl.h): the NCCL communicator under the stream-ordered group, which owns
// the events, streams, Works and the watchdog (stream_group.h). CPU tensors go to a Gloo group.
#include "distributed/nccl.h"

#include <nccl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "distributed/gloo.h"
#include "distributed/init.h"
#include "distributed/communicator.h"
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

// Tensors NCCL reads or writes: contiguous CUDA tensors (the group has checked one device).
void check_cuda(const TensorList& tensors, const char* op) {
  for (const Tensor& t : tensors) {
    if (!t.device().is_cuda()) fail("ProcessGroupNCCL {}: expected CUDA tensors, got one on {}", op, t.device().str());
    if (!t.is_contiguous()) {
      fail("ProcessGroupNCCL {}: a {} tensor must be contiguous (got strides {} for shape {}); call .contiguous() first",
           op, t.device().str(), shape_str(t.strides()), shape_str(t.sizes()));
    }
  }
}

size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }
cudaStream_t cuda_stream(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

// NCCL under the stream-ordered group: one communicator per device, made at first use from a
// unique id rank 0 publishes in the group's store (so each new_group gets its own). Each call
// enqueues NCCL work on the given stream from the caller's thread.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Store> store, int rank, int size)
      : store_(std::move(store)), rank_(rank), size_(size) {
    runtime_for(Device::cuda(current_device_index(DeviceType::CUDA)), "ProcessGroupNCCL");  // "no CUDA device"
  }
  ~NcclCommunicator() override {
    for (auto& [device, comm] : comms_) ncclCommDestroy(comm);
  }
  std::string name() const override { return "nccl"; }

  void allreduce(const TensorList& tensors, ReduceOp op, const Stream& s, const std::shared_ptr<StreamWork>&) override {
    check_cuda(tensors, "allreduce");
    ncclComm_t c = comm(s.device());
    for (const Tensor& x : tensors) {
      CHORUS_NCCL(ncclAllReduce(x.raw_data_ptr(), x.raw_data_ptr(), count(x), nccl_dtype(x.dtype(), "allreduce"),
                                nccl_op(op), c, cuda_stream(s)));
    }
  }
  void broadcast(const TensorList& tensors, int root, const Stream& s, const std::shared_ptr<StreamWork>&) override {
    check_cuda(tensors, "broadcast");
    ncclComm_t c = comm(s.device());
    for (const Tensor& x : tensors) {
      CHORUS_NCCL(ncclBroadcast(x.raw_data_ptr(), x.raw_data_ptr(), count(x), nccl_dtype(x.dtype(), "broadcast"), root, c,
                                cuda_stream(s)));
    }
  }
  void allgather(const TensorList& outputs, const Tensor& input, const Stream& s,
                 const std::shared_ptr<StreamWork>&) override {
    TensorList all = outputs;
    all.push_back(input);
    check_cuda(all, "allgather");
    ncclComm_t c = comm(s.device());
    // Output r receives rank r's input: a send to and a receive from every rank, in one NCCL group
    // (the outputs need not be one buffer, as ncclAllGather would want).
    CHORUS_NCCL(ncclGroupStart());
    for (size_t r = 0; r < outputs.size(); ++r) {
      CHORUS_NCCL(ncclSend(input.raw_data_ptr(), count(input), nccl_dtype(input.dtype(), "allgather"),
                           static_cast<int>(r), c, cuda_stream(s)));
      CHORUS_NCCL(ncclRecv(outputs[r].raw_data_ptr(), count(input), nccl_dtype(input.dtype(), "allgather"),
                           static_cast<int>(r), c, cuda_stream(s)));
    }
    CHORUS_NCCL(ncclGroupEnd());
  }
  void reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op, const Stream& s,
                      const std::shared_ptr<StreamWork>& work) override {
    TensorList all{output};
    all.insert(all.end(), inputs.begin(), inputs.end());
    check_cuda(all, "reduce_scatter");
    // ncclReduceScatter wants the inputs back to back: stack them on the communication stream.
    Tensor flat;
    {
      StreamGuard guard(s);
      flat = stack(inputs).contiguous();
    }
    record_stream(flat.storage(), s);
    CHORUS_NCCL(ncclReduceScatter(flat.raw_data_ptr(), output.raw_data_ptr(), count(output),
                                  nccl_dtype(output.dtype(), "reduce_scatter"), nccl_op(op), comm(s.device()),
                                  cuda_stream(s)));
    // Inside an NCCL group the reduce-scatter is only queued on `s` at ncclGroupEnd, so `flat` lives
    // until then: freed here, its block (of `s`'s own pool, which record_stream does not hold back)
    // would go to the group's next reduce_scatter's stack, whose copy runs on `s` first, and both
    // would read the second one's inputs (found by a read-only audit, 2026-12-04).
    if (open_) group_temporaries_.push_back(std::move(flat));
    (void)work;
  }
  void all_to_all(const TensorList& outputs, const TensorList& inputs, const Stream& s,
                  const std::shared_ptr<StreamWork>&) override {
    TensorList all = outputs;
    all.insert(all.end(), inputs.begin(), inputs.end());
    check_cuda(all, "all_to_all");
    ncclComm_t c = comm(s.device());
    CHORUS_NCCL(ncclGroupStart());
    for (size_t r = 0; r < inputs.size(); ++r) {
      CHORUS_NCCL(ncclSend(inputs[r].raw_data_ptr(), count(inputs[r]), nccl_dtype(inputs[r].dtype(), "all_to_all"),
                           static_cast<int>(r), c, cuda_stream(s)));
      CHORUS_NCCL(ncclRecv(outputs[r].raw_data_ptr(), count(outputs[r]), nccl_dtype(outputs[r].dtype(), "all_to_all"),
                           static_cast<int>(r), c, cuda_stream(s)));
    }
    CHORUS_NCCL(ncclGroupEnd());
  }
  // NCCL has no tags: point-to-point messages between two ranks match in issue order.
  void send(const Tensor& t, int dst, int, const Stream& s, const std::shared_ptr<StreamWork>&) override {
    check_cuda({t}, "send");
    CHORUS_NCCL(ncclSend(t.raw_data_ptr(), count(t), nccl_dtype(t.dtype(), "send"), dst, comm(s.device()), cuda_stream(s)));
  }
  void recv(const Tensor& t, int src, int, const Stream& s, const std::shared_ptr<StreamWork>&) override {
    check_cuda({t}, "recv");
    CHORUS_NCCL(ncclRecv(t.raw_data_ptr(), count(t), nccl_dtype(t.dtype(), "recv"), src, comm(s.device()), cuda_stream(s)));
  }
  // The stream-ordered group brackets every launch with group_start()/group_end(). The NCCL group
  // opens only at the first operation inside, after comm() has made the communicator: a
  // communicator initialised inside a group is only ready at ncclGroupEnd, and an operation queued
  // on it before then fails there with "invalid argument".
  void group_start() override { ++depth_; }
  void group_end() override {
    if (depth_ == 0) fail("ProcessGroupNCCL: group_end() without group_start()");
    if (--depth_ > 0 || !open_) return;
    open_ = false;
    // Dropped after ncclGroupEnd has queued the group's operations on their streams (then stream
    // order keeps their blocks until they have run), even if it fails.
    const std::vector<Tensor> temporaries = std::move(group_temporaries_);
    group_temporaries_.clear();
    CHORUS_NCCL(ncclGroupEnd());
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.empty()) aborted_ = why;
    for (auto& [device, c] : comms_) ncclCommAbort(c);
    comms_.clear();
  }
  std::optional<std::string> async_error() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [device, c] : comms_) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
        return fmt::format("NCCL asynchronous error on cuda:{}: {}", device, ncclGetErrorString(async));
      }
    }
    return std::nullopt;
  }

 private:
  // The device's communicator, made at first use (outside any NCCL group: make_comm), with the
  // caller's NCCL group opened. Rank 0 publishes a unique id in the store and every rank joins with
  // it (agree_nccl_unique_id).
  ncclComm_t comm(Device device) {
    ncclComm_t c = make_comm(device);
    if (depth_ > 0 && !open_) {
      CHORUS_NCCL(ncclGroupStart());
      open_ = true;
    }
    return c;
  }
  ncclComm_t make_comm(Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty()) fail("ProcessGroupNCCL: the communicator was aborted: {}", aborted_);
    auto it = comms_.find(device.index);
    if (it != comms_.end()) return it->second;
    // By the order communicators are made, not by device: rank 1 on cuda:1 joins rank 0's cuda:0.
    const Bytes b = agree_nccl_unique_id(*store_, rank_, made_++, device, [] {
      ncclUniqueId made{};
      CHORUS_NCCL(ncclGetUniqueId(&made));
      return Bytes(reinterpret_cast<const uint8_t*>(&made), reinterpret_cast<const uint8_t*>(&made) + sizeof(made));
    });
    ncclUniqueId id{};
    if (b.size() != sizeof(id)) fail("ProcessGroupNCCL: malformed NCCL unique id in the store ({} bytes, expected {})", b.size(), sizeof(id));
    std::memcpy(&id, b.data(), sizeof(id));
    DeviceGuard guard(device);
    ncclComm_t c = nullptr;
    CHORUS_NCCL(ncclCommInitRank(&c, size_, id, rank_));
    return comms_.emplace(device.index, c).first->second;
  }

  std::shared_ptr<Store> store_;
  int rank_, size_;
  std::mutex mutex_;
  std::map<int, ncclComm_t> comms_;
  size_t made_ = 0;  // communicators made so far (agree_nccl_unique_id's index)
  std::string aborted_;
  int depth_ = 0;      // group_start() calls not yet ended (the launching thread's)
  bool open_ = false;  // whether this group has called ncclGroupStart
  std::vector<Tensor> group_temporaries_;  // buffers the open NCCL group's operations read (reduce_scatter's)
};

const bool g_registered = [] {
  register_device_backend("nccl", [](std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds) {
    return std::make_shared<NcclCommunicator>(std::move(store), rank, size);
  });
  return true;
}();

}  // namespace

// [NCCL ids by the order communicators are made] Until 2026-12-04 the key was the device's index,
// which only one GPU (both ranks on cuda:0, the only multi-rank case ever run) made agree: with
// rank r on cuda:r (chorusrun --nproc-per-node 2 on a two-GPU node) rank 1 waited for
// "nccl_unique_id_1", which rank 0 never writes, and the group's first collective never started
// (found by a helper's read-only audit; PyTorch's ProcessGroupNCCL keys its ids by a counter of the
// communicators the group has made).
Bytes agree_nccl_unique_id(Store& store, int rank, size_t index, Device device, const std::function<Bytes()>& make_id) {
  const std::string key = fmt::format("nccl_unique_id_{}", index);
  if (rank == 0) {
    Bytes id = make_id();
    store.set(key, id);
    return id;
  }
  try {
    return store.get(key);
  } catch (const Error& e) {
    fail("ProcessGroupNCCL: rank {} ({}) did not get rank 0's NCCL unique id for the group's communicator #{} (store "
         "key '{}'): every rank must make its communicators in the same order, one per device it uses in the group's "
         "collectives: {}",
         rank, device.str(), index, key, e.what());
  }
}

std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store> store, int rank, int size,
                                                      NcclOptions options) {
  auto nccl = std::make_shared<NcclCommunicator>(std::make_shared<PrefixStore>("nccl", store), rank, size);
  GlooOptions gloo;
  gloo.timeout = options.timeout;
  auto cpu = std::make_shared<ProcessGroupGloo>(store, rank, size, gloo);
  return std::make_shared<StreamOrderedGroup>(cpu, StreamOrderedGroup::DeviceCommunicators{{DeviceType::CUDA, nccl}},
                                              options.timeout, "nccl");
}

}  // namespace chorus::distributed
