// ProcessGroupNCCL on a GPU at world size 1 (NCCL refuses two ranks on one GPU): every collective
// and dtype through the communication stream, ordered by events, against the expected values;
// Work::wait() orders the current stream without blocking; results survive the caller dropping
// its tensors; DDP over NCCL equals plain training. Runs where a GPU is (tag "gpu"; tools/gpu_bundle.sh).
#include <catch2/catch.hpp>

#include <filesystem>

#include "distributed/ddp.h"
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

}  // namespace chorus::distributed
