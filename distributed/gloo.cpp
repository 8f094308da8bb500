#include "distributed/gloo.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/alltoallv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "autograd/grad_mode.h"
#include "distributed/flight_recorder.h"
#include "tensor/ops.h"

namespace chorus::distributed {
namespace {

// Gloo's rendezvous reads and writes connection details through this adapter over our Store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<distributed::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes b = store_->get(key);
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<distributed::Store> store_;
};

// The address this process's peers can reach it at ([Peer address]). With MASTER_ADDR a loopback
// address (one machine), 127.0.0.1. Otherwise the local address the kernel would send from to reach
// MASTER_ADDR (a UDP socket "connected" there sends nothing; getsockname reads the route's source):
// the interface facing the other nodes, whatever /etc/hosts says of this machine's name (Debian maps
// it to 127.0.1.1, and a container's to 127.0.0.1, which peers on other hosts cannot reach: a
// two-host run over network namespaces failed so). Falls back to the hostname when MASTER_ADDR does
// not resolve.
std::string default_hostname() {
  const char* master = std::getenv("MASTER_ADDR");
  const std::string m = master ? master : "";
  if (m.empty() || m == "localhost" || m.rfind("127.", 0) == 0 || m == "::1") return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(m.c_str(), "9", &hints, &found) == 0 && found != nullptr) {
    std::string local;
    for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
      const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
      if (fd < 0) continue;
      sockaddr_storage self{};
      socklen_t len = sizeof(self);
      char text[INET6_ADDRSTRLEN] = {0};
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
          ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0 &&
          ::getnameinfo(reinterpret_cast<sockaddr*>(&self), len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0) {
        local = text;
      }
      ::close(fd);
    }
    ::freeaddrinfo(found);
    if (!local.empty()) return local;
  }
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

// Elementwise reductions for Gloo over chorus's dtypes. float16 and bfloat16 reduce in float32.
template <typename T, typename Op>
void reduce_into(void* out, const void* a, const void* b, size_t n, Op op) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      o[i] = T(op(static_cast<float>(x[i]), static_cast<float>(y[i])));
    } else {
      o[i] = op(x[i], y[i]);
    }
  }
}

template <typename T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // summed here, divided by the group size afterwards
      return [](void* o, const void* a, const void* b, size_t n) { reduce_into<T>(o, a, b, n, [](auto x, auto y) { return x + y; }); };
    case ReduceOp::Max:
      return [](void* o, const void* a, const void* b, size_t n) { reduce_into<T>(o, a, b, n, [](auto x, auto y) { return x > y ? x : y; }); };
    case ReduceOp::Min:
      return [](void* o, const void* a, const void* b, size_t n) { reduce_into<T>(o, a, b, n, [](auto x, auto y) { return x < y ? x : y; }); };
  }
  return nullptr;
}

// A contiguous tensor to hand to Gloo, and a way to write results back when we had to copy.
struct Staged {
  Tensor original;
  Tensor buffer;
  explicit Staged(const Tensor& t) : original(t), buffer(t.is_contiguous() ? t : t.contiguous()) {}
  void write_back() {
    if (!buffer.is_same(original)) {
      NoGradGuard no_grad;
      Tensor o = original;
      o.copy_(buffer);
    }
  }
};

}  // namespace

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GlooOptions options)
    : ProcessGroup(rank, size), options_(std::move(options)), store_(store) {
  ignore_sigpipe();
  if (!store) fail("ProcessGroupGloo: store is null");
  if (size < 1 || rank < 0 || rank >= size) {
    fail("ProcessGroupGloo: rank {} is not valid for a group of size {} (expected 0 <= rank < size)", rank, size);
  }
  gloo::transport::tcp::attr attr;
  // GLOO_SOCKET_IFNAME (PyTorch's variable) names the interface to listen on; else [Peer address].
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (options_.hostname.empty() && ifname != nullptr && *ifname != '\0') attr.iface = ifname;
  else attr.hostname = options_.hostname.empty() ? default_hostname() : options_.hostname;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options_.timeout);
    GlooStoreAdapter adapter(store);
    context->connectFullMesh(adapter, device);
    context_ = context;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("ProcessGroupGloo: rank {} of {} could not connect to its peers on {} within {} ms: {}", rank, size,
         attr.iface.empty() ? attr.hostname : "interface " + attr.iface, options_.timeout.count(), e.what());
  }
  worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroupGloo::~ProcessGroupGloo() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ProcessGroupGloo::worker_loop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

std::shared_ptr<Work> ProcessGroupGloo::enqueue(std::string op, std::string tensors, TensorList result,
                                                std::function<void(uint32_t)> body) {
  const uint64_t seq = sequence_++;
  const std::string description = fmt::format("ProcessGroupGloo {} (sequence number {}, rank {} of {}, timeout {} ms)",
                                              op, seq, rank_, size_, options_.timeout.count());
  FlightRecorder& recorder = FlightRecorder::global();
  const uint64_t record = recorder.issue(options_.name, seq, false, std::move(op), std::move(tensors));
  auto work = std::make_shared<Work>(description);
  auto task = [this, work, result = std::move(result), body = std::move(body), seq, description, record]() mutable {
    FlightRecorder& recorder = FlightRecorder::global();
    recorder.start(record);
    try {
      body(static_cast<uint32_t>(seq));
      recorder.finish(record);
      work->finish(std::move(result));
    } catch (const std::exception& e) {
      recorder.finish(record, e.what());
      // A timeout gets the desync report (which ranks never entered this collective, or entered
      // another), and so does a peer that closed its connection: Gloo closes a pair whose operation
      // timed out, so the first rank to time out cuts the others off before their own timeouts fire
      // (2026-11-29: in a three-rank mismatch under load rank 0 failed so, without a report, while
      // ranks 1 and 2 reported). A peer that is really gone is named as having sent no record, after
      // the exchange's wait (at most 5 s by default).
      std::string report;
      try {
        if (record != 0 && (is_timeout_error(e.what()) || is_peer_closed_error(e.what()))) {
          report = "\n" + desync_report(seq);
        }
      } catch (const std::exception& r) {
        report = fmt::format("\n(no desync report: {})", r.what());
      }
      work->finish({}, std::make_exception_ptr(Error(fmt::format("{} failed: {}{}", description, e.what(), report))));
    }
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return track(work);
}

std::string ProcessGroupGloo::desync_report(uint64_t seq) const {
  FlightRecorder& recorder = FlightRecorder::global();
  std::optional<FlightExchange> exchange = options_.global_ranks.empty() ? std::nullopt : recorder.job_exchange();
  std::vector<int> members = options_.global_ranks;
  if (!exchange) {
    // A group made outside init_process_group: its ranks meet in the group's own store.
    exchange = FlightExchange{.store = store_, .connect = {}, .prefix = "chorus_flight", .id = rank_,
                              .wait = std::min(options_.timeout, std::chrono::milliseconds(5000))};
    members.clear();
    for (int r = 0; r < size_; ++r) members.push_back(r);
  }
  return recorder.report_timeout(options_.name, seq, members, *exchange);
}

void ProcessGroupGloo::check_tensor(const Tensor& t, const char* op) const {
  if (!t.defined()) fail("ProcessGroupGloo {}: got an undefined tensor", op);
  if (!t.device().is_cpu()) {
    fail("ProcessGroupGloo {}: tensor on {}; this build stages only CPU tensors through Gloo", op, t.device().str());
  }
}

std::shared_ptr<Work> ProcessGroupGloo::allreduce(const TensorList& tensors, ReduceOp op) {
  for (const Tensor& t : tensors) {
    check_tensor(t, "allreduce");
    // Refused at the call, before any traffic, alike on every rank (an average of integers was
    // refused only after the sum, and after the tensors before it in the list were reduced).
    if (op == ReduceOp::Avg && !t.is_floating_point()) {
      fail("allreduce: avg needs a floating-point tensor, got {}", dtype_name(t.dtype()));
    }
  }
  auto ctx = context_;
  auto timeout = options_.timeout;
  const int size = size_;
  return enqueue(fmt::format("allreduce({})", reduce_op_name(op)), describe_tensors(tensors), tensors, [=](uint32_t tag) {
    for (const Tensor& t : tensors) {
      Staged s(t);
      if (s.buffer.numel() == 0) continue;
      gloo::AllreduceOptions opts(ctx);
      opts.setTag(tag);
      opts.setTimeout(timeout);
      CHORUS_DISPATCH_ALL(s.buffer.dtype(), "allreduce", [&]<typename T>() {
        if constexpr (std::is_same_v<T, bool>) {
          fail("allreduce: bool tensors are not supported");
        } else {
          opts.setOutput(static_cast<T*>(s.buffer.raw_data_ptr()), static_cast<size_t>(s.buffer.numel()));
          opts.setReduceFunction(reduce_function<T>(op));
        }
      });
      gloo::allreduce(opts);
      if (op == ReduceOp::Avg) {
        NoGradGuard no_grad;
        s.buffer.div_(static_cast<double>(size));
      }
      s.write_back();
    }
  });
}

std::shared_ptr<Work> ProcessGroupGloo::broadcast(const TensorList& tensors, int root) {
  for (const Tensor& t : tensors) check_tensor(t, "broadcast");
  if (root < 0 || root >= size_) fail("ProcessGroupGloo broadcast: root {} is not a rank of a group of size {}", root, size_);
  auto ctx = context_;
  auto timeout = options_.timeout;
  return enqueue(fmt::format("broadcast(root={})", root), describe_tensors(tensors), tensors, [=](uint32_t tag) {
    for (const Tensor& t : tensors) {
      Staged s(t);
      if (s.buffer.numel() == 0) continue;
      gloo::BroadcastOptions opts(ctx);
      opts.setTag(tag);
      opts.setTimeout(timeout);
      opts.setRoot(root);
      CHORUS_DISPATCH_ALL(s.buffer.dtype(), "broadcast", [&]<typename T>() {
        using G = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
        opts.setOutput(reinterpret_cast<G*>(s.buffer.raw_data_ptr()), static_cast<size_t>(s.buffer.numel()));
      });
      gloo::broadcast(opts);
      s.write_back();
    }
  });
}

std::shared_ptr<Work> ProcessGroupGloo::allgather(const TensorList& outputs, const Tensor& input) {
  check_tensor(input, "allgather");
  if (static_cast<int>(outputs.size()) != size_) {
    fail("ProcessGroupGloo allgather: expected {} output tensors (one per rank), got {}", size_, outputs.size());
  }
  for (const Tensor& o : outputs) {
    check_tensor(o, "allgather");
    if (o.sizes() != input.sizes() || o.dtype() != input.dtype()) {
      fail("ProcessGroupGloo allgather: every output must match the input ({} {}), got {} {}", shape_str(input.sizes()),
           dtype_name(input.dtype()), shape_str(o.sizes()), dtype_name(o.dtype()));
    }
  }
  auto ctx = context_;
  auto timeout = options_.timeout;
  const int size = size_;
  return enqueue("allgather", describe_tensors({input}), outputs, [=](uint32_t tag) {
    Tensor in = input.contiguous();
    const int64_t n = in.numel();
    Tensor flat = empty({size * n}, {.dtype = in.dtype()});
    if (n > 0) {
      gloo::AllgatherOptions opts(ctx);
      opts.setTag(tag);
      opts.setTimeout(timeout);
      CHORUS_DISPATCH_ALL(in.dtype(), "allgather", [&]<typename T>() {
        using G = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
        opts.setInput(reinterpret_cast<G*>(in.raw_data_ptr()), static_cast<size_t>(n));
        opts.setOutput(reinterpret_cast<G*>(flat.raw_data_ptr()), static_cast<size_t>(size * n));
      });
      gloo::allgather(opts);
    }
    NoGradGuard no_grad;
    for (int r = 0; r < size; ++r) {
      Tensor o = outputs[r];
      o.copy_(flat.narrow(0, r * n, n).view(in.sizes()));
    }
  });
}

std::shared_ptr<Work> ProcessGroupGloo::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op) {
  check_tensor(output, "reduce_scatter");
  // Refused at the call, as allreduce's: an average of integers came back as the truncated quotient.
  if (op == ReduceOp::Avg && !output.is_floating_point()) {
    fail("reduce_scatter: avg needs a floating-point tensor, got {}", dtype_name(output.dtype()));
  }
  if (static_cast<int>(inputs.size()) != size_) {
    fail("ProcessGroupGloo reduce_scatter: expected {} input tensors (one per rank), got {}", size_, inputs.size());
  }
  for (const Tensor& i : inputs) {
    check_tensor(i, "reduce_scatter");
    if (i.sizes() != output.sizes() || i.dtype() != output.dtype()) {
      fail("ProcessGroupGloo reduce_scatter: every input must match the output ({} {}), got {} {}",
           shape_str(output.sizes()), dtype_name(output.dtype()), shape_str(i.sizes()), dtype_name(i.dtype()));
    }
  }
  // Allreduce of the concatenated inputs, keeping this rank's block: the same result as a
  // dedicated reduce-scatter with (size - 1) / size more traffic, which Gloo's TCP path can afford.
  auto ctx = context_;
  auto timeout = options_.timeout;
  const int size = size_, rank = rank_;
  return enqueue(fmt::format("reduce_scatter({})", reduce_op_name(op)), describe_tensors({output}), {output}, [=](uint32_t tag) {
    Tensor flat = cat([&] {
      TensorList flat_inputs;
      for (const Tensor& i : inputs) flat_inputs.push_back(i.reshape({-1}));
      return flat_inputs;
    }());
    gloo::AllreduceOptions opts(ctx);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    CHORUS_DISPATCH_ALL(flat.dtype(), "reduce_scatter", [&]<typename T>() {
      if constexpr (std::is_same_v<T, bool>) {
        fail("reduce_scatter: bool tensors are not supported");
      } else {
        opts.setOutput(static_cast<T*>(flat.raw_data_ptr()), static_cast<size_t>(flat.numel()));
        opts.setReduceFunction(reduce_function<T>(op));
      }
    });
    if (flat.numel() > 0) gloo::allreduce(opts);
    NoGradGuard no_grad;
    const int64_t n = output.numel();
    Tensor mine = flat.narrow(0, rank * n, n).view(output.sizes());
    if (op == ReduceOp::Avg) mine = mine.div(static_cast<double>(size));
    Tensor o = output;
    o.copy_(mine);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::all_to_all(const TensorList& outputs, const TensorList& inputs) {
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_) {
    fail("ProcessGroupGloo all_to_all: expected {} input and {} output tensors (one per rank), got {} and {}", size_,
         size_, inputs.size(), outputs.size());
  }
  const DType dtype = inputs.front().dtype();
  for (const TensorList* list : {&inputs, &outputs}) {
    for (const Tensor& t : *list) {
      check_tensor(t, "all_to_all");
      if (t.dtype() != dtype) {
        fail("ProcessGroupGloo all_to_all: every tensor must have the dtype of inputs[0] ({}), got {}", dtype_name(dtype),
             dtype_name(t.dtype()));
      }
    }
  }
  auto ctx = context_;
  auto timeout = options_.timeout;
  return enqueue("all_to_all", dtype_name(dtype), outputs, [=](uint32_t tag) {
    TensorList flat_inputs;
    std::vector<int64_t> in_counts, out_counts;
    int64_t out_total = 0;
    for (const Tensor& i : inputs) {
      flat_inputs.push_back(i.reshape({-1}));
      in_counts.push_back(i.numel());
    }
    for (const Tensor& o : outputs) {
      out_counts.push_back(o.numel());
      out_total += o.numel();
    }
    Tensor in = cat(flat_inputs).contiguous();
    Tensor out = empty({out_total}, {.dtype = dtype});
    gloo::AlltoallvOptions opts(ctx);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    CHORUS_DISPATCH_ALL(dtype, "all_to_all", [&]<typename T>() {
      using G = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
      opts.setInput(reinterpret_cast<G*>(in.raw_data_ptr()), in_counts);
      opts.setOutput(reinterpret_cast<G*>(out.raw_data_ptr()), out_counts);
    });
    gloo::alltoallv(opts);
    NoGradGuard no_grad;
    int64_t offset = 0;
    for (const Tensor& o : outputs) {
      Tensor dst = o;
      dst.copy_(out.narrow(0, offset, o.numel()).view(o.sizes()));
      offset += o.numel();
    }
  });
}

std::shared_ptr<Work> ProcessGroupGloo::barrier() {
  auto ctx = context_;
  auto timeout = options_.timeout;
  return enqueue("barrier", "", {}, [=](uint32_t tag) {
    gloo::BarrierOptions opts(ctx);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
  });
}

namespace {

// [Point-to-point completion] A Gloo send or receive is posted at once (so a later op can never
// queue behind it), and completed by whoever needs it first: the caller's wait() blocks in the
// transport's own wait, so the transport thread that finishes the transfer wakes the caller
// directly; is_completed() and then(), which must not block, start one background thread that
// waits instead. A pipeline stage's receive is on its critical path: a thread per message in
// between cost a thread start and a wake-up hop per micro-batch, which on a machine whose cores are
// all computing is a run-queue wait each (docs/pipeline.md, "Predictions against measurements").
class PointToPointWork final : public Work {
 public:
  PointToPointWork(std::string description, std::function<void()> transfer, TensorList result)
      : Work(std::move(description)), transfer_(std::move(transfer)), result_tensors_(std::move(result)) {}

  ~PointToPointWork() override {
    std::lock_guard<std::mutex> lock(claim_mutex_);
    // The background thread holds a reference, so this runs on it (the last holder) or after it.
    if (background_.joinable()) background_.detach();
    if (!claimed_ && transfer_) {
      // Dropped without a wait: the transfer still has to finish before its buffer may go (the
      // peer may be writing into it), so a thread sees it through, as a background wait would.
      std::thread([transfer = std::move(transfer_)] {
        try {
          transfer();
        } catch (const std::exception&) {
          // Nobody holds the Work to hear of it.
        }
      }).detach();
    }
  }

  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt) override {
    if (claim()) complete();
    Work::wait(timeout);
  }

 protected:
  void complete_in_background() const override {
    auto* self = const_cast<PointToPointWork*>(this);
    if (!self->claim()) return;
    std::lock_guard<std::mutex> lock(claim_mutex_);
    self->background_ = std::thread([keep = self->shared_from_this_work()] {
      static_cast<PointToPointWork&>(*keep).complete();
    });
  }

 private:
  // True for the one caller that is to complete the transfer.
  bool claim() {
    std::lock_guard<std::mutex> lock(claim_mutex_);
    if (claimed_) return false;
    claimed_ = true;
    return true;
  }
  void complete() {
    try {
      transfer_();
      finish(std::move(result_tensors_));
    } catch (const std::exception& e) {
      finish({}, std::make_exception_ptr(Error(fmt::format("{} failed: {}", description(), e.what()))));
    }
    transfer_ = nullptr;
  }
  std::shared_ptr<Work> shared_from_this_work() { return self_.lock(); }

  friend std::shared_ptr<Work> make_point_to_point(std::string, std::function<void()>, TensorList);
  std::weak_ptr<Work> self_;
  std::function<void()> transfer_;
  TensorList result_tensors_;
  mutable std::mutex claim_mutex_;
  bool claimed_ = false;
  std::thread background_;
};

std::shared_ptr<Work> make_point_to_point(std::string description, std::function<void()> transfer, TensorList result) {
  auto work = std::make_shared<PointToPointWork>(std::move(description), std::move(transfer), std::move(result));
  work->self_ = work;
  return work;
}

// The transfer of a recorded send or receive: the record finishes (or fails) with it.
std::function<void()> recorded_transfer(uint64_t record, std::function<void()> transfer) {
  if (record == 0) return transfer;
  return [record, transfer = std::move(transfer)] {
    try {
      transfer();
      FlightRecorder::global().finish(record);
    } catch (const std::exception& e) {
      FlightRecorder::global().finish(record, e.what());
      throw;
    }
  };
}

}  // namespace

uint64_t ProcessGroupGloo::recorded_p2p(uint64_t seq, std::string op, const Tensor& tensor) const {
  FlightRecorder& recorder = FlightRecorder::global();
  const uint64_t record = recorder.issue(options_.name, seq, true, std::move(op), describe_tensors({tensor}));
  recorder.start(record);  // posted at once ([Point-to-point completion])
  return record;
}

std::shared_ptr<Work> ProcessGroupGloo::send(const Tensor& tensor, int dst, int tag) {
  check_tensor(tensor, "send");
  if (dst < 0 || dst >= size_ || dst == rank_) {
    fail("ProcessGroupGloo send: destination {} is not another rank of a group of size {} (this is rank {})", dst, size_, rank_);
  }
  auto ctx = context_;
  auto timeout = options_.timeout;
  const int rank = rank_;
  // Point-to-point ops do not go through the worker queue: a send waits for its matching recv,
  // and queued behind it a later recv (isend then irecv, as in a ring) could never be posted.
  // The buffer is posted here, at once ([Point-to-point completion]).
  const uint64_t seq = p2p_sequence_++;
  Tensor t = tensor.contiguous();
  auto buf = std::shared_ptr<gloo::transport::UnboundBuffer>(ctx->createUnboundBuffer(t.raw_data_ptr(), t.nbytes()));
  // Slot: (user tag, src, dst) so concurrent pairs never match each other's messages.
  const uint64_t slot = (static_cast<uint64_t>(tag) << 32) | (static_cast<uint64_t>(rank) << 16) | static_cast<uint64_t>(dst);
  buf->send(dst, slot);
  const uint64_t record = recorded_p2p(seq, fmt::format("send(to {}, tag {})", dst, tag), t);
  return track(make_point_to_point(
      fmt::format("ProcessGroupGloo send to rank {} (point-to-point number {}, rank {} of {}, timeout {} ms)", dst, seq,
                  rank, size_, timeout.count()),
      recorded_transfer(record, [buf, t, timeout, dst, ctx] {
        if (!buf->waitSend(timeout)) fail("send to rank {} did not complete", dst);
      }),
      {tensor}));
}

std::shared_ptr<Work> ProcessGroupGloo::recv(const Tensor& tensor, int src, int tag) {
  check_tensor(tensor, "recv");
  if (src < 0 || src >= size_ || src == rank_) {
    fail("ProcessGroupGloo recv: source {} is not another rank of a group of size {} (this is rank {})", src, size_, rank_);
  }
  auto ctx = context_;
  auto timeout = options_.timeout;
  const int rank = rank_;
  const uint64_t seq = p2p_sequence_++;
  auto s = std::make_shared<Staged>(tensor);
  auto buf = std::shared_ptr<gloo::transport::UnboundBuffer>(
      ctx->createUnboundBuffer(s->buffer.raw_data_ptr(), s->buffer.nbytes()));
  const uint64_t slot = (static_cast<uint64_t>(tag) << 32) | (static_cast<uint64_t>(src) << 16) | static_cast<uint64_t>(rank);
  buf->recv(src, slot);
  const uint64_t record = recorded_p2p(seq, fmt::format("recv(from {}, tag {})", src, tag), tensor);
  return track(make_point_to_point(
      fmt::format("ProcessGroupGloo recv from rank {} (point-to-point number {}, rank {} of {}, timeout {} ms)", src, seq,
                  rank, size_, timeout.count()),
      recorded_transfer(record, [buf, s, timeout, src, ctx] {
        if (!buf->waitRecv(timeout)) fail("recv from rank {} did not complete", src);
        s->write_back();
      }),
      {tensor}));
}

}  // namespace chorus::distributed
