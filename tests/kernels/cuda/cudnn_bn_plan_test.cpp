// The cuDNN batch-norm call plan (kernels/cuda/cudnn_bn_plan.h), on the CPU: the x descriptor (NCHW
// [n, c, s, 1] for s > 1, NHWC [n, c, 1, 1] for the channels-last rows chorus passes with s == 1), the
// derived parameter descriptor and its dtype (float32 for 16-bit data), the mode, which calls fall back
// to chorus's kernels and why, and the errors for calls that are wrong.
#include <catch2/catch.hpp>

#include <climits>
#include <limits>

#include "kernels/cuda/cudnn_bn_plan.h"
#include "tensor/error.h"

namespace chorus {
namespace {

namespace cp = kernels::cudnn_plan;
using Arr = std::array<int, 4>;

cp::BatchNormCall call(cp::BatchNormPass pass, int64_t n, int64_t c, int64_t s, double eps = 1e-5,
                       DType dtype = kFloat32, bool enabled = true) {
  return cp::BatchNormCall{.pass = pass, .cudnn_enabled = enabled, .x_dtype = dtype, .n = n, .c = c, .s = s, .eps = eps};
}

}  // namespace

TEST_CASE("cudnn bn plan: NCHW input with spatial positions is [n, c, s, 1] NCHW", "[cuda][cudnn]") {
  // ResNet's first batch norm, NCHW: [8, 64, 112, 112] passed as n = 8, c = 64, s = 112 * 112.
  const cp::BatchNormPlan p = cp::plan_batch_norm(8, 64, 112 * 112, kFloat32, kFloat32, true);
  CHECK(p.x.format == cp::TensorFormat::NCHW);
  CHECK(p.x.type == cp::DataType::Float);
  CHECK(p.x.dims == Arr{8, 64, 12544, 1});
  CHECK(p.x.strides == Arr{64 * 12544, 12544, 1, 1});
  CHECK(p.params.dims == Arr{1, 64, 1, 1});
  CHECK(p.params.strides == Arr{64, 1, 1, 1});
  CHECK(p.params.type == cp::DataType::Float);
  CHECK(p.mode == cp::BatchNormMode::Spatial);
  CHECK(cp::describe(p, true) == "training float32 NCHW x[8,64,12544,1] params float32 spatial");
}

TEST_CASE("cudnn bn plan: channels-last rows (s == 1) are [n, c, 1, 1] NHWC", "[cuda][cudnn]") {
  // The same layer channels-last: n = 8 * 112 * 112 rows of 64 channels.
  const int n = 8 * 112 * 112;
  const cp::BatchNormPlan p = cp::plan_batch_norm(n, 64, 1, kFloat32, kFloat32, true);
  CHECK(p.x.format == cp::TensorFormat::NHWC);
  CHECK(p.x.dims == Arr{n, 64, 1, 1});
  // NHWC strides of [n, c, 1, 1]: c between rows, channels adjacent: the rows' own memory.
  CHECK(p.x.strides == Arr{64, 1, 64, 64});
  CHECK(p.mode == cp::BatchNormMode::SpatialPersistent);  // training channels-last, as PyTorch
  CHECK(cp::plan_batch_norm(n, 64, 1, kFloat32, kFloat32, false).mode == cp::BatchNormMode::Spatial);
  CHECK(cp::plan_batch_norm(n, 64, 1, kFloat64, kFloat64, true).mode == cp::BatchNormMode::Spatial);
  // BatchNorm1d's [N, C] input is the same case.
  CHECK(cp::plan_batch_norm(32, 10, 1, kFloat64, kFloat64, false).x.format == cp::TensorFormat::NHWC);
}

TEST_CASE("cudnn bn plan: 16-bit data takes float32 parameters, persistent mode for NHWC training", "[cuda][cudnn]") {
  for (DType d : {kFloat16, kBFloat16}) {
    const cp::BatchNormPlan rows = cp::plan_batch_norm(4096, 256, 1, d, kFloat32, true);
    CHECK(rows.x.type == (d == kFloat16 ? cp::DataType::Half : cp::DataType::BFloat16));
    CHECK(rows.params.type == cp::DataType::Float);
    CHECK(rows.mode == cp::BatchNormMode::SpatialPersistent);
    // Inference, and NCHW training, keep the plain spatial mode.
    CHECK(cp::plan_batch_norm(4096, 256, 1, d, kFloat32, false).mode == cp::BatchNormMode::Spatial);
    CHECK(cp::plan_batch_norm(16, 256, 49, d, kFloat32, true).mode == cp::BatchNormMode::Spatial);
  }
  const cp::BatchNormPlan bf = cp::plan_batch_norm(4096, 256, 1, kBFloat16, kFloat32, true);
  CHECK(cp::describe(bf, true) == "training bfloat16 NHWC x[4096,256,1,1] params float32 spatial-persistent");
  // float64 data keeps float64 parameters.
  CHECK(cp::plan_batch_norm(4, 3, 5, kFloat64, kFloat64, true).params.type == cp::DataType::Double);
}

TEST_CASE("cudnn bn plan: wrong calls raise errors naming what was given", "[cuda][cudnn]") {
  CHECK_THROWS_WITH(cp::plan_batch_norm(8, 4, 1, kFloat16, kFloat16, true),
                    Catch::Contains("a float16 input takes float32 weight, bias and statistics, got float16"));
  CHECK_THROWS_WITH(cp::plan_batch_norm(8, 4, 1, kFloat32, kFloat64, true),
                    Catch::Contains("a float32 input takes float32") && Catch::Contains("got float64"));
  CHECK_THROWS_WITH(cp::plan_batch_norm(8, 4, 1, kInt64, kInt64, true),
                    Catch::Contains("dtype int64 has no cuDNN type"));
  CHECK_THROWS_WITH(cp::plan_batch_norm(int64_t{1} << 32, 4, 1, kFloat32, kFloat32, true),
                    Catch::Contains("n = 4294967296") && Catch::Contains("between 1 and 2147483647"));
  CHECK_THROWS_WITH(cp::plan_batch_norm(8, 0, 1, kFloat32, kFloat32, true), Catch::Contains("c = 0"));
  CHECK_THROWS_WITH(cp::plan_batch_norm(2, 65536, 65536, kFloat32, kFloat32, true),
                    Catch::Contains("c * s = 4294967296"));
}

TEST_CASE("cudnn bn plan: which calls fall back to chorus's kernels, and why", "[cuda][cudnn]") {
  using P = cp::BatchNormPass;
  auto reason = [](const cp::BatchNormCall& c) { return cp::batch_norm_fallback_reason(c).value_or("(cuDNN)"); };
  // cuDNN takes training and inference forwards and the training backward of every float dtype over
  // [n, c, s] with s > 1 (NCHW); rows of channels (s == 1, channels-last) go to chorus's rows kernels.
  for (P pass : {P::ForwardTraining, P::ForwardInference, P::BackwardTraining}) {
    for (DType d : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
      CHECK_FALSE(cp::batch_norm_fallback_reason(call(pass, 8, 16, 49, 1e-5, d)).has_value());
      CHECK_THAT(reason(call(pass, 8 * 49, 16, 1, 1e-5, d)),
                 Catch::Contains("rows of channels") && Catch::Contains("25.7 ms against 1.17 ms NCHW"));
    }
  }
  CHECK_THAT(reason(call(P::ForwardTraining, 8, 16, 49, 1e-5, kFloat32, false)), Catch::Contains("cuDNN is disabled"));
  CHECK_THAT(reason(call(P::BackwardTraining, 8, 16, 49, 1e-5, kFloat32, false)), Catch::Contains("set_cudnn_enabled"));
  // Eval backward is the affine gradient, which cuDNN's backward does not compute.
  CHECK_THAT(reason(call(P::BackwardEval, 8, 16, 49)), Catch::Contains("eval-mode backward"));
  // eps below CUDNN_BN_MIN_EPSILON (0 in cuDNN 9), and NaN, in the forward passes.
  CHECK_FALSE(cp::batch_norm_fallback_reason(call(P::ForwardTraining, 8, 16, 49, cp::kBatchNormMinEpsilon)).has_value());
  CHECK_THAT(reason(call(P::ForwardTraining, 8, 16, 49, -1e-3)),
             Catch::Contains("eps -0.001 is below cuDNN's minimum (CUDNN_BN_MIN_EPSILON = 0)"));
  CHECK_THAT(reason(call(P::ForwardInference, 8, 16, 49, std::numeric_limits<double>::quiet_NaN())),
             Catch::Contains("eps nan"));
  // Dtypes without a cuDNN batch norm go to chorus's kernel, which raises its own error for them.
  CHECK_THAT(reason(call(P::ForwardTraining, 8, 16, 49, 1e-5, kInt32)), Catch::Contains("dtype int32"));
  // Empty and oversized inputs.
  CHECK_THAT(reason(call(P::ForwardTraining, 0, 16, 49)), Catch::Contains("empty input [n=0, c=16, s=49]"));
  CHECK_THAT(reason(call(P::BackwardTraining, int64_t{3} << 31, 16, 1)),
             Catch::Contains("[n=6442450944, c=16, s=1] does not fit cuDNN's int"));
  // Every dim fits an int, but not the element count: float32 [64, 64, 512, 1024] is 2^31 (8 GiB);
  // cuDNN's descriptors refuse it, chorus's kernels take it. One element fewer goes to cuDNN.
  for (P pass : {P::ForwardTraining, P::ForwardInference, P::BackwardTraining}) {
    CHECK_THAT(reason(call(pass, 64, 64, 512 * 1024)),
               Catch::Contains("[n=64, c=64, s=524288] has more elements than cuDNN's 2^31 - 1 per tensor"));
    CHECK_THAT(reason(call(pass, 2, int64_t{1} << 16, int64_t{1} << 15)), Catch::Contains("more elements than cuDNN's"));
    CHECK_FALSE(cp::batch_norm_fallback_reason(call(pass, 1, 1, INT_MAX)).has_value());  // 2^31 - 1 elements
    CHECK_THAT(reason(call(pass, 1, 2, int64_t{1} << 30)), Catch::Contains("more elements than cuDNN's"));
  }
}

}  // namespace chorus
