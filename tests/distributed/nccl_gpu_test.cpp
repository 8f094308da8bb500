// ProcessGroupNCCL on a GPU at world size 1 (NCCL refuses two ranks on one GPU): every collective
// and dtype through the communication stream, ordered by events, against the expected values;
// Work::wait() orders the current stream without blocking; results survive the caller dropping
// its tensors; DDP over NCCL equals plain training. Runs where a GPU is (tag "gpu"; tools/gpu_bundle.sh).
#include <catch2/catch.hpp>

#include <filesystem>
#include <algorithm>
#include <functional>

#include "distributed/ddp.h"
#include "distributed/nccl.h"
#include "distributed/store.h"
#include "distributed/init.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "distributed/stream_group.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus::distributed {

TEST_CASE("NCCL collectives at world size 1 on cuda:0", "[distributed][nccl][gpu]") {
  REQUIRE(device_count(DeviceType::CUDA) > 0);
  const std::string path = std::filesystem::temp_directory_path() / "chorus_nccl_gpu_store";
  std::filesystem::remove(path);
  auto pg = init_process_group({.backend = "nccl", .init_method = "file://" + path, .rank = 0, .world_size = 1});
  REQUIRE(pg->backend_name() == "nccl");
  const Device cuda = Device::cuda(0);
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    INFO(dtype_name(dt));
    Tensor host = arange(0, 1000, 1, TensorOptions{.dtype = dt});
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      Tensor t = host.to(cuda);
      auto work = pg->allreduce({t}, op);
      work->wait();  // orders the current stream: the copy below sees the result
      CHECK(equal(t.cpu(), host));  // one rank: every reduction is the identity
    }
    Tensor b = host.to(cuda);
    pg->broadcast({b}, 0)->wait();
    CHECK(equal(b.cpu(), host));
    Tensor out = zeros({1000}, {.dtype = dt, .device = cuda});
    pg->allgather({out}, host.to(cuda))->wait();
    CHECK(equal(out.cpu(), host));
    Tensor rs = zeros({1000}, {.dtype = dt, .device = cuda});
    pg->reduce_scatter(rs, {host.to(cuda)})->wait();
    CHECK(equal(rs.cpu(), host));
    Tensor a2a = zeros({1000}, {.dtype = dt, .device = cuda});
    pg->all_to_all({a2a}, {host.to(cuda)})->wait();
    CHECK(equal(a2a.cpu(), host));
  }
  // A coalesced group (ncclGroupStart/End around three ops): one Work for all.
  {
    Tensor a = ones({100}, {.device = cuda}), b = full({7}, 2.0, {.device = cuda}), c = arange(0, 9, 1).to(cuda);
    pg->start_coalescing();
    pg->allreduce({a});
    pg->allreduce({b}, ReduceOp::Max);
    pg->broadcast({c}, 0);
    auto work = pg->end_coalescing();
    work->wait();
    CHECK(work->result().size() == 3);
    CHECK(a.sum().item<double>() == 100.0);
    CHECK(b.sum().item<double>() == 14.0);
    CHECK(equal(c.cpu(), arange(0, 9, 1)));
  }
  // Two reduce_scatters in one coalesced group: each reads its own inputs (their stacked copies live
  // until ncclGroupEnd; freed at once, the second stack took the first's block and both read it).
  {
    Tensor o1 = zeros({1000}, {.device = cuda}), o2 = zeros({1000}, {.device = cuda});
    Tensor i1 = ones({1000}, {.device = cuda}), i2 = arange(0, 1000, 1, TensorOptions{.dtype = kFloat32}).to(cuda);
    pg->start_coalescing();
    pg->reduce_scatter(o1, {i1});
    pg->reduce_scatter(o2, {i2});
    pg->end_coalescing()->wait();
    CHECK(equal(o1.cpu(), ones({1000})));
    CHECK(equal(o2.cpu(), arange(0, 1000, 1, TensorOptions{.dtype = kFloat32})));
  }
  // The "cpu:gloo,cuda:nccl" spec is the same group as "nccl"; a sim tensor has no backend in it.
  CHECK(parse_backend("cpu:gloo,cuda:nccl").devices.size() == 1);
  // A large allreduce issued after a long compute-stream kernel still reads its final input.
  Tensor x = ones({1 << 24}, {.device = cuda});
  Tensor y = x * 3.0 + 1.0;
  pg->allreduce({y})->wait();
  CHECK(y.sum().item<double>() == 4.0 * (1 << 24));
  // synchronize() blocks the host until the collective is done.
  auto w = std::dynamic_pointer_cast<StreamWork>(pg->allreduce({y}));
  REQUIRE(w);
  w->synchronize();
  CHECK(w->is_completed());

  // DDP over NCCL at world size 1 equals plain training on the GPU (the buckets, the communication
  // stream and its events all run; the average over one rank is the gradient itself), and a step
  // (backward + update) does not block the host.
  auto make = [] {
    manual_seed(5);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(16, 32));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Linear>(32, 4));
    net->to(Device::cuda(0));
    return net;
  };
  auto ddp_net = make(), plain = make();
  // gradient_as_bucket_view: at world size 1 the reducer would otherwise skip the (identity) allreduce.
  DistributedDataParallel ddp(ddp_net, pg,
                              {.bucket_cap_mb = 0.001, .first_bucket_cap_mb = 0.001, .gradient_as_bucket_view = true});
  optim::SGD opt_a(ddp_net->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt_b(plain->parameters(), {.lr = 0.1, .momentum = 0.9});
  Generator g(9);
  for (int step = 0; step < 10; ++step) {
    Tensor xb = randn({8, 16}, {}, &g).to(cuda), yb = randint(0, 4, {8}, {.dtype = kInt64}, &g).to(cuda);
    opt_a.zero_grad();
    opt_b.zero_grad();
    Tensor la = nn::functional::cross_entropy(ddp.forward(xb), yb);
    const uint64_t syncs = host_sync_count();
    la.backward();
    opt_a.step();
    if (step >= 2) CHECK(host_sync_count() == syncs);
    nn::functional::cross_entropy(plain->forward(xb), yb).backward();
    opt_b.step();
  }
  const auto a = ddp_net->named_parameters(), b = plain->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(allclose(a[i].second.cpu(), b[i].second.cpu(), 1e-5, 1e-6));
  }
  destroy_process_group();
  std::filesystem::remove(path);
}

// What can differ from an identity at world size 1: a send or receive to itself is refused with a
// clear error (NCCL would wait for its own matching call forever), and the watchdog's timeout and
// abort: a collective whose start waits behind about a second of compute (calibrated) on the caller's stream outlives a
// 100 ms timeout, the communicator is aborted, the work fails naming the timeout, and every later
// call on the group fails naming that first failure (as a hung peer would make it at world size 2).
TEST_CASE("NCCL at world size 1: sends to itself refused; a timed-out collective aborts the group", "[distributed][nccl][gpu]") {
  REQUIRE(device_count(DeviceType::CUDA) > 0);
  const std::string path = std::filesystem::temp_directory_path() / "chorus_nccl_gpu_timeout_store";
  std::filesystem::remove(path);
  auto store = std::make_shared<FileStore>(path);
  auto pg = make_process_group_nccl(store, 0, 1, {.timeout = std::chrono::milliseconds(100)});
  const Device cuda = Device::cuda(0);
  Tensor t = arange(0, 4096, 1).to(cuda);
  auto expect_error = [](const std::function<void()>& f, const std::string& part) {
    try {
      f();
    } catch (const std::exception& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
      return;
    }
    FAIL("no error; expected one containing '" << part << "'");
  };
  expect_error([&] { pg->send(t, 0); }, "destination 0 is not another rank");
  expect_error([&] { pg->recv(t, 0); }, "source 0 is not another rank");
  pg->allreduce({t})->wait();  // the group works before the timeout
  CHECK(equal(t.cpu(), arange(0, 4096, 1)));

  // About a second of compute on the current stream: ten products timed first (TF32 makes an 8192^3
  // product a few milliseconds on an H200), then as many as a second takes. Large products keep
  // the launch queue (about a thousand launches deep, beyond which the host waits) well over the
  // timeout's worth of work when the collective is issued.
  const Stream compute = current_stream(cuda);
  Tensor a = randn({8192, 8192}, {.device = cuda}), w = randn({8192, 8192}, {.device = cuda}), c;
  auto products = [&](int n) {
    for (int i = 0; i < n; ++i) c = matmul(a, w);
  };
  Event t0(/*enable_timing=*/true), t1(/*enable_timing=*/true);
  t0.record(compute);
  products(10);
  t1.record(compute);
  t1.synchronize();
  const double per_product_ms = std::max(t0.elapsed_time(t1) / 10, 1e-3);
  const int n = static_cast<int>(std::min(1000.0 / per_product_ms, 200000.0)) + 1;
  INFO("an 8192^3 product: " << per_product_ms << " ms; queued " << n);
  Event before(/*enable_timing=*/true), after(/*enable_timing=*/true);
  before.record(compute);
  products(n);
  after.record(compute);
  auto late = std::dynamic_pointer_cast<StreamWork>(pg->allreduce({c}));
  REQUIRE(late);
  expect_error([&] { late->synchronize(); }, "timed out after 100 ms");
  after.synchronize();
  CHECK(before.elapsed_time(after) > 100.0);  // the collective really waited longer than the timeout
  expect_error([&] { pg->allreduce({t}); }, "timed out after 100 ms");
  std::filesystem::remove(path);
}

}  // namespace chorus::distributed
