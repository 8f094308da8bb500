// The cuda kernel table is registered by linking //:chorus (static initialization, alwayslink), with
// the implemented entries set and the rest null; runs without a GPU (the table is looked up, never
// called). The kernels themselves are compared with the CPU in ops_gpu_test (gpu-tagged).
#include <catch2/catch.hpp>

#include <string>

#include "kernels/cuda/cublas.h"
#include "kernels/dispatch.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus {

TEST_CASE("linking //:chorus registers the cuda kernel table", "[cuda]") {
  REQUIRE(kernels::has_kernels(DeviceType::CUDA));
  const kernels::KernelTable& table = kernels::kernel_table(Device::cuda(0), "test");
  CHECK(std::string(table.device_name) == "cuda");
  // Implemented on CUDA.
  CHECK(table.copy != nullptr);
  CHECK(table.fill != nullptr);
  CHECK(table.unary != nullptr);
  CHECK(table.binary != nullptr);
  CHECK(table.pow_scalar != nullptr);
  CHECK(table.clamp != nullptr);
  CHECK(table.where != nullptr);
  CHECK(table.arange != nullptr);
  CHECK(table.uniform_at != nullptr);
  CHECK(table.normal_at != nullptr);
  CHECK(table.random_int_at != nullptr);
  CHECK(table.sgd_step != nullptr);
  CHECK(table.adam_step != nullptr);
  CHECK(table.reduce != nullptr);
  CHECK(table.arg_reduce != nullptr);
  CHECK(table.softmax != nullptr);
  CHECK(table.softmax_backward != nullptr);
  CHECK(table.gemm != nullptr);
  CHECK(table.bmm != nullptr);
  CHECK(table.index_select != nullptr);
  CHECK(table.gather != nullptr);
  CHECK(table.scatter != nullptr);
  CHECK(table.index_add != nullptr);
  CHECK(table.layer_norm != nullptr);
  CHECK(table.layer_norm_backward != nullptr);
  CHECK(table.cross_entropy != nullptr);
  CHECK(table.cross_entropy_backward != nullptr);
  CHECK(table.max_pool2d != nullptr);
  CHECK(table.max_pool2d_backward != nullptr);
  CHECK(table.avg_pool2d != nullptr);
  CHECK(table.avg_pool2d_backward != nullptr);
  CHECK(table.adaptive_avg_pool2d != nullptr);
  CHECK(table.adaptive_avg_pool2d_backward != nullptr);
  // Not yet: convolution, batch norm (dispatch says "not implemented on CUDA devices yet").
  CHECK(table.conv2d == nullptr);
  CHECK(table.conv2d_backward == nullptr);
  CHECK(table.batch_norm == nullptr);
  CHECK(table.batch_norm_backward == nullptr);
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
  if (device_count(DeviceType::CUDA) > 0) return;  // (on a GPU machine ops_gpu_test covers the rest)
  CHECK_THROWS_WITH(full({2}, 1.0, {.device = Device::cuda(0)}), Catch::Contains("CUDA"));
}

}  // namespace chorus
