// ProcessGroupNCCL where there is no GPU (CI): asking for backend "nccl" must be a clear
// chorus::Error saying there is no CUDA device, not a crash or a hang.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <future>

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

// distributed/nccl.cpp, [NCCL ids by the order communicators are made]: two ranks driving different
// devices (rank 0 on cuda:0, rank 1 on cuda:1, as chorusrun places them on a two-GPU node) agree on
// the id of each communicator they make, in the order they make them. Keyed by the device's index,
// as until 2026-12-04, rank 1 would wait for an id rank 0 never publishes (here: the store's timeout).
// A rank whose rank 0 never publishes gets an error naming itself, its device and the key.
TEST_CASE("NCCL unique ids: ranks on different devices agree, communicator by communicator", "[distributed][nccl]") {
  const std::string path = std::filesystem::temp_directory_path() / ("chorus_nccl_id_store_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  const std::chrono::milliseconds timeout(3000);
  int made = 0;
  auto run_rank = [&](int rank, int device) {
    FileStore store(path, timeout);
    std::vector<Bytes> ids;
    for (size_t index = 0; index < 2; ++index) {
      ids.push_back(agree_nccl_unique_id(store, rank, index, Device::cuda(device), [&] {
        ++made;
        return Bytes(128, static_cast<uint8_t>(17 + index));
      }));
    }
    return ids;
  };
  auto rank1 = std::async(std::launch::async, run_rank, 1, 1);
  const std::vector<Bytes> ids0 = run_rank(0, 0);
  const std::vector<Bytes> ids1 = rank1.get();
  CHECK(made == 2);  // only rank 0 makes ids
  REQUIRE(ids0.size() == 2);
  CHECK(ids0 == ids1);
  CHECK(ids0[0] == Bytes(128, 17));
  CHECK(ids0[1] == Bytes(128, 18));
  std::filesystem::remove(path);

  FileStore alone(path, std::chrono::milliseconds(200));
  CHECK_THROWS_WITH(agree_nccl_unique_id(alone, 1, 0, Device::cuda(1), [] { return Bytes(128, 0); }),
                    Catch::Contains("rank 1 (cuda:1)") && Catch::Contains("communicator #0") &&
                        Catch::Contains("nccl_unique_id_0") && Catch::Contains("same order"));
  std::filesystem::remove(path);
}

}  // namespace chorus::distributed
