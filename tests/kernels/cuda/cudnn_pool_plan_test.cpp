// The cuDNN pooling call plan (kernels/cuda/cudnn_pool_plan.h), on the CPU: the pooling mode for each
// kind (max, deterministic max, average with and without padding counted, uniform adaptive average as a
// plain window), the window/padding/stride, NaN propagation, the x and y descriptors in NCHW and NHWC,
// the cuDNN types, and every reason a call runs chorus's own kernels instead.
#include <catch2/catch.hpp>

#include <climits>

#include "kernels/cuda/cudnn_pool_plan.h"
#include "tensor/error.h"

namespace chorus {
namespace {

namespace cp = kernels::cudnn_plan;
using Arr = std::array<int, 4>;
using Arr2 = std::array<int, 2>;

kernels::Window2d window(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w, int64_t k, int64_t s, int64_t p,
                         int64_t d = 1) {
  kernels::Window2d w;
  w.in_h = in_h;
  w.in_w = in_w;
  w.out_h = out_h;
  w.out_w = out_w;
  w.kernel_h = w.kernel_w = k;
  w.stride_h = w.stride_w = s;
  w.pad_h = w.pad_w = p;
  w.dilation_h = w.dilation_w = d;
  return w;
}

kernels::Window2d adaptive(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w) {
  kernels::Window2d w;
  w.in_h = in_h;
  w.in_w = in_w;
  w.out_h = out_h;
  w.out_w = out_w;
  return w;
}

cp::PoolCall call(cp::PoolKind kind, kernels::Window2d w, cp::PoolLayout layout = cp::PoolLayout::NCHW,
                  DType dtype = kFloat32, int64_t n = 8, int64_t c = 64) {
  return cp::PoolCall{.kind = kind, .dtype = dtype, .layout = layout, .n = n, .c = c, .window = w};
}

// ResNet's stem max pool: [8, 64, 112, 112] -> [8, 64, 56, 56], 3x3, stride 2, padding 1.
const kernels::Window2d kStem = window(112, 112, 56, 56, 3, 2, 1);

}  // namespace

TEST_CASE("cudnn pool plan: ResNet's stem max pool, NCHW", "[cuda][cudnn]") {
  const cp::PoolCall c = call(cp::PoolKind::Max, kStem);
  REQUIRE_FALSE(cp::pool_fallback_reason(c));
  const cp::PoolPlan p = cp::plan_pool2d(c);
  CHECK(p.mode == cp::PoolingMode::Max);
  CHECK(p.propagate_nan);  // PyTorch's max pool propagates NaN
  CHECK(p.window == Arr2{3, 3});
  CHECK(p.pad == Arr2{1, 1});
  CHECK(p.stride == Arr2{2, 2});
  CHECK_FALSE(p.channels_last);
  CHECK(p.x.type == cp::DataType::Float);
  CHECK(p.x.dims == Arr{8, 64, 112, 112});
  CHECK(p.x.strides == Arr{64 * 112 * 112, 112 * 112, 112, 1});
  CHECK(p.y.dims == Arr{8, 64, 56, 56});
  CHECK(p.y.strides == Arr{64 * 56 * 56, 56 * 56, 56, 1});
  CHECK(cp::describe(p) == "max float32 NCHW x[8,64,112,112] y[8,64,56,56] window 3x3 pad 1x1 stride 2x2");
}

TEST_CASE("cudnn pool plan: channels-last tensors are described NHWC through their strides", "[cuda][cudnn]") {
  const cp::PoolPlan p = cp::plan_pool2d(call(cp::PoolKind::Max, kStem, cp::PoolLayout::NHWC, kBFloat16));
  CHECK(p.channels_last);
  CHECK(p.x.type == cp::DataType::BFloat16);
  CHECK(p.x.dims == Arr{8, 64, 112, 112});  // N, C, H, W whatever the layout
  // Channels adjacent, a pixel of 64 channels, a row of 112 pixels, an image of 112 rows.
  CHECK(p.x.strides == Arr{112 * 112 * 64, 1, 112 * 64, 64});
  CHECK(p.y.strides == Arr{56 * 56 * 64, 1, 56 * 64, 64});
  CHECK(cp::describe(p) == "max bfloat16 NHWC x[8,64,112,112] y[8,64,56,56] window 3x3 pad 1x1 stride 2x2");
  // Non-square, odd channel count.
  const cp::PoolPlan q = cp::plan_pool2d(call(cp::PoolKind::AvgExcludePad, window(9, 8, 5, 4, 3, 2, 1),
                                              cp::PoolLayout::NHWC, kFloat16, 3, 5));
  CHECK(q.x.type == cp::DataType::Half);
  CHECK(q.x.strides == Arr{9 * 8 * 5, 1, 8 * 5, 5});
  CHECK(q.y.strides == Arr{5 * 4 * 5, 1, 4 * 5, 5});
}

TEST_CASE("cudnn pool plan: the mode of each pooling kind", "[cuda][cudnn]") {
  // cuDNN's extent of a 2x2 stride-2 window over 10 with padding 1 is 1 + (10 + 2 - 2) / 2 = 6.
  const kernels::Window2d w = window(10, 10, 5, 5, 2, 2, 1);
  const kernels::Window2d w2 = window(10, 10, 5, 5, 2, 2, 0);
  CHECK(cp::plan_pool2d(call(cp::PoolKind::AvgIncludePad, w2)).mode == cp::PoolingMode::AverageCountIncludePadding);
  CHECK(cp::plan_pool2d(call(cp::PoolKind::AvgExcludePad, w2)).mode == cp::PoolingMode::AverageCountExcludePadding);
  // Deterministic: the max mode whose backward has a fixed summation order.
  cp::PoolCall det = call(cp::PoolKind::Max, w2);
  det.deterministic = true;
  CHECK(cp::plan_pool2d(det).mode == cp::PoolingMode::MaxDeterministic);
  // float64 goes to cuDNN as double.
  CHECK(cp::plan_pool2d(call(cp::PoolKind::Max, w2, cp::PoolLayout::NCHW, kFloat64)).x.type == cp::DataType::Double);
  // A padded 2x2 window over 10 gives 6 outputs in both formulas: cuDNN takes it.
  const kernels::Window2d padded = window(10, 10, 6, 6, 2, 2, 1);
  CHECK_FALSE(cp::pool_fallback_reason(call(cp::PoolKind::AvgIncludePad, padded)));
  CHECK(cp::plan_pool2d(call(cp::PoolKind::AvgIncludePad, padded)).pad == Arr2{1, 1});
  CHECK(cp::pool_fallback_reason(call(cp::PoolKind::AvgIncludePad, w)));  // 5 outputs are not cuDNN's 6
}

TEST_CASE("cudnn pool plan: uniform adaptive average pooling is a window of in / out", "[cuda][cudnn]") {
  const cp::PoolPlan p = cp::plan_pool2d(call(cp::PoolKind::AdaptiveAvg, adaptive(12, 8, 3, 2)));
  CHECK(p.mode == cp::PoolingMode::AverageCountIncludePadding);
  CHECK(p.window == Arr2{4, 4});
  CHECK(p.stride == Arr2{4, 4});
  CHECK(p.pad == Arr2{0, 0});
  CHECK(p.y.dims == Arr{8, 64, 3, 2});
  // The global pool of ResNet's head: 7x7 -> 1x1, channels-last.
  const cp::PoolPlan g = cp::plan_pool2d(call(cp::PoolKind::AdaptiveAvg, adaptive(7, 7, 1, 1), cp::PoolLayout::NHWC));
  CHECK(g.window == Arr2{7, 7});
  CHECK(g.stride == Arr2{7, 7});
  CHECK(g.y.dims == Arr{8, 64, 1, 1});
  CHECK(g.y.strides == Arr{64, 1, 64, 64});
  // in == out: a 1x1 window.
  CHECK(cp::plan_pool2d(call(cp::PoolKind::AdaptiveAvg, adaptive(5, 5, 5, 5))).window == Arr2{1, 1});
}

TEST_CASE("cudnn pool plan: every reason chorus's own kernel runs", "[cuda][cudnn]") {
  using Catch::Contains;
  auto reason = [](const cp::PoolCall& c) { return cp::pool_fallback_reason(c).value_or(""); };
  cp::PoolCall off = call(cp::PoolKind::Max, kStem);
  off.cudnn_enabled = false;
  CHECK_THAT(reason(off), Contains("cuDNN is disabled"));

  cp::PoolCall idx = call(cp::PoolKind::Max, kStem);
  idx.indices = true;
  CHECK_THAT(reason(idx), Contains("max pooling with indices"));

  CHECK_THAT(reason(call(cp::PoolKind::Max, kStem, cp::PoolLayout::NCHW, kInt64)), Contains("dtype int64"));
  CHECK_THAT(reason(call(cp::PoolKind::Max, kStem, cp::PoolLayout::Mixed)), Contains("not all dense NCHW"));
  CHECK_THAT(reason(call(cp::PoolKind::Max, kStem, cp::PoolLayout::NCHW, kFloat32, 0, 64)), Contains("empty"));

  // Adaptive 10 -> 3: windows [0,4) [3,7) [6,10), overlapping; 10 -> 5 in h but 7 -> 2 in w too.
  CHECK_THAT(reason(call(cp::PoolKind::AdaptiveAvg, adaptive(10, 10, 3, 3))), Contains("different sizes"));
  CHECK_THAT(reason(call(cp::PoolKind::AdaptiveAvg, adaptive(10, 7, 5, 2))), Contains("10x7 to 5x2"));

  CHECK_THAT(reason(call(cp::PoolKind::Max, window(16, 16, 6, 6, 3, 2, 1, 2))), Contains("dilation (2, 2)"));

  // ceil_mode: 3x3 stride 2 over 8 gives 4 outputs (the last window starts at 6, inside the input),
  // cuDNN's floor formula 3.
  CHECK_THAT(reason(call(cp::PoolKind::Max, window(8, 8, 4, 4, 3, 2, 0))),
             Contains("ceil_mode output 4x4 has windows past the input (cuDNN's extent is 3x3)"));
  CHECK_THAT(reason(call(cp::PoolKind::AvgIncludePad, window(8, 9, 4, 4, 3, 2, 0))), Contains("ceil_mode"));
  // ceil_mode where both formulas agree (9 = 1 + 2 * 4): no fallback.
  CHECK_FALSE(cp::pool_fallback_reason(call(cp::PoolKind::AvgIncludePad, window(9, 9, 4, 4, 3, 2, 0))));

  // Sizes: a dim beyond int, and an input of more than INT_MAX elements.
  CHECK_THAT(reason(call(cp::PoolKind::Max, window(4, 4, 2, 2, 2, 2, 0), cp::PoolLayout::NCHW, kFloat32,
                         int64_t{INT_MAX} + 1, 1)),
             Contains("does not fit cuDNN's int"));
  CHECK_THAT(reason(call(cp::PoolKind::Max, window(1024, 1024, 512, 512, 2, 2, 0), cp::PoolLayout::NCHW, kFloat32, 64,
                         64)),
             Contains("more than 2147483647 elements"));
  CHECK_THAT(reason(call(cp::PoolKind::AdaptiveAvg, adaptive(1024, 1024, 1, 1), cp::PoolLayout::NCHW, kFloat32, 2,
                         2048)),
             Contains("more than"));

  // A refused call has no plan.
  CHECK_THROWS_WITH(cp::plan_pool2d(off), Contains("no cuDNN plan: cuDNN is disabled"));
}

}  // namespace chorus
