// ProcessGroupNCCL where there is no GPU (CI): asking for backend "nccl" must be a clear
// chorus::Error saying there is no CUDA device, not a crash or a hang.
#include <catch2/catch.hpp>

#include <filesystem>

#include "distributed/init.h"
#include "distributed/nccl.h"
#include "tensor/runtime.h"

namespace chorus::distributed {

TEST_CASE("backend nccl without a GPU raises 'no CUDA device'", "[distributed][nccl]") {
  REQUIRE(device_count(DeviceType::CUDA) == 0);
  const std::string path = std::filesystem::temp_directory_path() / "chorus_nccl_test_store";
  std::filesystem::remove(path);
  REQUIRE_THROWS_WITH(init_process_group({.backend = "nccl", .init_method = "file://" + path, .rank = 0, .world_size = 1}),
                      Catch::Contains("no CUDA device"));
  REQUIRE_THROWS_WITH(make_process_group_nccl(std::make_shared<FileStore>(path), 0, 1), Catch::Contains("no CUDA device"));
  std::filesystem::remove(path);
}

}  // namespace chorus::distributed
