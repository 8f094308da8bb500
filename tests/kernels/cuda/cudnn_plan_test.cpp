// The cuDNN convolution call plan (kernels/cuda/cudnn_plan.h), on the CPU: descriptors for NCHW and
// channels-last tensors, grouped/strided/dilated windows whose output size agrees with the CPU
// convolution's, refusals (layouts that do not match, sizes beyond cuDNN's int, wrong output
// shapes, dtypes without a cuDNN type), the algorithm-cache key and cache, and the settings.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <unordered_set>

#include "kernels/cuda/cudnn_plan.h"
#include "nn/functional.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace cp = kernels::cudnn_plan;

Strides nchw_strides(const Shape& s) { return {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1}; }
Strides nhwc_strides(const Shape& s) { return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}; }

kernels::Window2d window(int64_t in_h, int64_t in_w, int64_t k_h, int64_t k_w, int64_t stride, int64_t pad, int64_t dilation) {
  kernels::Window2d w;
  w.in_h = in_h;
  w.in_w = in_w;
  w.kernel_h = k_h;
  w.kernel_w = k_w;
  w.stride_h = w.stride_w = stride;
  w.pad_h = w.pad_w = pad;
  w.dilation_h = w.dilation_w = dilation;
  w.out_h = (in_h + 2 * pad - dilation * (k_h - 1) - 1) / stride + 1;
  w.out_w = (in_w + 2 * pad - dilation * (k_w - 1) - 1) / stride + 1;
  return w;
}

}  // namespace

TEST_CASE("cudnn plan: NCHW descriptors are the tensors' own sizes and strides", "[cuda][cudnn]") {
  const Shape x{8, 64, 56, 56}, w{128, 64, 3, 3}, y{8, 128, 28, 28};
  const cp::ConvPlan p = cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat32,
                                         window(56, 56, 3, 3, 2, 1, 1), 1, true);
  CHECK(p.x.dims == std::array<int, 4>{8, 64, 56, 56});
  CHECK(p.x.strides == std::array<int, 4>{64 * 56 * 56, 56 * 56, 56, 1});
  CHECK(p.y.dims == std::array<int, 4>{8, 128, 28, 28});
  CHECK(p.w.dims == std::array<int, 4>{128, 64, 3, 3});
  CHECK(p.w.format == cp::FilterFormat::NCHW);
  CHECK_FALSE(p.channels_last);
  CHECK(p.conv.pad == std::array<int, 2>{1, 1});
  CHECK(p.conv.stride == std::array<int, 2>{2, 2});
  CHECK(p.conv.dilation == std::array<int, 2>{1, 1});
  CHECK(p.conv.compute == cp::DataType::Float);
  CHECK(p.tensor_ops);  // TF32 allowed
  CHECK(p.bias.dims == std::array<int, 4>{1, 128, 1, 1});
  CHECK(p.bias.strides == std::array<int, 4>{128, 1, 1, 1});
  // float32 without TF32: no tensor-op math; float64 computes in double; half and bfloat16 always tensor ops.
  CHECK_FALSE(cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat32,
                              window(56, 56, 3, 3, 2, 1, 1), 1, false).tensor_ops);
  const cp::ConvPlan d = cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat64,
                                         window(56, 56, 3, 3, 2, 1, 1), 1, true);
  CHECK(d.conv.compute == cp::DataType::Double);
  CHECK_FALSE(d.tensor_ops);
  for (DType low : {kFloat16, kBFloat16}) {
    const cp::ConvPlan h = cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), low,
                                           window(56, 56, 3, 3, 2, 1, 1), 1, false);
    CHECK(h.tensor_ops);
    CHECK(h.conv.compute == cp::DataType::Float);  // accumulate in float
    CHECK(h.math == cp::MathType::TensorOp);
  }
  // The descriptor's math type, as PyTorch's: float32 with TF32 CUDNN_DEFAULT_MATH, without it and
  // float64 CUDNN_FMA_MATH; never CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, which lets cuDNN convert
  // float32 data to float16 (until 2026-12-04 float32 with TF32 asked for it, and the H200's search
  // took such algorithms: 'm2' in gpu_bench's conv rows).
  CHECK(p.math == cp::MathType::Default);
  CHECK(cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat32,
                        window(56, 56, 3, 3, 2, 1, 1), 1, false).math == cp::MathType::Fma);
  CHECK(d.math == cp::MathType::Fma);
  for (cp::MathType m : {cp::MathType::Default, cp::MathType::TensorOp, cp::MathType::Fma}) {
    CHECK_FALSE(cp::result_math_allowed(m, static_cast<int>(cp::MathType::TensorOpAllowConversion)));
    CHECK(cp::result_math_allowed(m, static_cast<int>(m)));
    CHECK(cp::result_math_allowed(m, static_cast<int>(cp::MathType::Fma)));
  }
}

TEST_CASE("cudnn plan: channels-last tensors get NHWC strides and a KRSC filter", "[cuda][cudnn]") {
  const Shape x{4, 32, 17, 13}, w{64, 32, 3, 3}, y{4, 64, 17, 13};
  CHECK(cp::is_channels_last(x, nhwc_strides(x)));
  CHECK_FALSE(cp::is_channels_last(x, nchw_strides(x)));
  CHECK(cp::is_nchw_contiguous(x, nchw_strides(x)));
  // A CPU tensor made channels-last by permutes has exactly these strides.
  Tensor t = randn({4, 17, 13, 32}).permute({0, 3, 1, 2});
  CHECK(t.strides() == nhwc_strides(x));
  const cp::ConvPlan p = cp::plan_conv2d(x, nhwc_strides(x), w, nhwc_strides(w), y, nhwc_strides(y), kFloat32,
                                         window(17, 13, 3, 3, 1, 1, 1), 1, true);
  CHECK(p.channels_last);
  CHECK(p.w.format == cp::FilterFormat::NHWC);
  CHECK(p.x.dims == std::array<int, 4>{4, 32, 17, 13});  // dims stay in N, C, H, W order
  CHECK(p.x.strides == std::array<int, 4>{32 * 17 * 13, 1, 13 * 32, 32});
  CHECK(p.y.strides == std::array<int, 4>{64 * 17 * 13, 1, 13 * 64, 64});
  // Mixed layouts are refused with what is expected.
  CHECK_THROWS_WITH(cp::plan_conv2d(x, nhwc_strides(x), w, nchw_strides(w), y, nhwc_strides(y), kFloat32,
                                    window(17, 13, 3, 3, 1, 1, 1), 1, true),
                    Catch::Contains("is not dense KRSC; expected it in the input's layout (channels-last)"));
  CHECK_THROWS_WITH(cp::plan_conv2d(x, nchw_strides(x), w, nhwc_strides(w), y, nchw_strides(y), kFloat32,
                                    window(17, 13, 3, 3, 1, 1, 1), 1, true),
                    Catch::Contains("is not dense KCRS"));
  // A 1x1-position input is dense in both layouts: a channels-last weight makes the plan NHWC
  // (ResNet's last stage at a small image size after model->to(ChannelsLast)).
  const Shape x1{4, 32, 1, 1}, y1{4, 64, 1, 1};
  const cp::ConvPlan q = cp::plan_conv2d(x1, nchw_strides(x1), w, nhwc_strides(w), y1, nchw_strides(y1), kFloat32,
                                         window(1, 1, 3, 3, 1, 1, 1), 1, true);
  CHECK(q.channels_last);
  CHECK(q.w.format == cp::FilterFormat::NHWC);
  // [Size-1 strides] cuDNN gets the NHWC strides of the size-1 dims, not the NCHW ones the tensors
  // carry (PyTorch's fixSizeOneDimStride): x {32, 1, 1, 1} -> {32, 1, 32, 32}, y {64, 1, 1, 1} ->
  // {64, 1, 64, 64}. Before, the plan passed {32, 1, 1, 1} beside an NHWC filter.
  CHECK(q.x.strides == std::array<int, 4>{32, 1, 32, 32});
  CHECK(q.y.strides == std::array<int, 4>{64, 1, 64, 64});
  CHECK(cp::conv_key(q, cp::Direction::Forward, 0, false).x_strides == std::array<int, 4>{32, 1, 32, 32});
  // NCHW with a size-1 batch and width whose strides are anything: packed NCHW strides there.
  const Shape x2{1, 32, 5, 1}, y2{1, 64, 5, 1};
  const cp::ConvPlan r = cp::plan_conv2d(x2, {7, 5, 1, 99}, w, nchw_strides(w), y2, {11, 5, 1, 3}, kFloat32,
                                         window(5, 1, 3, 3, 1, 1, 1), 1, true);
  CHECK_FALSE(r.channels_last);
  CHECK(r.x.strides == std::array<int, 4>{160, 5, 1, 1});
  CHECK(r.y.strides == std::array<int, 4>{320, 5, 1, 1});
  CHECK_FALSE(cp::plan_conv2d(x1, nchw_strides(x1), w, nchw_strides(w), y1, nchw_strides(y1), kFloat32,
                              window(1, 1, 3, 3, 1, 1, 1), 1, true)
                  .channels_last);
}

TEST_CASE("cudnn plan: random windows agree with the CPU convolution's output shape", "[cuda][cudnn]") {
  std::mt19937 rng(7);
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t groups = pick(1, 3), cin = groups * pick(1, 3), cout = groups * pick(1, 3);
    const int64_t kh = pick(1, 4), kw = pick(1, 4), stride = pick(1, 3), pad = pick(0, 2), dil = pick(1, 2);
    const int64_t h = dil * (kh - 1) + pick(1, 9), wd = dil * (kw - 1) + pick(1, 9), n = pick(1, 3);
    INFO("groups " << groups << " cin " << cin << " cout " << cout << " k " << kh << "x" << kw << " stride " << stride
                   << " pad " << pad << " dilation " << dil << " in " << h << "x" << wd);
    const Tensor out = nn::functional::conv2d(randn({n, cin, h, wd}), randn({cout, cin / groups, kh, kw}), Tensor(),
                                              {stride, stride}, {pad, pad}, {dil, dil}, groups);
    const Shape x{n, cin, h, wd}, w{cout, cin / groups, kh, kw};
    const cp::ConvPlan p = cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), out.sizes(), out.strides(),
                                           kFloat32, window(h, wd, kh, kw, stride, pad, dil), groups, true);
    CHECK(p.conv.groups == groups);
    CHECK(p.y.dims[2] == out.size(2));
    // One row too many is refused, naming the expected size.
    Shape wrong = out.sizes();
    wrong[2] += 1;
    CHECK_THROWS_WITH(cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), wrong, nchw_strides(wrong), kFloat32,
                                      window(h, wd, kh, kw, stride, pad, dil), groups, true),
                      Catch::Contains(fmt::format("with {} in dim 2", out.size(2))));
  }
}

TEST_CASE("cudnn plan: what cuDNN cannot take is refused with a message", "[cuda][cudnn]") {
  const Shape x{1, 4, 8, 8}, w{4, 4, 3, 3}, y{1, 4, 6, 6};
  const kernels::Window2d win = window(8, 8, 3, 3, 1, 0, 1);
  CHECK_THROWS_WITH(cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kInt64, win, 1, true),
                    Catch::Contains("dtype int64 has no cuDNN type"));
  const Shape huge{1, 4, 70000, 70000};
  CHECK_THROWS_WITH(cp::plan_conv2d(huge, nchw_strides(huge), w, nchw_strides(w), y, nchw_strides(y), kFloat32, win, 1,
                                    true),
                    Catch::Contains("does not fit cuDNN's int"));
  CHECK_THROWS_WITH(cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat32, win, 3, true),
                    Catch::Contains("groups 3 do not fit input channels 4"));
  CHECK_THROWS_WITH(cp::plan_conv2d({4, 8, 8}, {64, 8, 1}, w, nchw_strides(w), y, nchw_strides(y), kFloat32, win, 1,
                                    true),
                    Catch::Contains("has 3 dims, expected 4"));
}

TEST_CASE("cudnn plan: algorithm keys tell every choice apart, and the cache holds them", "[cuda][cudnn]") {
  const Shape x{2, 8, 10, 10}, w{8, 8, 3, 3}, y{2, 8, 10, 10};
  const kernels::Window2d win = window(10, 10, 3, 3, 1, 1, 1);
  const cp::ConvPlan p = cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat32, win, 1, true);
  const cp::ConvKey base = cp::conv_key(p, cp::Direction::Forward, 0, false);
  CHECK(base == cp::conv_key(p, cp::Direction::Forward, 0, false));
  std::vector<cp::ConvKey> others = {
      cp::conv_key(p, cp::Direction::BackwardData, 0, false),
      cp::conv_key(p, cp::Direction::BackwardFilter, 0, false),
      cp::conv_key(p, cp::Direction::Forward, 1, false),
      cp::conv_key(p, cp::Direction::Forward, 0, true),
      cp::conv_key(cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat64, win, 1, true),
                   cp::Direction::Forward, 0, false),
      cp::conv_key(cp::plan_conv2d(x, nchw_strides(x), w, nchw_strides(w), y, nchw_strides(y), kFloat32, win, 1, false),
                   cp::Direction::Forward, 0, false),
      cp::conv_key(cp::plan_conv2d(x, nhwc_strides(x), w, nhwc_strides(w), y, nhwc_strides(y), kFloat32, win, 1, true),
                   cp::Direction::Forward, 0, false),
  };
  std::unordered_set<size_t> hashes{cp::ConvKeyHash{}(base)};
  for (const cp::ConvKey& k : others) {
    CHECK_FALSE(k == base);
    hashes.insert(cp::ConvKeyHash{}(k));
  }
  CHECK(hashes.size() == others.size() + 1);
  CHECK(cp::describe(base) ==
        "forward float32 NCHW x[2,8,10,10] w[8,8,3,3] y[2,8,10,10] pad 1,1 stride 1,1 dilation 1,1 groups 1 on cuda:0, "
        "tensor ops");
  cp::AlgoCache cache;
  CHECK_FALSE(cache.find(base).has_value());
  cache.insert(base, {6, 1, 4096});
  REQUIRE(cache.find(base).has_value());
  CHECK(cache.find(base)->algorithm == 6);
  CHECK(cache.find(base)->workspace == 4096);
  // A choice that needs more workspace than today's limit (set_cudnn_workspace_limit lowered since
  // it was made) is searched again: the cache has none for it.
  CHECK(cache.find(base, 4096).has_value());
  CHECK_FALSE(cache.find(base, 4095).has_value());
  CHECK_FALSE(cache.find(base, 0).has_value());
  CHECK_FALSE(cache.find(others[0]).has_value());
  CHECK(cache.size() == 1);
  cache.insert(others[0], {1, 0, 0});
  auto entries = cache.entries();
  REQUIRE(entries.size() == 2);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.second.algorithm < b.second.algorithm; });
  CHECK((entries[0].first == others[0] && entries[0].second.algorithm == 1));
  CHECK((entries[1].first == base && entries[1].second.workspace == 4096));
  cache.clear();
  CHECK(cache.size() == 0);
}

TEST_CASE("cudnn settings: PyTorch's defaults, and bad values refused", "[cuda][cudnn]") {
  CHECK(cuda::cudnn_enabled());
  CHECK_FALSE(cuda::cudnn_deterministic());
  CHECK(cuda::cudnn_allow_tf32());
  CHECK(cuda::cudnn_workspace_limit() == (int64_t{1} << 30));
  cuda::set_cudnn_deterministic(true);
  CHECK(cuda::cudnn_deterministic());
  cuda::set_cudnn_deterministic(false);
  CHECK_THROWS_WITH(cuda::set_cudnn_workspace_limit(-1), Catch::Contains("got -1 bytes, expected a size >= 0"));
}

}  // namespace chorus
