// The cuda kernel table is registered by linking //:chorus (static initialization, alwayslink), with
// every entry set; runs without a GPU (the table is looked up, never
// called). The kernels themselves are compared with the CPU in ops_gpu_test (gpu-tagged).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "kernels/cuda/cublas.h"
#include "kernels/kernel_table.h"
#include "kernels/dispatch.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus {

TEST_CASE("linking //:chorus registers the cuda kernel table", "[cuda]") {
  REQUIRE(kernels::has_kernels(DeviceType::CUDA));
  const kernels::KernelTable& table = kernels::kernel_table(Device::cuda(0), "test");
  CHECK(std::string(table.device_name) == "cuda");
  // Every entry of CHORUS_KERNEL_LIST is implemented on CUDA.
#define CHORUS_CHECK_ENTRY(name, params, args) \
  {                                            \
    INFO(#name);                               \
    CHECK(table.name != nullptr);              \
  }
  CHORUS_KERNEL_LIST(CHORUS_CHECK_ENTRY)
#undef CHORUS_CHECK_ENTRY
  // The CUDA table is not the cpu one (a copy-paste of the cpu entries would pass the checks above).
  CHECK(table.copy != kernels::kernel_table(Device::cpu(), "test").copy);
}

TEST_CASE("set_allow_tf32 switches the float32 matmul mode", "[cuda]") {
  const bool before = cuda::allow_tf32();
  CHECK(before);  // on by default
  cuda::set_allow_tf32(false);
  CHECK_FALSE(cuda::allow_tf32());
  cuda::set_allow_tf32(true);
  CHECK(cuda::allow_tf32());
}

TEST_CASE("without a GPU, a cuda op fails with the driver's reason", "[cuda]") {
  // The target runs with CUDA_VISIBLE_DEVICES set empty (tests/kernels/cuda/BUILD), so this holds
  // on a machine with a GPU too (ops_gpu_test runs the kernels there).
  INFO("CUDA_VISIBLE_DEVICES=" << (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)"));
  REQUIRE(device_count(DeviceType::CUDA) == 0);
  CHECK_THROWS_WITH(full({2}, 1.0, {.device = Device::cuda(0)}), Catch::Contains("CUDA"));
}

}  // namespace chorus
