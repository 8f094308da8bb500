// ProcessGroupNCCL where there is no GPU (CI): asking for backend "nccl" must be a clear
// chorus::Error saying there is no CUDA device, not a crash or a hang.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>

#include "distributed/init.h"
#include "distributed/nccl.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus::distributed {

TEST_CASE("backend nccl without a GPU raises 'no CUDA device'", "[distributed][nccl]") {
  // The target runs with CUDA_VISIBLE_DEVICES set empty (tests/distributed/BUILD): on a machine
  // with a GPU it sees none either.
  INFO("CUDA_VISIBLE_DEVICES=" << (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)"));
  REQUIRE(device_count(DeviceType::CUDA) == 0);
  const std::string path = std::filesystem::temp_directory_path() / "chorus_nccl_test_store";
  std::filesystem::remove(path);
  REQUIRE_THROWS_WITH(init_process_group({.backend = "nccl", .init_method = "file://" + path, .rank = 0, .world_size = 1}),
                      Catch::Contains("no CUDA device"));
  REQUIRE_THROWS_WITH(make_process_group_nccl(std::make_shared<FileStore>(path), 0, 1), Catch::Contains("no CUDA device"));
  std::filesystem::remove(path);
  REQUIRE_THROWS_WITH(
      init_process_group({.backend = "cpu:gloo,cuda:nccl", .init_method = "file://" + path, .rank = 0, .world_size = 1}),
      Catch::Contains("no CUDA device"));
  std::filesystem::remove(path);
}

TEST_CASE("backend specs: device:backend pairs as PyTorch's, with clear errors", "[distributed][nccl]") {
  auto spec = parse_backend("cpu:gloo, cuda:nccl");
  REQUIRE(spec.devices.size() == 1);
  CHECK(spec.devices[0].first == DeviceType::CUDA);
  CHECK(spec.devices[0].second == "nccl");
  CHECK(parse_backend("gloo").devices.size() == 2);  // sim and cuda through Gloo on the stream
  CHECK(parse_backend("nccl").devices.size() == 1);
  CHECK(parse_backend("cpu:gloo,sim:gloo").devices.size() == 1);
  CHECK_THROWS_WITH(parse_backend("mpi"), Catch::Contains("unknown backend 'mpi'") && Catch::Contains("cpu:gloo,cuda:nccl"));
  CHECK_THROWS_WITH(parse_backend("cpu:nccl"), Catch::Contains("cpu tensors need gloo"));
  CHECK_THROWS_WITH(parse_backend("sim:nccl"), Catch::Contains("nccl runs on cuda tensors only"));
  CHECK_THROWS_WITH(parse_backend("tpu:gloo"), Catch::Contains("unknown device 'tpu'"));
  CHECK_THROWS_WITH(parse_backend("cuda:gloo,cuda:nccl"), Catch::Contains("names cuda twice"));
  CHECK_THROWS_WITH(parse_backend("cpu:gloo,cuda"), Catch::Contains("'cuda' is not device:backend"));
  // This binary links //distributed:nccl, which registers itself; gloo is built in.
  CHECK(has_device_backend("nccl"));
  CHECK(has_device_backend("gloo"));
  CHECK_FALSE(has_device_backend("mpi"));

  // A group without a backend for sim tensors says so at the first collective on one.
  const std::string path = std::filesystem::temp_directory_path() / "chorus_backend_spec_store";
  std::filesystem::remove(path);
  auto pg = init_process_group({.backend = "cpu:gloo", .init_method = "file://" + path, .rank = 0, .world_size = 1});
  CHECK(pg->backend_name() == "cpu:gloo");
  Tensor t = ones({4});
  pg->allreduce({t})->wait();
  CHECK_THROWS_WITH(pg->allreduce({t.to(Device::sim(0))}),
                    Catch::Contains("no backend for sim tensors") && Catch::Contains("cpu:gloo,sim:gloo"));
  destroy_process_group();
  std::filesystem::remove(path);
}

}  // namespace chorus::distributed
