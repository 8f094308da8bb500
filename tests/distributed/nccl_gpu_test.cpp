// ProcessGroupNCCL on a GPU at world size 1 (NCCL refuses two ranks on one GPU): every collective
// and dtype through the communication stream, ordered by events, against the expected values;
// Work::wait() orders the current stream without blocking; results survive the caller dropping
// its tensors. Runs where a GPU is (tag "gpu"; tools/gpu_bundle.sh).
#include <catch2/catch.hpp>

#include <filesystem>

#include "distributed/init.h"
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
  }
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
  destroy_process_group();
  std::filesystem::remove(path);
}

}  // namespace chorus::distributed
