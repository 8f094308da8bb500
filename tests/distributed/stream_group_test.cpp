// The stream-ordered group and DDP's reducer in one process, for ThreadSanitizer: a world-size-1
// Gloo group over a FileStore, wrapped in StreamOrderedGroup, on sim:0 with random delays. DDP with
// bucket views (so buckets really go through the communication stream) trains an MLP 6 steps and
// must equal plain training; direct collectives on the device keep their values. The host thread,
// the compute and communication stream workers, Gloo's thread and the allocator all interleave.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/gloo.h"
#include "distributed/gloo_communicator.h"
#include "distributed/stream_group.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tensor/sanitizers.h"
#include "tensor/sim/sim.h"
#include "tensor/stream_sanitizer.h"
#include "tensor/test_faults.h"

namespace chorus::distributed {
namespace F = nn::functional;

namespace {
// A FileStore path of this run's own: runs of this test may overlap (--runs_per_test), each in its
// own TEST_TMPDIR (a sandbox's process ids repeat, so the pid is not enough where /tmp is shared).
std::string store_path(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = tmp != nullptr ? std::filesystem::path(tmp) : std::filesystem::temp_directory_path();
  return dir / (name + "_" + std::to_string(::getpid()));
}
}  // namespace

namespace {

constexpr int64_t kStagedN = 256;  // the elements of the two-rank staging tests' tensors

std::shared_ptr<StreamOrderedGroup> one_rank_group(const std::string& path) {
  std::filesystem::remove(path);
  return std::make_shared<StreamOrderedGroup>(std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 1));
}

// DDP with bucket views (6 steps of an MLP on sim:0) against plain training on the CPU; returns the
// largest difference of a parameter. Throws what the stream-order sanitizer reports.
double ddp_against_plain_training(const std::shared_ptr<StreamOrderedGroup>& group) {
  const Device sim0 = Device::sim(0);
  auto make = [] {
    manual_seed(3);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(10, 24));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(24, 4));
    net->to(kFloat64);
    return net;
  };
  auto model = make(), ref = make();
  model->to(sim0);
  DistributedDataParallel ddp(model, group,
                              {.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0005, .gradient_as_bucket_view = true});
  REQUIRE(ddp.reducer().buckets().size() > 1);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  Generator g(4);
  for (int step = 0; step < 6; ++step) {
    Tensor x = randn({6, 10}, {.dtype = kFloat64}, &g), y = randint(0, 4, {6}, {.dtype = kInt64}, &g);
    opt.zero_grad();
    ref_opt.zero_grad();
    F::cross_entropy(ddp.forward(x.to(sim0)), y.to(sim0)).backward();
    opt.step();
    F::cross_entropy(ref->forward(x), y).backward();
    ref_opt.step();
  }
  const auto a = model->named_parameters(), b = ref->named_parameters();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i].second.cpu() - b[i].second).abs().max().item<double>());
  return worst;
}

}  // namespace

TEST_CASE("DDP through the stream-ordered group on sim:0 in one process", "[distributed][sim][tsan]") {
  sim::set_delay_us(50);
  const std::string path = store_path("chorus_stream_group_test_store");
  auto group = one_rank_group(path);
  const Device sim0 = Device::sim(0);

  Tensor t = arange(0, 64, 1, TensorOptions{.dtype = kFloat64}).to(sim0);
  group->allreduce({t}, ReduceOp::Avg)->wait();
  group->broadcast({t}, 0)->wait();
  CHECK(equal(t.cpu(), arange(0, 64, 1, TensorOptions{.dtype = kFloat64})));

  CHECK(ddp_against_plain_training(group) == 0);  // bit for bit
  sim::set_delay_us(0);
  std::filesystem::remove(path);
}

// Negative controls (tensor/test_faults.h): with either wait of [Sync Streams] removed, or both
// taken from the default stream while the caller works on a side stream, the same training is
// reported by the stream-order sanitizer at the first unordered access: deterministically, since
// it checks the order the program states, not the order the streams happened to run in.
TEST_CASE("without the ready wait, the end wait, or with them on the default stream, the sanitizer reports DDP", "[distributed][sim][tsan]") {
  const std::string path = store_path("chorus_stream_group_control_store");
  auto group = one_rank_group(path);
  for (const fault::Point point : {fault::Point::kReadyWait, fault::Point::kEndWait, fault::Point::kCallerStream}) {
    INFO("removed: " << fault::name(point));
    std::optional<StreamGuard> side;
    if (point == fault::Point::kCallerStream) side.emplace(stream_from_pool(Device::sim(0)));
    fault::RemovedScope removed(point);
    CHECK_THROWS_WITH(ddp_against_plain_training(group), Catch::Contains("stream-order sanitizer"));
    synchronize(Device::sim(0));
  }
  // The same on a side stream with nothing removed: clean and bit for bit.
  {
    StreamGuard side(stream_from_pool(Device::sim(0)));
    CHECK(ddp_against_plain_training(group) == 0);
  }
  synchronize(Device::sim(0));
  std::filesystem::remove(path);
}

// A collective the sanitizer refuses must not have started: the report is thrown before the
// communicator takes it, so none of its copies or host work runs on the communication stream (which
// would race, for real, with the stream that wrote the tensor: ThreadSanitizer saw that when the
// check came after the launch). Counted as sim stream tasks against a baseline that issues the
// same work with the collective replaced by what the group enqueues before its check (its start
// event's record).
TEST_CASE("a collective the stream-order sanitizer refuses runs nothing on the communication stream", "[distributed][sim][tsan]") {
  const std::string path = store_path("chorus_stream_group_refused_store");
  auto group = one_rank_group(path);
  const Device dev = Device::sim(0);
  Tensor t = zeros({257}, {.dtype = kFloat32, .device = dev});
  group->allreduce({t}, ReduceOp::Sum)->wait();  // the communicator and its staging exist now
  const Stream comm = group->comm_stream(dev);
  synchronize(dev);
  // The tasks one fill on the compute stream and `then` make run on the device.
  auto tasks_of = [&](const std::function<void()>& then) {
    synchronize(dev);
    const uint64_t before = sim::tasks_run();
    t.fill_(2.0f);
    then();
    synchronize(dev);
    return sim::tasks_run() - before;
  };
  const uint64_t baseline = tasks_of([&] {
    Event start;
    start.record(comm);
  });
  uint64_t refused = 0;
  {
    fault::RemovedScope removed(fault::Point::kReadyWait);
    refused = tasks_of([&] {
      CHECK_THROWS_WITH(group->allreduce({t}, ReduceOp::Sum), Catch::Contains("stream-order sanitizer") &&
                                                                   Catch::Contains("allreduce"));
    });
  }
  CHECK(refused == baseline);
  // The same allreduce, ordered, runs more than that (the control of the count itself).
  CHECK(tasks_of([&] { group->allreduce({t}, ReduceOp::Sum)->wait(); }) > baseline);
  CHECK(equal(t.cpu(), full({257}, 2.0f)));  // one rank: the sum of one
  std::filesystem::remove(path);
}

namespace {

// Rank 0 of two, on sim:0: an allgather whose input is a temporary of ones is issued while the
// communication stream is held at a gate, and the temporary dropped at once (a work keeps its
// outputs alive, not its inputs). A new tensor of the same size on the compute stream is filled
// with 7, and only then the gate opens. The allgather must still send ones: the process group's
// record_stream keeps the temporary's block from reuse until the communication stream has passed.
// Rank 1, a thread of this process, joins with ones on the CPU through plain Gloo (a second rank
// with device streams in this process would share sim's implicit synchronizations, as two GPUs of
// one CUDA process do, and deadlock). Returns what rank 0 gathered from itself; throws what the
// sanitizer reports.
// An odd size no other test leaves a free block of: the new tensor gets the temporary's block.
constexpr int64_t kDropped = 3333;

Tensor dropped_collective_then_reuse(const std::string& name) {
  const std::string path = store_path(name);
  std::filesystem::remove(path);
  std::thread rank1([&] {
    auto g = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 1, 2);
    for (int i = 0; i < 2; ++i) {
      TensorList outs{empty({kDropped}), empty({kDropped})};
      g->allgather(outs, ones({kDropped}))->wait();
    }
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() { t.join(); }
  } joiner{rank1};
  const Device dev = Device::sim(0);
  auto host = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 2);
  auto group = std::make_shared<StreamOrderedGroup>(host);
  // The gate holds the communication stream while the compute stream must finish, so the two need
  // hardware queues of their own: on one queue (sim's CHORUS_SIM_CONNECTIONS=1, a GPU's
  // CUDA_DEVICE_MAX_CONNECTIONS=1) the compute stream's fill would wait behind the gated stream's
  // next item ([Shared hardware queues], tensor/sim/sim.cpp). The group makes its stream at its
  // first collective, below, on a queue of its own.
  struct OwnQueues {
    OwnQueues() { sim::set_connections(0); }
    ~OwnQueues() { sim::set_connections(sim::kDefaultConnections); }
  } own_queues;
  // One allreduce of the size first: the group's page-locked staging memory is allocated now, not
  // behind the gate (allocating it is an implicit device synchronization, on sim as on CUDA, which
  // would hold the compute stream behind the gated communication stream).
  auto gathered = [&] {
    return TensorList{empty({kDropped}, {.dtype = kFloat32, .device = dev}), empty({kDropped}, {.dtype = kFloat32, .device = dev})};
  };
  // (Its tensors stay alive to the end: the only free block of this size is then the temporary's.)
  TensorList warm = gathered();
  Tensor warm_input = ones({kDropped}, {.dtype = kFloat32, .device = dev});
  group->allgather(warm, warm_input)->wait();
  synchronize(dev);
  const Stream comm = group->comm_stream(dev);
  std::atomic<bool> open{false};
  sim::launch_kernel(comm.handle(), [&] { while (!open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1)); }, {});
  struct Opener {
    std::atomic<bool>& open;
    Stream comm;
    ~Opener() {
      open = true;
      comm.synchronize();
    }
  } opener{open, comm};
  TensorList outs = gathered();
  {
    Tensor temp = ones({kDropped}, {.dtype = kFloat32, .device = dev});
    group->allgather(outs, temp);  // the work is dropped too: nothing waits for it
  }
  Tensor x = empty({kDropped}, {.dtype = kFloat32, .device = dev});
  x.fill_(7.0f);
  current_stream(dev).synchronize();
  open = true;
  comm.synchronize();
  synchronize(dev);
  Tensor out = outs[0].cpu();
  std::filesystem::remove(path);
  return out;
}

}  // namespace

TEST_CASE("a collective's input dropped at once: without record_stream the sanitizer reports the reuse, and with it off the data is corrupted", "[distributed][sim]") {
  const Tensor sent = ones({kDropped});
  SECTION("with every ordering point: clean, and the allgather sent the ones") {
    CHECK(equal(dropped_collective_then_reuse("chorus_dropped_ok"), sent));
  }
  for (const fault::Point point : {fault::Point::kGroupRecordStream, fault::Point::kAllocatorRecordStream}) {
    DYNAMIC_SECTION("removed: " << fault::name(point)) {
      fault::RemovedScope removed(point);
      CHECK_THROWS_WITH(dropped_collective_then_reuse("chorus_dropped_report"),
                        Catch::Contains("stream-order sanitizer") && Catch::Contains("freed and its memory handed out again") &&
                            Catch::Contains("allgather"));
      // With the sanitizer off, the early reuse shows in the numbers: the allgather, run after the
      // fill, sent the new tensor's sevens.
      stream_sanitizer::set_active(DeviceType::Sim, false);
      const Tensor got = dropped_collective_then_reuse("chorus_dropped_wrong");
      stream_sanitizer::set_active(DeviceType::Sim, true);
      INFO(got.narrow(0, 0, 4));
      CHECK(equal(got, full({kDropped}, 7.0f)));
    }
  }
}

// The watchdog: rank 0 of two (threads of this process, over a FileStore) issues an allreduce on
// sim:0 that rank 1 never joins. Gloo's own timeout is 4 s; the group's is 1 s, so it is the
// watchdog that must fail the work, abort the communicator and raise at the next call — naming the
// op, its sequence number, the device and the timeout. Later calls keep raising; the stuck Gloo
// collective ends at Gloo's timeout and the group is destroyed without a hang.
TEST_CASE("the watchdog fails a collective past the group's timeout and aborts the communicator", "[distributed][sim][tsan]") {
  const std::string path = store_path("chorus_stream_group_watchdog_store");
  std::filesystem::remove(path);
  GlooOptions gloo;
  gloo.timeout = std::chrono::milliseconds(4000);
  std::promise<void> rank0_done;
  std::thread rank1([&] {
    auto g = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 1, 2, gloo);
    rank0_done.get_future().wait();  // joins no collective
  });
  auto host = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 2, gloo);
  {
    auto group = std::make_shared<StreamOrderedGroup>(
        host, StreamOrderedGroup::DeviceCommunicators{{DeviceType::Sim, std::make_shared<GlooStreamCommunicator>(host)}},
        std::chrono::milliseconds(1000), "cpu:gloo,sim:gloo");
    Tensor t = ones({16}).to(Device::sim(0));
    const auto start = std::chrono::steady_clock::now();
    auto work = group->allreduce({t});
    work->wait();  // a stream wait: returns at once
    CHECK_FALSE(work->is_completed());
    std::string message;
    // Polled until the error comes (a 60 s bound only a hang reaches). That it is the watchdog's
    // 1 s and not Gloo's own 4 s timeout shows in the message, not in a wall-clock bound a loaded
    // machine could break.
    while (message.empty() && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      try {
        group->allreduce({t});
      } catch (const Error& e) {
        message = e.what();
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(message);
    CHECK_THAT(message, Catch::Contains("allreduce #1 on sim:0") && Catch::Contains("timed out after 1000 ms") &&
                            Catch::Contains("failed on the communication stream"));
    CHECK(seconds < 60.0);
    REQUIRE(work->is_completed());
    CHECK_FALSE(work->is_success());
    CHECK_THROWS_WITH(group->broadcast({t}, 0), Catch::Contains("timed out after 1000 ms"));
  }
  rank0_done.set_value();
  rank1.join();
  std::filesystem::remove(path);
}

// Device tensors reach Gloo through host copies, copied out and back by role (gloo_communicator.cpp):
// rank 0 on sim:0, rank 1 a thread of this process on the CPU. An in-place reduce_scatter (its
// output one of its own inputs, as with PyTorch's reduce_scatter_tensor on a chunk of the input)
// returns the sum: copied back by identity, the unchanged input's copy had landed on it after the
// result. A collective that fails (an integer average, refused inside Gloo's body) leaves its
// tensor all bits set, and a broadcast from a root outside the group is refused at the call.
TEST_CASE("Gloo on sim: an in-place reduce_scatter returns its sum, a failed collective leaves its output all bits set", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_roles");
  std::filesystem::remove(path);
  std::promise<void> rank0_done;
  GlooOptions gloo;
  gloo.timeout = std::chrono::milliseconds(10000);  // a regression that waits for rank 1 fails, not hangs
  std::thread rank1([&] {
    auto g = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 1, 2, gloo);
    Tensor out = empty({4});
    g->reduce_scatter(out, {full({4}, 10.0f), full({4}, 20.0f)})->wait();
    rank0_done.get_future().wait();  // joins nothing more
  });
  struct Joiner {
    std::thread& t;
    std::promise<void>& done;
    ~Joiner() {
      try {
        done.set_value();
      } catch (const std::future_error&) {  // already set
      }
      t.join();
    }
  } joiner{rank1, rank0_done};
  const Device dev = Device::sim(0);
  auto host = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 2, gloo);
  auto group = std::make_shared<StreamOrderedGroup>(host);
  Tensor a0 = full({4}, 1.0f).to(dev), a1 = full({4}, 2.0f).to(dev);
  group->reduce_scatter(a0, {a0, a1})->wait();
  CHECK(equal(a0.cpu(), full({4}, 11.0f)));  // 1 + 10; by identity it had come back as 1
  CHECK(equal(a1.cpu(), full({4}, 2.0f)));   // an input only: untouched

  Tensor n = full({8}, 7, {.dtype = kInt32}).to(dev);
  auto failed = group->allreduce({n}, ReduceOp::Avg);
  failed->wait_finished();  // the host after its end, so that its error is there
  try {
    failed->wait();  // orders the current stream after it (the copy below reads n); a finished
  } catch (const Error&) {  // work that failed raises here too
  }
  CHECK_THROWS_WITH(std::rethrow_exception(failed->exception()), Catch::Contains("avg needs a floating-point tensor"));
  CHECK(equal(n.cpu(), full({8}, -1, {.dtype = kInt32})));  // all bits set, not 7 nor a reused block's bytes

  Tensor b = full({4}, 3.0f).to(dev);
  CHECK_THROWS_WITH(group->broadcast({b}, 2), Catch::Contains("broadcast: root 2 is not a rank of a group of size 2"));
  CHECK(equal(b.cpu(), full({4}, 3.0f)));
  std::filesystem::remove(path);
}

namespace {
// Rank 0 of two on sim:0 and sim:1 through a GlooStreamCommunicator, rank 1 a thread of this
// process on the CPU, over a FileStore. Both first allreduce once on each of rank 0's devices (the
// pool's page-locked chunk and both lanes' flag words then exist, and nothing is in flight). Rank 1
// then runs `rank1` once rank 0's `rank0` has called release() (or returned, or thrown).
// `gloo_ms`, `group_ms`: Gloo's timeout and the stream-ordered group's.
void two_ranks(const std::string& name, const std::function<void(ProcessGroupGloo&)>& rank1,
               const std::function<void(StreamOrderedGroup&, GlooStreamCommunicator&, const std::function<void()>& release)>& rank0,
               int gloo_ms = 20000, int group_ms = 30000) {
  const std::string path = store_path(name);
  std::filesystem::remove(path);
  GlooOptions gloo;
  gloo.timeout = std::chrono::milliseconds(gloo_ms);  // a regression that leaves a rank waiting fails, not hangs
  std::promise<void> go;
  std::exception_ptr rank1_error;
  std::thread rank1_thread([&, released = go.get_future()]() mutable {
    try {
      ProcessGroupGloo g(std::make_shared<FileStore>(path), 1, 2, gloo);
      for (int i = 0; i < 2; ++i) g.allreduce({zeros({kStagedN})})->wait();
      released.wait();
      rank1(g);
    } catch (...) {
      rank1_error = std::current_exception();
    }
  });
  bool released = false;
  auto release = [&] {
    if (!std::exchange(released, true)) go.set_value();
  };
  struct Joiner {
    std::thread& t;
    std::function<void()> release;
    ~Joiner() {
      release();
      t.join();
    }
  };
  {
    Joiner joiner{rank1_thread, release};
    auto host = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 2, gloo);
    auto comm = std::make_shared<GlooStreamCommunicator>(host);
    StreamOrderedGroup group(host, StreamOrderedGroup::DeviceCommunicators{{DeviceType::Sim, comm}},
                             std::chrono::milliseconds(group_ms), "cpu:gloo,sim:gloo");
    for (const Device d : {Device::sim(0), Device::sim(1)}) {
      group.allreduce({zeros({kStagedN}, {.device = d})})->wait_finished();
      synchronize(d);
    }
    rank0(group, *comm, release);
    synchronize(Device::sim(0));
    synchronize(Device::sim(1));
  }
  std::filesystem::remove(path);
  if (rank1_error) std::rethrow_exception(rank1_error);
}

// Rank 1's side of the tests below: A (tens), then B (twenties).
void rank1_allreduces_10_then_20(ProcessGroupGloo& g) {
  g.allreduce({full({kStagedN}, 10.0f)})->wait();
  g.allreduce({full({kStagedN}, 20.0f)})->wait();
}

// Waits (up to 20 s, a bound only a hang reaches) until `done` holds.
bool eventually(const std::function<bool()>& done) {
  const auto patience = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < patience) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}
}  // namespace

// [Collectives reach Gloo in the order they were issued] (gloo_communicator.cpp). Gloo matches the
// ranks' collectives by the order each posts them, and each device's collective stream has a lane
// worker of its own that posts a group once its stream has copied the inputs out. Rank 0 issues
// allreduce A on sim:0 (ones, its stream held on a page-locked word) and then B on sim:1 (fives);
// rank 1 issues A (tens) and B (twenties). Kept: B's lane, its inputs copied, waits for A to be
// posted, and the word's release lets both through: A = 11, B = 25. Removed
// (fault::Point::kGlooCollectiveOrder): B is posted while A's stream is held, Gloo pairs it with
// rank 1's A, and the sums cross: B = 5 + 10, A = 1 + 20 (found this way: before the rule, the
// staging test below read A = 21, B = 15 in 3 of 20 runs).
TEST_CASE("Gloo on sim: collectives issued on two devices reach Gloo in the order they were issued", "[distributed][sim]") {
  for (const bool removed : {false, true}) {
    INFO((removed ? "removed" : "kept"));
    std::optional<fault::RemovedScope> scope;
    if (removed) scope.emplace(fault::Point::kGlooCollectiveOrder);
    Tensor a, b;
    two_ranks(
        removed ? "chorus_stream_group_order_removed" : "chorus_stream_group_order_kept",
        rank1_allreduces_10_then_20,
        [&](StreamOrderedGroup& group, GlooStreamCommunicator& comm, const std::function<void()>& release) {
          release();  // rank 1 may post A and B at once: the order on rank 0 is what is tested
          const Device d0 = Device::sim(0), d1 = Device::sim(1);
          a = full({kStagedN}, 1.0f).to(d0);
          b = full({kStagedN}, 5.0f).to(d1);
          DeviceRuntime& rt = runtime_for(d0, "stream_group_test");
          auto* word = static_cast<uint32_t*>(rt.host_malloc(64));
          word[0] = 0;
          const Stream held = current_stream(d0);
          held.synchronize();
          const uint64_t before = comm.groups_posted();
          rt.stream_wait_value(held.handle(), word, 1);  // sim:0's streams stop here (one hardware queue)
          auto work_a = group.allreduce({a});
          auto work_b = group.allreduce({b});
          if (!removed) {
            CHECK(eventually([&] { return comm.lanes_waiting_turn() == 1; }));  // B's inputs are out, and it waits
            CHECK(comm.groups_posted() == before);
          } else {
            CHECK(eventually([&] { return comm.groups_posted() == before + 1; }));  // B, while A's stream is held
          }
          std::atomic_ref<uint32_t>(word[0]).store(1, std::memory_order_release);
          work_a->wait_finished();
          work_b->wait_finished();
          synchronize(d0);
          rt.host_free(word);
        });
    a = a.cpu();
    b = b.cpu();
    INFO("A: " << a.narrow(0, 0, 4) << " B: " << b.narrow(0, 0, 4));
    CHECK(equal(a, full({kStagedN}, removed ? 21.0f : 11.0f)));
    CHECK(equal(b, full({kStagedN}, removed ? 15.0f : 25.0f)));
  }
}

// [sim runs a device's groups one after another, as NCCL] (gloo_communicator.cpp). Rank 0 on sim:0
// and rank 1 (a thread, CPU) exchange tensors, each sending first: rank 1 sends and then receives,
// each waited for (chorus's Gloo send waits for its receive, as NCCL's may); rank 0 issues a send
// and then a receive as two groups. On a GPU, NCCL runs rank 0's receive only after its send, which
// waits for rank 1's receive, which waits for rank 1's send, which waits for rank 0's receive: a
// hang. sim models it: the receive is never posted, the watchdog fails it at the group's 1.5 s, and
// Gloo's 3 s ends the rest. As one coalesced group (what NCCL needs: ncclGroupStart/End, PyTorch's
// batch_isend_irecv) both arrive. Removed (fault::Point::kSimNcclOrder, the Gloo lanes as they are),
// the two groups pass, as they would not on a GPU.
TEST_CASE("sim runs a device's groups in order, as NCCL: a send then a receive, both ranks sending first, hangs; coalesced, it passes", "[distributed][sim]") {
  struct Case {
    const char* name;
    bool removed, coalesced;
  };
  for (const Case c : {Case{"chorus_stream_group_nccl_order", false, false}, Case{"chorus_stream_group_nccl_coalesced", false, true},
                       Case{"chorus_stream_group_nccl_removed", true, false}}) {
    INFO(c.name);
    std::optional<fault::RemovedScope> scope;
    if (c.removed) scope.emplace(fault::Point::kSimNcclOrder);
    Tensor got0, got1 = zeros({kStagedN});
    std::string rank1_message, recv_message;
    bool recv_ok = false;
    two_ranks(
        c.name,
        [&](ProcessGroupGloo& g) {
          try {
            g.send(full({kStagedN}, 2.0f), 0, 7)->wait();
            g.recv(got1, 0, 7)->wait();
          } catch (const Error& e) {  // the hang, ended by Gloo's timeout
            rank1_message = e.what();
          }
        },
        [&](StreamOrderedGroup& group, GlooStreamCommunicator&, const std::function<void()>& release) {
          release();
          const Device d0 = Device::sim(0);
          Tensor mine = full({kStagedN}, 1.0f).to(d0);
          got0 = zeros({kStagedN}, {.device = d0});
          std::shared_ptr<Work> recv;
          if (c.coalesced) {
            group.start_coalescing();
            group.send(mine, 1, 7);
            group.recv(got0, 1, 7);
            recv = group.end_coalescing();
          } else {
            group.send(mine, 1, 7);
            recv = group.recv(got0, 1, 7);
          }
          recv->wait_finished();
          recv_ok = recv->is_success();
          if (!recv_ok) {
            try {
              std::rethrow_exception(recv->exception());
            } catch (const Error& e) {
              recv_message = e.what();
            }
          }
        },
        /*gloo_ms=*/3000, /*group_ms=*/1500);
    INFO("rank 0's receive: " << recv_message << "; rank 1: " << rank1_message);
    if (!c.removed && !c.coalesced) {
      CHECK_FALSE(recv_ok);
      CHECK_THAT(recv_message, Catch::Contains("timed out after 1500 ms"));
      CHECK_FALSE(rank1_message.empty());
    } else {
      CHECK(recv_ok);
      CHECK(equal(got0.cpu(), full({kStagedN}, 2.0f)));
      CHECK(equal(got1, full({kStagedN}, 1.0f)));
      CHECK(rank1_message.empty());
    }
  }
}

// A collective on device memory the caller owns (from_blob over part of a sim tensor): record_stream
// refuses such memory, and the group took the refusal after it had issued the collective, so the
// caller got an error for a collective that still ran, with no end event to wait for. Now the group
// holds only the caching allocator's blocks, as the engine does, and the work orders the caller.
TEST_CASE("a collective on device memory from from_blob runs, and its work orders the caller", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_from_blob");
  auto group = one_rank_group(path);
  const Device d = Device::sim(0);
  Tensor base = full({2 * kStagedN}, 3.0f).to(d);
  Tensor v = from_blob(static_cast<float*>(base.raw_data_ptr()) + kStagedN, {kStagedN}, {.device = d});
  auto work = group->allreduce({v});
  work->wait();
  v.mul_(2.0f);  // on the caller's stream, after the collective (the wait ordered it)
  work->wait_finished();
  CHECK(work->is_success());
  CHECK(equal(base.narrow(0, kStagedN, kStagedN).cpu(), full({kStagedN}, 6.0f)));
  CHECK(equal(base.narrow(0, 0, kStagedN).cpu(), full({kStagedN}, 3.0f)));
  synchronize(d);
  std::filesystem::remove(path);
}

// [A receive waits for its stream, as NCCL's] (gloo_communicator.cpp). On a GPU a receive runs when
// its stream gets to it, after the caller's earlier kernels. Rank 0 holds sim:0's stream on a
// page-locked word and then issues a receive; rank 1 (a thread, CPU) sends to it and only then
// releases the word (the peer's send ending is what this rank's compute waits for: a wait cycle).
// chorus's Gloo send waits for its receive to be posted. Kept, rank 0's receive is posted only when
// the stream passes the word, which waits for the send, which waits for the receive: a hang on a
// GPU, and on sim, where the watchdog fails the receive at the group's 1.5 s and Gloo's 3 s ends the
// send. Removed (fault::Point::kSimRecvReady, the lanes posting a receive at once), the send ends
// while the stream is still held, as it could not on a GPU, and the receive gets the twos.
TEST_CASE("sim posts a receive only once its stream reaches it, as NCCL: a send the held stream waits for hangs", "[distributed][sim]") {
  for (const bool removed : {false, true}) {
    INFO((removed ? "removed" : "kept"));
    std::optional<fault::RemovedScope> scope;
    if (removed) scope.emplace(fault::Point::kSimRecvReady);
    std::atomic<uint32_t*> word{nullptr};
    std::promise<void> word_released;
    std::string rank1_message, recv_message;
    bool recv_ok = false, send_ended_while_held = false;
    Tensor got0;
    two_ranks(
        removed ? "chorus_stream_group_recv_ready_removed" : "chorus_stream_group_recv_ready_kept",
        [&](ProcessGroupGloo& g) {
          try {
            g.send(full({kStagedN}, 2.0f), 0, 9)->wait();
            send_ended_while_held = true;  // (the word is released only below)
          } catch (const Error& e) {  // the hang, ended by Gloo's timeout
            rank1_message = e.what();
          }
          std::atomic_ref<uint32_t>(word.load()[0]).store(1, std::memory_order_release);
          word_released.set_value();
        },
        [&](StreamOrderedGroup& group, GlooStreamCommunicator&, const std::function<void()>& release) {
          const Device d0 = Device::sim(0);
          DeviceRuntime& rt = runtime_for(d0, "stream_group_test");
          auto* w = static_cast<uint32_t*>(rt.host_malloc(64));
          w[0] = 0;
          word.store(w);
          got0 = zeros({kStagedN}, {.device = d0});
          const Stream held = current_stream(d0);
          held.synchronize();
          rt.stream_wait_value(held.handle(), w, 1);  // the caller's compute, waiting for the peer
          auto recv = group.recv(got0, 1, 9);
          release();
          recv->wait_finished();
          recv_ok = recv->is_success();
          if (!recv_ok) {
            try {
              std::rethrow_exception(recv->exception());
            } catch (const Error& e) {
              recv_message = e.what();
            }
          }
          word_released.get_future().wait();  // rank 1 writes the word whatever happened
          synchronize(d0);
          rt.host_free(w);
        },
        /*gloo_ms=*/3000, /*group_ms=*/1500);
    INFO("rank 0's receive: " << recv_message << "; rank 1: " << rank1_message);
    if (!removed) {
      CHECK_FALSE(send_ended_while_held);
      CHECK_FALSE(rank1_message.empty());
      CHECK_FALSE(recv_ok);
      CHECK_THAT(recv_message, Catch::Contains("timed out after 1500 ms"));
    } else {
      CHECK(send_ended_while_held);
      CHECK(rank1_message.empty());
      CHECK(recv_ok);
      CHECK(equal(got0.cpu(), full({kStagedN}, 2.0f)));
    }
  }
}

// The Gloo communicator's page-locked staging blocks are one pool per device type, shared by every
// stream it runs on (the group's lanes, every device of the type), and a group's blocks go back to
// it only once its stream has passed the group (its `done` event, release_staging). Rank 0 issues
// allreduce A on sim:0 (ones) and then B on sim:1 (fives); rank 1 joins them (tens, twenties) only
// once both are posted, so both streams have copied their inputs out. Kept, B takes a block of its
// own: A = 1 + 10, B = 5 + 20. Removed (fault::Point::kGlooStagingReuse), A's block goes back at
// B's group_start (A's stream may not even have copied out yet) and B's first-fit block is A's (the
// warm-ups leave the pool's front as it was): both copies-out land in that one block, in either
// order; Gloo, whose process group runs its collectives on one thread in order, runs A there (x +
// 10, x being 1 or 5) and then B on what A left: B = x + 30, never 25.
TEST_CASE("Gloo on sim: a group's staging blocks are not reused by another stream before its stream has passed it", "[distributed][sim]") {
  for (const bool removed : {false, true}) {
    INFO((removed ? "removed" : "kept"));
    if (removed && CHORUS_TSAN) {  // the race it shows is real: ThreadSanitizer reports it and stops the test
      std::printf("CHORUS-SKIP: the staging-reuse control races for real (ThreadSanitizer reports it); it runs in the other builds\n");
      continue;
    }
    std::optional<fault::RemovedScope> scope;
    if (removed) scope.emplace(fault::Point::kGlooStagingReuse);
    Tensor a, b;
    two_ranks(
        removed ? "chorus_stream_group_staging_removed" : "chorus_stream_group_staging_kept",
        rank1_allreduces_10_then_20,
        [&](StreamOrderedGroup& group, GlooStreamCommunicator& comm, const std::function<void()>& release) {
          a = full({kStagedN}, 1.0f).to(Device::sim(0));
          b = full({kStagedN}, 5.0f).to(Device::sim(1));
          auto work_a = group.allreduce({a});
          auto work_b = group.allreduce({b});
          comm.wait_until_issued();  // both posted to Gloo: B's input is in its host block
          release();
          work_a->wait_finished();
          work_b->wait_finished();
        });
    a = a.cpu();
    b = b.cpu();
    INFO("A: " << a.narrow(0, 0, 4) << " B: " << b.narrow(0, 0, 4));
    if (!removed) {
      CHECK(equal(a, full({kStagedN}, 11.0f)));
      CHECK(equal(b, full({kStagedN}, 25.0f)));
    } else {
      CHECK_FALSE(equal(b, full({kStagedN}, 25.0f)));
    }
  }
}

namespace {
// A forward on two streams: the first layer on `side` (ordered after the caller's stream and back),
// the second on the caller's. In backward each layer's gradients come on its own stream (autograd's
// [Backward runs on the forward's streams]), and so do DDP's copies into the bucket.
struct TwoStreamNet : nn::Module {
  std::shared_ptr<nn::Linear> first, second;
  std::optional<Stream> side;
  TwoStreamNet() : nn::Module("TwoStreamNet") {
    manual_seed(31);
    first = register_module("first", std::make_shared<nn::Linear>(6, 8));
    second = register_module("second", std::make_shared<nn::Linear>(8, 3));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h;
    if (side) {
      const Stream caller = current_stream(x.device());
      Event in;
      in.record(caller);
      side->wait(in);
      {
        StreamGuard on_side(*side);
        h = first->forward(x).tanh();
      }
      Event out;
      out.record(*side);
      caller.wait(out);
    } else {
      h = first->forward(x).tanh();
    }
    return second->forward(h);
  }
};
}  // namespace

// distributed/streams_seen.h: DDP (one bucket; gradient_as_bucket_view, so even at world size 1 the
// gradients are copied into it) over a forward on two streams. The bucket fills on both streams and
// is launched from the last gradient's (the first layer's, on the side stream); its collective must
// wait for the caller's stream too. Kept: the gradients equal plain training's bit for bit, and the
// sanitizer finds nothing. Removed (fault::Point::kBucketCopyStreams): the sanitizer reports the
// collective reading the second layer's copies, which nothing ordered before it.
TEST_CASE("DDP over a forward on two streams: a bucket's collective waits for every stream its gradients were copied on", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_two_streams");
  auto group = one_rank_group(path);
  const Device sim0 = Device::sim(0);
  for (const bool removed : {false, true}) {
    INFO((removed ? "removed" : "kept"));
    auto model = std::make_shared<TwoStreamNet>(), ref = std::make_shared<TwoStreamNet>();
    model->to(sim0);
    model->side = stream_from_pool(sim0);
    REQUIRE_FALSE(*model->side == current_stream(sim0));
    DistributedDataParallel ddp(model, group, {.gradient_as_bucket_view = true});
    REQUIRE(ddp.reducer().buckets().size() == 1);
    Generator g(32);
    Tensor x = randn({5, 6}, {.dtype = kFloat64}, &g), y = randint(0, 3, {5}, {.dtype = kInt64}, &g);
    F::cross_entropy(ref->forward(x), y).backward();
    std::optional<fault::RemovedScope> scope;
    if (removed) scope.emplace(fault::Point::kBucketCopyStreams);
    Tensor xd = x.to(sim0), yd = y.to(sim0);
    if (!removed) {
      F::cross_entropy(ddp.forward(xd), yd).backward();
      const auto a = model->named_parameters(), b = ref->named_parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        CHECK(equal(a[i].second.grad().cpu(), b[i].second.grad()));
      }
    } else {
      CHECK_THROWS_WITH(F::cross_entropy(ddp.forward(xd), yd).backward(), Catch::Contains("stream-order sanitizer"));
    }
    synchronize(sim0);
  }
  std::filesystem::remove(path);
}

// distributed/fsdp.cpp, [A reduction's output is read on the caller's stream]: FSDP (world size 1,
// full_shard) over a forward run on a side stream, backward() from the default one, four
// micro-batches accumulated with no host synchronization. Each flat's reduction buffers come from
// the side stream's pool (its last gradient arrives there); after backward the caller's stream adds
// them into the shard's gradient, and then they are dropped. Kept: the next micro-batch's forward
// on the side stream cannot take them before the caller's stream has passed the add, and the
// gradients equal four CPU backward passes bit for bit. Removed (fault::Point::kFsdpReduceOutStream):
// the sanitizer reports the buffer handed out again on the side stream while the add may still read it.
TEST_CASE("FSDP over a forward on a side stream: a reduction's buffers outlive the caller stream's read", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_fsdp_side");
  const Device sim0 = Device::sim(0);
  auto make = [] {
    manual_seed(41);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(6, 8));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(8, 3));
    net->to(kFloat64);
    return net;
  };
  for (const bool removed : {false, true}) {
    INFO((removed ? "removed" : "kept"));
    auto group = one_rank_group(path);
    auto model = make(), ref = make();
    model->to(sim0);
    FullyShardedDataParallel fsdp(pipeline::blocks_of(model), group);
    const Stream side = stream_from_pool(sim0);
    REQUIRE_FALSE(side == current_stream(sim0));
    std::optional<fault::RemovedScope> scope;
    if (removed) scope.emplace(fault::Point::kFsdpReduceOutStream);
    Generator g(42);
    synchronize(sim0);
    auto micro_batches = [&] {
      for (int m = 0; m < 4; ++m) {
        Tensor x = randn({5, 6}, {.dtype = kFloat64}, &g), y = randint(0, 3, {5}, {.dtype = kInt64}, &g);
        F::cross_entropy(ref->forward(x), y).backward();
        Tensor loss;
        {
          StreamGuard on_side(side);
          loss = F::cross_entropy(fsdp.forward({x.to(sim0)})[0], y.to(sim0));
        }
        loss.backward();
      }
    };
    if (!removed) {
      micro_batches();
      const nn::NamedTensors grads = fsdp.named_parameters();
      REQUIRE(grads.size() == 2);
      // The shards at world size 1 are whole flats: the parameters in order, end to end.
      std::vector<Tensor> pieces;
      for (const Tensor& p : ref->parameters()) pieces.push_back(p.grad().reshape({-1}));
      Tensor want = cat(pieces, 0);
      Tensor got = cat({grads[0].second.grad().cpu(), grads[1].second.grad().cpu()}, 0);
      REQUIRE(got.numel() == want.numel());
      CHECK(equal(got, want));
    } else {
      CHECK_THROWS_WITH(micro_batches(), Catch::Contains("stream-order sanitizer"));
    }
    synchronize(sim0);
  }
  std::filesystem::remove(path);
}

// distributed/reducer.cpp, [A bucket is recorded on the streams that used it]: DDP (world size 1,
// bucket views, so the buckets go through the communication stream) made on the default stream,
// its first backward run under a side stream. That iteration's rebuild drops the buckets made at
// construction, which came from the default stream's pool and were last read on the side stream
// (the rebuild copies the gradients, views of them, into the new buckets); they are freed when the
// DDP is destroyed, from the default stream. The host then waits for a collective issued from the
// default stream (the communication stream has passed the buckets' collectives; nothing the side
// stream did after them is ordered for the host) and allocates the old
// buckets' sizes on the default stream until it is handed memory of an old bucket. Kept: that
// happens once the side stream has passed its reads, with no report, and the gradients are plain
// training's bit for bit. Removed (fault::Point::kDdpBucketRecordStream): the sanitizer refuses the
// hand-out while the side stream may still read the memory. And [A bucket's first writes wait for
// its fill]: removed (kDdpBucketFillOrder), the side stream's first copy into a bucket is
// reported, unordered with the zeros the default stream wrote into it.
TEST_CASE("DDP made on the default stream and trained on a side stream: dropped buckets outlive the side stream's reads", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_ddp_side");
  const Device sim0 = Device::sim(0);
  auto make = [] {
    manual_seed(43);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(8, 16));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(16, 3));
    net->to(kFloat64);
    return net;
  };
  for (const std::string mode : {"kept", "ddp_bucket_record_stream removed", "ddp_bucket_fill_order removed"}) {
    INFO(mode);
    const bool removed = mode == "ddp_bucket_record_stream removed";
    auto group = one_rank_group(path);
    auto model = make(), ref = make();
    model->to(sim0);
    synchronize(sim0);
    std::optional<fault::RemovedScope> fill_scope;
    if (mode == "ddp_bucket_fill_order removed") fill_scope.emplace(fault::Point::kDdpBucketFillOrder);
    std::optional<DistributedDataParallel> ddp;
    ddp.emplace(model, group,
                DDPOptions{.bucket_cap_mb = 0.0003, .first_bucket_cap_mb = 0.0003, .gradient_as_bucket_view = true});
    std::vector<std::pair<uintptr_t, size_t>> old;
    for (const Bucket& b : ddp->reducer().buckets()) {
      old.emplace_back(reinterpret_cast<uintptr_t>(b.buffer.raw_data_ptr()), b.buffer.nbytes());
    }
    REQUIRE(old.size() > 1);
    const Stream side = stream_from_pool(sim0);
    REQUIRE_FALSE(side == current_stream(sim0));
    std::optional<fault::RemovedScope> scope;
    if (removed) scope.emplace(fault::Point::kDdpBucketRecordStream);
    Generator g(44);
    Tensor x = randn({5, 8}, {.dtype = kFloat64}, &g), y = randint(0, 3, {5}, {.dtype = kInt64}, &g);
    F::cross_entropy(ref->forward(x), y).backward();
    if (fill_scope) {
      // The buckets' zeros were written on the default stream; the side stream's first copy into
      // them is unordered with that without the wait.
      StreamGuard on_side(side);
      CHECK_THROWS_WITH(F::cross_entropy(ddp->forward(x.to(sim0)), y.to(sim0)).backward(),
                        Catch::Contains("stream-order sanitizer") && Catch::Contains("fill on stream 0"));
      synchronize(sim0);
      continue;
    }
    {
      StreamGuard on_side(side);
      F::cross_entropy(ddp->forward(x.to(sim0)), y.to(sim0)).backward();
    }
    for (const Bucket& b : ddp->reducer().buckets()) {
      const auto p = reinterpret_cast<uintptr_t>(b.buffer.raw_data_ptr());
      for (const auto& [q, bytes] : old) REQUIRE(p != q);  // rebuilt
    }
    ddp.reset();  // the old buckets go (the first iterations' statistics held them until now)
    Tensor one = zeros({1}, {.dtype = kFloat64, .device = sim0});
    group->allreduce({one})->wait_finished();
    auto overlaps_old = [&](const Tensor& t) {
      const auto p = reinterpret_cast<uintptr_t>(t.raw_data_ptr());
      for (const auto& [q, bytes] : old)
        if (p < q + bytes && q < p + t.nbytes()) return true;
      return false;
    };
    bool handed_out = false;
    std::string error;
    std::vector<Tensor> held;  // held, so each allocation takes memory not yet handed out
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    try {
      while (!handed_out && held.size() < 20000 && std::chrono::steady_clock::now() < deadline) {
        for (const auto& [q, bytes] : old) {
          held.push_back(empty({static_cast<int64_t>(bytes / sizeof(double))}, {.dtype = kFloat64, .device = sim0}));
          handed_out = handed_out || overlaps_old(held.back());
        }
      }
    } catch (const Error& e) {
      error = e.what();
    }
    held.clear();
    synchronize(sim0);
    if (removed) {
      CHECK_THAT(error, Catch::Contains("stream-order sanitizer") && Catch::Contains("handed out again on stream 0") &&
                            Catch::Contains("may still read it"));
    } else {
      CHECK(error.empty());
      CHECK(handed_out);
      const auto a = model->named_parameters(), b = ref->named_parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        CHECK(equal(a[i].second.grad().cpu(), b[i].second.grad()));
      }
    }
  }
  std::filesystem::remove(path);
}

// A communication hook that returns no Work is an error naming the bucket (it was a null
// dereference); a NaN bucket cap is refused; an infinite cap means one bucket (it was cast to
// INT64_MIN: a bucket per parameter).
TEST_CASE("DDP refuses a hook that returns no Work and a NaN bucket cap; an infinite cap is one bucket", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_ddp_options");
  auto group = one_rank_group(path);
  auto make = [] {
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(6, 5));
    net->push_back(std::make_shared<nn::Linear>(5, 3));
    return net;
  };
  CHECK_THROWS_WITH(DistributedDataParallel(make(), group, {.bucket_cap_mb = std::nan("")}),
                    Catch::Contains("bucket caps must be positive, got bucket_cap_mb=nan"));
  CHECK_THROWS_WITH(DistributedDataParallel(make(), group, {.first_bucket_cap_mb = std::nan("")}),
                    Catch::Contains("first_bucket_cap_mb=nan"));
  DistributedDataParallel whole(make(), group, {.bucket_cap_mb = INFINITY, .first_bucket_cap_mb = INFINITY});
  CHECK(whole.reducer().buckets().size() == 1);
  DistributedDataParallel split(make(), group, {.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9});
  CHECK(split.reducer().buckets().size() == 4);
  for (const Device device : {kCPU, Device::sim(0)}) {
    INFO(device.str());
    auto net = make();
    net->to(device);
    DistributedDataParallel hooked(net, group);
    hooked.register_comm_hook([](ProcessGroup&, Bucket&) { return std::shared_ptr<Work>(); });
    Tensor x = randn({4, 6}).to(device), y = randint(0, 3, {4}).to(device);
    CHECK_THROWS_WITH(F::cross_entropy(hooked.forward(x), y).backward(),
                      Catch::Contains("the communication hook returned no Work for bucket 0"));
    if (!device.is_cpu()) synchronize(device);
  }
  std::filesystem::remove(path);
}

// DDP destroyed while its allreduces are still queued on the communication stream (slow sim
// streams): a device work's wait() only orders the current stream, so the reducer must wait on the
// host for the works before freeing its buckets, and must not hand a completion callback a pointer
// into buckets that the first iteration's rebuild replaces (AddressSanitizer runs this test). The
// gradients, read after the device has synchronized, are plain training's.
TEST_CASE("DDP on sim:0 destroyed with its allreduces still on the communication stream", "[distributed][sim][tsan]") {
  const std::string path = store_path("chorus_stream_group_teardown_store");
  std::filesystem::remove(path);
  auto group = std::make_shared<StreamOrderedGroup>(std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 1));
  const Device sim0 = Device::sim(0);
  auto make = [] {
    manual_seed(5);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(8, 16));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(16, 3));
    net->to(kFloat64);
    return net;
  };
  Generator g(6);
  for (int steps = 1; steps <= 2; ++steps) {
    INFO("backward passes before the DDP is destroyed: " << steps);
    auto model = make(), ref = make();
    model->to(sim0);
    Tensor x = randn({5, 8}, {.dtype = kFloat64}, &g), y = randint(0, 3, {5}, {.dtype = kInt64}, &g);
    {
      DistributedDataParallel ddp(model, group,
                                  {.bucket_cap_mb = 0.0003, .first_bucket_cap_mb = 0.0003, .gradient_as_bucket_view = true});
      REQUIRE(ddp.reducer().buckets().size() > 1);
      sim::set_delay_us(3000);  // a random 0..3 ms before every stream task
      for (int s = 0; s < steps; ++s) {
        model->zero_grad();
        F::cross_entropy(ddp.forward(x.to(sim0)), y.to(sim0)).backward();
      }
    }
    synchronize(sim0);
    sim::set_delay_us(0);
    F::cross_entropy(ref->forward(x), y).backward();
    const auto a = model->named_parameters(), b = ref->named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(allclose(a[i].second.grad().cpu(), b[i].second.grad(), 1e-12, 1e-12));
    }
  }
  std::filesystem::remove(path);
}

// Each collective's span on the communication stream is measured by its timed events: positive,
// and within the host's measure of the whole call (issue to completion).
TEST_CASE("a stream work reports its span on the communication stream from events", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_timing_store");
  std::filesystem::remove(path);
  auto group = std::make_shared<StreamOrderedGroup>(std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 1));
  sim::set_delay_us(20000);  // a random 0..20 ms before every stream task
  Tensor t = ones({1000}).to(Device::sim(0));
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto work = std::dynamic_pointer_cast<StreamWork>(group->allreduce({t}));
    REQUIRE(work);
    if (i == 0) CHECK_THROWS_WITH(work->elapsed_ms(), Catch::Contains("before the work has completed"));
    work->synchronize();
    const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    CHECK(work->elapsed_ms() > 0.0);
    CHECK(work->elapsed_ms() <= host_ms);
  }
  sim::set_delay_us(0);
  std::filesystem::remove(path);
}

}  // namespace chorus::distributed

namespace chorus::distributed {
namespace {

// The test communicators below implement allreduce only; any other collective is an error naming them.
class AllreduceOnlyCommunicator : public Communicator {
 public:
  void broadcast(const TensorList&, int, const Stream&, const std::shared_ptr<StreamWork>&) override { unused(); }
  void allgather(const TensorList&, const Tensor&, const Stream&, const std::shared_ptr<StreamWork>&) override { unused(); }
  void reduce_scatter(const Tensor&, const TensorList&, ReduceOp, const Stream&, const std::shared_ptr<StreamWork>&) override {
    unused();
  }
  void all_to_all(const TensorList&, const TensorList&, const Stream&, const std::shared_ptr<StreamWork>&) override {
    unused();
  }
  void send(const Tensor&, int, int, const Stream&, const std::shared_ptr<StreamWork>&) override { unused(); }
  void recv(const Tensor&, int, int, const Stream&, const std::shared_ptr<StreamWork>&) override { unused(); }

 private:
  [[noreturn]] void unused() const { fail("{}: only allreduce is used", name()); }
};

// A communicator whose first allreduce of a group queues a kernel on the communication stream that
// is held until the test opens `gate` and then writes 7 into its tensor, and whose second throws, as
// a NCCL op refused after an earlier op of its group was queued (its ncclGroupEnd launches that one).
class PartlyFailingCommunicator final : public AllreduceOnlyCommunicator {
 public:
  std::atomic<int> gate{0};
  std::string name() const override { return "partly-failing"; }
  void allreduce(const TensorList& tensors, ReduceOp, const Stream& s, const std::shared_ptr<StreamWork>&) override {
    if (calls_++ > 0) fail("partly-failing: the second op of the group is refused");
    auto* p = static_cast<float*>(tensors[0].raw_data_ptr());
    const int64_t n = tensors[0].numel();
    sim::launch_kernel(s.handle(), [this, p, n] {
      while (gate.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::fill(p, p + n, 7.0f);
    }, {p});
  }
  void group_start() override { calls_ = 0; }
  void group_end() override {}
  void abort(const std::string&) override {}

 private:
  int calls_ = 0;
};

// A communicator whose allreduce queues a kernel that waits for a peer that never comes, as an NCCL
// kernel does once its peer has gone: it ends only when the communicator is aborted (or the test
// releases it).
class PeerGoneCommunicator final : public AllreduceOnlyCommunicator {
 public:
  std::atomic<bool> released{false};
  std::atomic<bool> report_error{false};  // async_error() reports the peer gone, as NCCL's may
  std::string name() const override { return "peer-gone"; }
  std::optional<std::string> async_error() override {
    if (report_error) return std::string("peer-gone: the remote peer closed its connection");
    return std::nullopt;
  }
  void allreduce(const TensorList& tensors, ReduceOp, const Stream& s, const std::shared_ptr<StreamWork>&) override {
    auto* p = static_cast<float*>(tensors[0].raw_data_ptr());
    sim::launch_kernel(s.handle(), [this, p] {
      while (!released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      *p = 0.0f;
    }, {p});
  }
  void group_start() override {}
  void group_end() override {}
  void abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_with_ = why;
    }
    released = true;
  }
  std::string aborted_with() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return aborted_with_;
  }

 private:
  mutable std::mutex mutex_;
  std::string aborted_with_;
};

}  // namespace

// [A group that fails partway] (distributed/stream_group.cpp): a coalesced group whose second op is
// refused after its first was queued on the communication stream. The error reaches the caller;
// the caller's stream waits for what was queued (its next kernel is held while the op is; without
// the wait it ran at once), and the first op's tensor, from a side stream's pool, is not reused while
// that op still writes it (a tensor of the same size made on the side stream after it is dropped,
// filled with 1, still reads 1 after the op has written its 7s; without the hold it took the
// dropped one's block at once and read 7).
TEST_CASE("a coalesced group refused partway holds its tensors and orders the caller's stream after what it queued", "[distributed][sim]") {
  const std::string path = store_path("chorus_stream_group_partway");
  std::filesystem::remove(path);
  auto host = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 1, GlooOptions{});
  auto comm = std::make_shared<PartlyFailingCommunicator>();
  {
    auto group = std::make_shared<StreamOrderedGroup>(
        host, StreamOrderedGroup::DeviceCommunicators{{DeviceType::Sim, comm}}, std::chrono::milliseconds(60000),
        "cpu:gloo,sim:partly-failing");
    const Device dev = Device::sim(0);
    const DeviceGuard current(dev);
    // The first op's tensor comes from a side stream's pool, where nothing waits for the caller: a
    // stream with a hardware queue of its own, so that the caller's wait below does not hold its
    // work too (sim's default is one queue per device, [Shared hardware queues]).
    sim::set_connections(0);
    const Stream side(dev, runtime_for(dev, "stream_group_test").create_stream(0, false));
    sim::set_connections(sim::kDefaultConnections);
    const Stream caller = current_stream(dev);
    Tensor a;
    {
      const StreamGuard on_side(side);
      a = ones({4096}, {.device = dev});
    }
    Tensor b = ones({4096}, {.device = dev});
    synchronize(dev);
    group->start_coalescing();
    group->allreduce({a});
    group->allreduce({b});
    CHECK_THROWS_WITH(group->end_coalescing(), Catch::Contains("the second op of the group is refused"));
    // The caller's next kernel is held behind the op for 300 ms (without the wait it runs, and the
    // stream is idle, at once).
    Tensor b_sum = b.sum();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (!caller.query() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK_FALSE(caller.query());
    a = Tensor();  // the caller drops the first op's tensor while that op is held on the stream
    Tensor c;
    {
      const StreamGuard on_side(side);
      c = ones({4096}, {.device = dev});  // runs at once on the side stream
    }
    comm->gate = 1;
    synchronize(dev);
    CHECK(b_sum.item<double>() == 4096.0);
    CHECK(c.sum().item<double>() == 4096.0);
  }
  std::filesystem::remove(path);
}

namespace {

// One group on sim:0 with a PeerGoneCommunicator and the given timeout: an allreduce is issued, then
// the group is destroyed on a thread of its own. `during` runs while the destructor may be waiting.
// Without the destructor's own timeout the destroy never returns: the test releases the kernel after
// `rescue` (only that hang reaches it) and says so.
struct DestroyOutcome {
  bool rescued = false;
  double seconds = 0;  // from the allreduce's issue to the destructor's return
  std::string aborted_with;
  std::shared_ptr<Work> work;
};
DestroyOutcome destroy_with_allreduce_in_flight(std::chrono::milliseconds timeout, std::chrono::seconds rescue,
                                                const std::function<void(PeerGoneCommunicator&)>& during) {
  const std::string path = store_path("chorus_stream_group_peer_gone");
  std::filesystem::remove(path);
  auto host = std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 1, GlooOptions{});
  auto comm = std::make_shared<PeerGoneCommunicator>();
  const Device dev = Device::sim(0);
  Tensor t = ones({16}).to(dev);
  auto group = std::make_shared<StreamOrderedGroup>(host, StreamOrderedGroup::DeviceCommunicators{{DeviceType::Sim, comm}},
                                                    timeout, "cpu:gloo,sim:peer-gone");
  DestroyOutcome out;
  const auto start = std::chrono::steady_clock::now();
  out.work = group->allreduce({t});
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&destroyed, g = std::move(group)]() mutable {
    g.reset();
    destroyed = true;
  });
  during(*comm);
  while (!destroyed && std::chrono::steady_clock::now() - start < rescue) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  out.rescued = !destroyed;
  if (out.rescued) comm->released = true;
  destroyer.join();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.aborted_with = comm->aborted_with();
  synchronize(dev);
  CHECK(t.cpu().sum().item<double>() == 15.0);  // the kernel ran once released: its one write landed
  std::filesystem::remove(path);
  return out;
}

}  // namespace

// [A destroyed group ends its works as the watchdog would] (distributed/stream_group.cpp): a group
// destroyed while a collective waits for a peer that has gone (NCCL's case: its kernel runs until the
// communicator is aborted). The destructor has stopped the watchdog, so it must itself abort the
// communicator once the work is past the group's timeout (counted from the issue), or at once when
// the communicator reports an error; the work ends failed, naming why. A work that ends within the
// timeout is left alone. Removed (group_destroy_aborts), the destructor waits forever: the test
// releases the kernel after 6 s.
TEST_CASE("a group destroyed with a collective whose peer has gone aborts the communicator at the group's timeout", "[distributed][sim]") {
  const auto nothing = [](PeerGoneCommunicator&) {};
  {
    INFO("the peer never comes: aborted at the group's 3 s timeout");
    const DestroyOutcome o = destroy_with_allreduce_in_flight(std::chrono::milliseconds(3000), std::chrono::seconds(60), nothing);
    CHECK_FALSE(o.rescued);
    CHECK(o.seconds >= 3.0);
    CHECK_THAT(o.aborted_with, Catch::Contains("allreduce #1 on sim:0") && Catch::Contains("as the group was destroyed") &&
                                   Catch::Contains("timed out after 3000 ms"));
    REQUIRE(o.work->is_completed());
    CHECK_FALSE(o.work->is_success());
  }
  {
    // Reported 500 ms into the destruction, whose first step stops the watchdog (had the watchdog
    // still seen it, it would have aborted with the same error; the destructor's own message is
    // checked in the timeout case above).
    INFO("the communicator reports the peer gone: aborted long before the 60 s timeout, naming the communicator's error");
    const DestroyOutcome o = destroy_with_allreduce_in_flight(std::chrono::milliseconds(60000), std::chrono::seconds(30),
                                                              [](PeerGoneCommunicator& c) {
                                                                std::this_thread::sleep_for(std::chrono::milliseconds(500));
                                                                c.report_error = true;
                                                              });
    CHECK_FALSE(o.rescued);
    CHECK_THAT(o.aborted_with, Catch::Contains("the remote peer closed its connection"));
    REQUIRE(o.work->is_completed());
    CHECK_FALSE(o.work->is_success());
  }
  {
    INFO("the collective ends within the timeout: nothing aborted, the work a success");
    const DestroyOutcome o = destroy_with_allreduce_in_flight(std::chrono::milliseconds(60000), std::chrono::seconds(30),
                                                              [](PeerGoneCommunicator& c) {
                                                                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                                                                c.released = true;
                                                              });
    CHECK_FALSE(o.rescued);
    CHECK(o.aborted_with.empty());
    REQUIRE(o.work->is_completed());
    CHECK(o.work->is_success());
  }
  {
    INFO("removed: the destructor waits until the test releases the kernel");
    fault::RemovedScope plain(fault::Point::kGroupDestroyAborts);
    const DestroyOutcome o = destroy_with_allreduce_in_flight(std::chrono::milliseconds(1000), std::chrono::seconds(6), nothing);
    CHECK(o.rescued);
    CHECK(o.aborted_with.empty());
  }
}

}  // namespace chorus::distributed
