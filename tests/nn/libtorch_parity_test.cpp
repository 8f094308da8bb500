// nn's issue-18 layers against libtorch 1.13 (Debian's libtorch-dev, linked here): each case runs
// on the same random inputs in float32 and float64, and compares the forward values and the
// gradients of sum(out * g) for a random g. Float64 must agree to round-off (1e-10 relative to the
// largest value); float32 to 2e-5 (different summation orders).
#include <torch/nn.h>
#include "tests/libtorch_testing.h"  // after the torch headers ([Narrow torch headers])

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "nn/functional.h"
#include "nn/nn.h"
#include "tensor/ops.h"

namespace {

using chorus::Tensor;
using CFn = std::function<Tensor(const chorus::TensorList&)>;
using TFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

using chorus::testing::max_diff;
using chorus::testing::to_torch;

struct Case {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  CFn chorus_fn;
  TFn torch_fn;
};

void check(const Case& c, chorus::DType dtype) {
  const bool f64 = dtype == chorus::kFloat64;
  INFO(c.name << (f64 ? " float64" : " float32"));
  const double tol = f64 ? 1e-10 : 2e-5;
  chorus::manual_seed(1234);
  chorus::TensorList in;
  std::vector<torch::Tensor> tin;
  for (const auto& s : c.shapes) {
    Tensor x = chorus::randn(s, {.dtype = dtype});
    in.push_back(x.requires_grad_());
    tin.push_back(to_torch(x).to(f64 ? torch::kFloat64 : torch::kFloat32).requires_grad_());
  }
  const Tensor out = c.chorus_fn(in);
  const torch::Tensor tout = c.torch_fn(tin);
  CHECK(out.dtype() == dtype);
  CHECK(out.sizes() == chorus::Shape(tout.sizes().begin(), tout.sizes().end()));
  CHECK(max_diff(out, tout) < tol);
  const Tensor g = chorus::randn(out.sizes(), {.dtype = dtype});
  chorus::sum(chorus::mul(out, g)).backward();
  (tout * to_torch(g).to(tout.dtype())).sum().backward();
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("gradient of input " << i);
    REQUIRE(tin[i].grad().defined());
    REQUIRE(in[i].grad().defined());
    CHECK(max_diff(in[i].grad(), tin[i].grad()) < tol);
  }
}

void check_all(const std::vector<Case>& cases) {
  torch::set_num_threads(1);
  for (const Case& k : cases) {
    check(k, chorus::kFloat64);
    check(k, chorus::kFloat32);
  }
}

namespace c = chorus;
namespace F = chorus::nn::functional;
namespace TF = torch::nn::functional;
using L = const c::TensorList&;
using T = const std::vector<torch::Tensor>&;

}  // namespace

TEST_CASE("pad equals libtorch's in every mode, forward and backward", "[nn][libtorch][pad]") {
  using M = F::PadMode;
  check_all({
      {"constant 1 dim", {{2, 3, 5}}, [](L x) { return F::pad(x[0], {1, 2}, M::Constant, 0.5); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({1, 2}).value(0.5)); }},
      {"constant 3 dims of 4", {{2, 3, 4, 5}}, [](L x) { return F::pad(x[0], {1, 0, 0, 2, 3, 1}); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({1, 0, 0, 2, 3, 1})); }},
      {"constant negative crops", {{2, 3, 6, 5}}, [](L x) { return F::pad(x[0], {-1, 2, -2, -1}, M::Constant, -1.0); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({-1, 2, -2, -1}).value(-1.0)); }},
      {"reflect 1d", {{2, 3, 6}}, [](L x) { return F::pad(x[0], {3, 5}, M::Reflect); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({3, 5}).mode(torch::kReflect)); }},
      {"reflect 2d", {{2, 3, 4, 5}}, [](L x) { return F::pad(x[0], {2, 4, 3, 1}, M::Reflect); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({2, 4, 3, 1}).mode(torch::kReflect)); }},
      {"reflect 2d unbatched", {{3, 4, 5}}, [](L x) { return F::pad(x[0], {1, 1, 2, 0}, M::Reflect); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({1, 1, 2, 0}).mode(torch::kReflect)); }},
      {"replicate 2d", {{2, 3, 4, 5}}, [](L x) { return F::pad(x[0], {3, 1, 0, 6}, M::Replicate); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({3, 1, 0, 6}).mode(torch::kReplicate)); }},
      {"replicate 3d", {{1, 2, 3, 4, 3}}, [](L x) { return F::pad(x[0], {1, 2, 2, 1, 1, 3}, M::Replicate); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({1, 2, 2, 1, 1, 3}).mode(torch::kReplicate)); }},
      {"circular 1d", {{2, 3, 5}}, [](L x) { return F::pad(x[0], {5, 2}, M::Circular); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({5, 2}).mode(torch::kCircular)); }},
      {"circular 2d", {{2, 3, 4, 5}}, [](L x) { return F::pad(x[0], {2, 3, 4, 1}, M::Circular); },
       [](T x) { return TF::pad(x[0], TF::PadFuncOptions({2, 3, 4, 1}).mode(torch::kCircular)); }},
      {"ReflectionPad2d module", {{2, 3, 4, 5}}, [](L x) { return c::nn::ReflectionPad2d(2)(x[0]); },
       [](T x) { return torch::nn::ReflectionPad2d(2)(x[0]); }},
      {"ZeroPad2d module", {{2, 3, 4, 5}}, [](L x) { return c::nn::ZeroPad2d({1, 2, 0, 3})(x[0]); },
       [](T x) { return torch::nn::ZeroPad2d(torch::nn::ZeroPad2dOptions({1, 2, 0, 3}))(x[0]); }},
      {"ReplicationPad1d module", {{2, 3, 4}}, [](L x) { return c::nn::ReplicationPad1d({0, 3})(x[0]); },
       [](T x) { return torch::nn::ReplicationPad1d(torch::nn::ReplicationPad1dOptions({0, 3}))(x[0]); }},
  });
}

TEST_CASE("group_norm and instance_norm equal libtorch's, forward and backward", "[nn][libtorch][norm]") {
  check_all({
      {"group_norm affine 4-D", {{3, 6, 4, 5}, {6}, {6}}, [](L x) { return F::group_norm(x[0], 3, x[1], x[2], 1e-5); },
       [](T x) { return torch::group_norm(x[0], 3, x[1], x[2], 1e-5); }},
      {"group_norm no affine 3-D", {{2, 8, 7}}, [](L x) { return F::group_norm(x[0], 2); },
       [](T x) { return torch::group_norm(x[0], 2); }},
      {"group_norm one channel per group, shifted input", {{2, 4, 3, 3}, {4}},
       [](L x) { return F::group_norm(c::add(x[0], 3.0), 4, x[1], c::Tensor(), 1e-3); },
       [](T x) { return torch::group_norm(x[0] + 3.0, 4, x[1], {}, 1e-3); }},
      {"instance_norm affine", {{3, 4, 5, 6}, {4}, {4}},
       [](L x) { return F::instance_norm(x[0], c::Tensor(), c::Tensor(), x[1], x[2], true, 0.1, 1e-5); },
       [](T x) { return torch::instance_norm(x[0], x[1], x[2], {}, {}, true, 0.1, 1e-5, false); }},
      {"instance_norm 1-d, no affine", {{2, 3, 9}},
       [](L x) { return F::instance_norm(x[0]); },
       [](T x) { return torch::instance_norm(x[0], {}, {}, {}, {}, true, 0.1, 1e-5, false); }},
      {"GroupNorm module", {{2, 6, 3, 4}},
       [](L x) {
         c::nn::GroupNorm m(2, 6);
         m.to(x[0].dtype());
         return m(x[0]);
       },
       [](T x) {
         torch::nn::GroupNorm m(2, 6);
         m->to(x[0].scalar_type());
         return m(x[0]);
       }},
      {"InstanceNorm2d module, unbatched", {{4, 3, 5}}, [](L x) { return c::nn::InstanceNorm2d(4)(x[0]); },
       [](T x) { return torch::nn::InstanceNorm2d(4)(x[0]); }},
  });
}

TEST_CASE("InstanceNorm2d with running statistics follows libtorch's in training and eval", "[nn][libtorch][norm]") {
  torch::set_num_threads(1);
  for (c::DType dtype : {c::kFloat64, c::kFloat32}) {
    const bool f64 = dtype == c::kFloat64;
    INFO((f64 ? "float64" : "float32"));
    const double tol = f64 ? 1e-10 : 2e-5;
    c::nn::InstanceNorm2d ours(3, 1e-5, 0.3, true, true);
    ours.to(dtype);
    torch::nn::InstanceNorm2d theirs(torch::nn::InstanceNorm2dOptions(3).momentum(0.3).affine(true).track_running_stats(true));
    theirs->to(f64 ? torch::kFloat64 : torch::kFloat32);
    c::manual_seed(5);
    {
      c::NoGradGuard no_grad;
      c::Tensor w = c::randn({3}, {.dtype = dtype}), b = c::randn({3}, {.dtype = dtype});
      ours.weight.copy_(w);
      ours.bias.copy_(b);
      torch::NoGradGuard tno_grad;
      theirs->weight.copy_(to_torch(w));
      theirs->bias.copy_(to_torch(b));
    }
    for (int step = 0; step < 2; ++step) {
      c::Tensor x = c::add(c::mul(c::randn({4, 3, 5, 6}, {.dtype = dtype}), 2.0), 1.5);
      CHECK(max_diff(ours.forward(x), theirs->forward(to_torch(x).to(theirs->weight.dtype()))) < tol);
    }
    CHECK(max_diff(ours.running_mean, theirs->running_mean) < tol);
    CHECK(max_diff(ours.running_var, theirs->running_var) < tol);
    // The running statistics moved away from their initial zeros and ones.
    CHECK(c::amax(c::abs(ours.running_mean)).item<double>() > 0.1);
    ours.eval();
    theirs->eval();
    c::Tensor x = c::randn({2, 3, 4, 4}, {.dtype = dtype});
    CHECK(max_diff(ours.forward(x), theirs->forward(to_torch(x).to(theirs->weight.dtype()))) < tol);
  }
}

TEST_CASE("interpolate, Upsample and pixel (un)shuffle equal libtorch's, forward and backward",
          "[nn][libtorch][upsample]") {
  using M = F::InterpolateMode;
  auto opts = [](std::vector<int64_t> size, std::vector<double> scale, torch::nn::functional::InterpolateFuncOptions::mode_t mode,
                 std::optional<bool> align = std::nullopt) {
    auto o = TF::InterpolateFuncOptions().mode(mode);
    if (!size.empty()) o.size(size);
    if (!scale.empty()) o.scale_factor(scale);
    if (align) o.align_corners(*align);
    return o;
  };
  check_all({
      {"nearest size up, uneven", {{2, 3, 4, 5}}, [](L x) { return F::interpolate(x[0], {.size = {7, 11}}); },
       [=](T x) { return TF::interpolate(x[0], opts({7, 11}, {}, torch::kNearest)); }},
      {"nearest size down", {{2, 3, 9, 7}}, [](L x) { return F::interpolate(x[0], {.size = {4, 3}}); },
       [=](T x) { return TF::interpolate(x[0], opts({4, 3}, {}, torch::kNearest)); }},
      {"nearest scale 2", {{2, 3, 4, 5}}, [](L x) { return F::interpolate(x[0], {.scale_factor = {2.0}}); },
       [=](T x) { return TF::interpolate(x[0], opts({}, {2.0, 2.0}, torch::kNearest)); }},
      {"nearest scale 1.7 x 0.6", {{1, 2, 5, 8}}, [](L x) { return F::interpolate(x[0], {.scale_factor = {1.7, 0.6}}); },
       [=](T x) { return TF::interpolate(x[0], opts({}, {1.7, 0.6}, torch::kNearest)); }},
      {"nearest 1-d", {{2, 3, 5}}, [](L x) { return F::interpolate(x[0], {.size = {12}}); },
       [=](T x) { return TF::interpolate(x[0], opts({12}, {}, torch::kNearest)); }},
      {"bilinear size", {{2, 3, 4, 5}}, [](L x) { return F::interpolate(x[0], {.size = {7, 9}, .mode = M::Bilinear}); },
       [=](T x) { return TF::interpolate(x[0], opts({7, 9}, {}, torch::kBilinear, false)); }},
      {"bilinear size down", {{2, 3, 9, 8}}, [](L x) { return F::interpolate(x[0], {.size = {4, 5}, .mode = M::Bilinear}); },
       [=](T x) { return TF::interpolate(x[0], opts({4, 5}, {}, torch::kBilinear, false)); }},
      {"bilinear align_corners", {{2, 3, 4, 5}},
       [](L x) { return F::interpolate(x[0], {.size = {7, 9}, .mode = M::Bilinear, .align_corners = true}); },
       [=](T x) { return TF::interpolate(x[0], opts({7, 9}, {}, torch::kBilinear, true)); }},
      {"bilinear align_corners to 1 row", {{2, 3, 4, 5}},
       [](L x) { return F::interpolate(x[0], {.size = {1, 3}, .mode = M::Bilinear, .align_corners = true}); },
       [=](T x) { return TF::interpolate(x[0], opts({1, 3}, {}, torch::kBilinear, true)); }},
      {"bilinear scale 1.5 x 2.25", {{2, 2, 4, 4}},
       [](L x) { return F::interpolate(x[0], {.scale_factor = {1.5, 2.25}, .mode = M::Bilinear}); },
       [=](T x) { return TF::interpolate(x[0], opts({}, {1.5, 2.25}, torch::kBilinear, false)); }},
      {"bilinear scale 1.3 recomputed", {{2, 2, 5, 4}},
       [](L x) {
         return F::interpolate(x[0], {.scale_factor = {1.3}, .mode = M::Bilinear, .recompute_scale_factor = true});
       },
       [=](T x) { return TF::interpolate(x[0], opts({}, {1.3, 1.3}, torch::kBilinear, false).recompute_scale_factor(true)); }},
      {"linear 1-d", {{2, 3, 6}}, [](L x) { return F::interpolate(x[0], {.size = {10}, .mode = M::Linear}); },
       [=](T x) { return TF::interpolate(x[0], opts({10}, {}, torch::kLinear, false)); }},
      {"trilinear align_corners", {{1, 2, 3, 4, 3}},
       [](L x) { return F::interpolate(x[0], {.size = {5, 6, 2}, .mode = M::Trilinear, .align_corners = true}); },
       [=](T x) { return TF::interpolate(x[0], opts({5, 6, 2}, {}, torch::kTrilinear, true)); }},
      {"bicubic size up", {{2, 3, 4, 5}}, [](L x) { return F::interpolate(x[0], {.size = {7, 9}, .mode = M::Bicubic}); },
       [=](T x) { return TF::interpolate(x[0], opts({7, 9}, {}, torch::kBicubic, false)); }},
      {"bicubic size down", {{2, 3, 9, 8}}, [](L x) { return F::interpolate(x[0], {.size = {4, 5}, .mode = M::Bicubic}); },
       [=](T x) { return TF::interpolate(x[0], opts({4, 5}, {}, torch::kBicubic, false)); }},
      {"bicubic align_corners", {{1, 2, 5, 4}},
       [](L x) { return F::interpolate(x[0], {.size = {8, 3}, .mode = M::Bicubic, .align_corners = true}); },
       [=](T x) { return TF::interpolate(x[0], opts({8, 3}, {}, torch::kBicubic, true)); }},
      {"bicubic scale 1.5 x 0.7", {{2, 2, 6, 7}},
       [](L x) { return F::interpolate(x[0], {.scale_factor = {1.5, 0.7}, .mode = M::Bicubic}); },
       [=](T x) { return TF::interpolate(x[0], opts({}, {1.5, 0.7}, torch::kBicubic, false)); }},
      {"area 2-d down, uneven", {{2, 3, 9, 7}}, [](L x) { return F::interpolate(x[0], {.size = {4, 3}, .mode = M::Area}); },
       [=](T x) { return TF::interpolate(x[0], opts({4, 3}, {}, torch::kArea)); }},
      {"area 2-d up", {{2, 3, 3, 4}}, [](L x) { return F::interpolate(x[0], {.size = {5, 6}, .mode = M::Area}); },
       [=](T x) { return TF::interpolate(x[0], opts({5, 6}, {}, torch::kArea)); }},
      {"area 1-d scale 0.5", {{2, 3, 11}}, [](L x) { return F::interpolate(x[0], {.scale_factor = {0.5}, .mode = M::Area}); },
       [=](T x) { return TF::interpolate(x[0], opts({}, {0.5}, torch::kArea)); }},
      {"area 3-d", {{1, 2, 5, 4, 6}}, [](L x) { return F::interpolate(x[0], {.size = {3, 2, 4}, .mode = M::Area}); },
       [=](T x) { return TF::interpolate(x[0], opts({3, 2, 4}, {}, torch::kArea)); }},
      {"Upsample module bilinear x2", {{2, 3, 4, 5}},
       [](L x) { return c::nn::Upsample({.scale_factor = {2.0}, .mode = M::Bilinear})(x[0]); },
       [](T x) {
         return torch::nn::Upsample(torch::nn::UpsampleOptions().scale_factor(std::vector<double>{2.0, 2.0})
                                        .mode(torch::kBilinear).align_corners(false))(x[0]);
       }},
      {"pixel_shuffle", {{2, 12, 3, 4}}, [](L x) { return F::pixel_shuffle(x[0], 2); },
       [](T x) { return torch::pixel_shuffle(x[0], 2); }},
      {"pixel_unshuffle", {{2, 3, 6, 9}}, [](L x) { return F::pixel_unshuffle(x[0], 3); },
       [](T x) { return torch::pixel_unshuffle(x[0], 3); }},
      {"PixelShuffle module, extra leading dim", {{2, 2, 9, 2, 3}}, [](L x) { return c::nn::PixelShuffle(3)(x[0]); },
       [](T x) { return torch::nn::PixelShuffle(3)(x[0]); }},
  });
}

TEST_CASE("conv1d equals libtorch's, forward and backward", "[nn][libtorch][conv]") {
  check_all({
      {"conv1d plain", {{2, 3, 10}, {4, 3, 3}, {4}}, [](L x) { return F::conv1d(x[0], x[1], x[2]); },
       [](T x) { return torch::conv1d(x[0], x[1], x[2]); }},
      {"conv1d stride 2 padding 2 dilation 2", {{2, 3, 11}, {5, 3, 3}, {5}},
       [](L x) { return F::conv1d(x[0], x[1], x[2], 2, 2, 2); },
       [](T x) { return torch::conv1d(x[0], x[1], x[2], 2, 2, 2); }},
      {"conv1d groups 2, no bias", {{3, 4, 9}, {6, 2, 4}}, [](L x) { return F::conv1d(x[0], x[1], c::Tensor(), 1, 1, 1, 2); },
       [](T x) { return torch::conv1d(x[0], x[1], {}, 1, 1, 1, 2); }},
      {"conv1d unbatched", {{3, 8}, {2, 3, 5}, {2}}, [](L x) { return F::conv1d(x[0], x[1], x[2], 1, 2); },
       [](T x) { return torch::conv1d(x[0], x[1], x[2], 1, 2); }},
  });
}

TEST_CASE("Conv1d with each padding_mode equals libtorch's with the same weights", "[nn][libtorch][conv]") {
  torch::set_num_threads(1);
  using PM = F::PadMode;
  const std::vector<std::pair<PM, torch::nn::detail::conv_padding_mode_t>> modes = {
      {PM::Constant, torch::kZeros}, {PM::Reflect, torch::kReflect}, {PM::Replicate, torch::kReplicate},
      {PM::Circular, torch::kCircular}};
  for (const auto& [mode, tmode] : modes) {
    INFO(F::pad_mode_name(mode));
    c::manual_seed(3);
    c::nn::Conv1d ours(c::nn::Conv1dOptions(4, 6, 3).stride(2).padding(2).groups(2).padding_mode(mode));
    ours.to(c::kFloat64);
    torch::nn::Conv1d theirs(torch::nn::Conv1dOptions(4, 6, 3).stride(2).padding(2).groups(2).padding_mode(tmode));
    theirs->to(torch::kFloat64);
    {
      torch::NoGradGuard no_grad;
      theirs->weight.copy_(to_torch(ours.weight));
      theirs->bias.copy_(to_torch(ours.bias));
    }
    c::Tensor x = c::randn({2, 4, 9}, {.dtype = c::kFloat64});
    c::Tensor y = ours(x);
    torch::Tensor ty = theirs(to_torch(x));
    CHECK(max_diff(y, ty) < 1e-12);
    c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
    c::sum(c::mul(y, g)).backward();
    (ty * to_torch(g)).sum().backward();
    CHECK(max_diff(ours.weight.grad(), theirs->weight.grad()) < 1e-12);
    CHECK(max_diff(ours.bias.grad(), theirs->bias.grad()) < 1e-12);
  }
}

TEST_CASE("conv1d and conv2d with padding \"same\" and \"valid\" equal libtorch's, forward and backward",
          "[nn][libtorch][conv]") {
  using CP = F::ConvPadding;
  check_all({
      {"conv2d same, odd kernel", {{2, 3, 7, 6}, {4, 3, 3, 5}, {4}},
       [](L x) { return F::conv2d(x[0], x[1], x[2], {1, 1}, CP::Same); },
       [](T x) { return torch::nn::functional::conv2d(x[0], x[1], torch::nn::functional::Conv2dFuncOptions().bias(x[2]).padding(torch::kSame)); }},
      {"conv2d same, even kernel (one more after), dilation 2, groups 2", {{2, 4, 9, 8}, {6, 2, 4, 2}, {6}},
       [](L x) { return F::conv2d(x[0], x[1], x[2], {1, 1}, CP::Same, {2, 3}, 2); },
       [](T x) {
         return torch::nn::functional::conv2d(
             x[0], x[1], torch::nn::functional::Conv2dFuncOptions().bias(x[2]).padding(torch::kSame).dilation({2, 3}).groups(2));
       }},
      {"conv2d valid, stride 2", {{2, 3, 9, 8}, {4, 3, 3, 3}, {4}},
       [](L x) { return F::conv2d(x[0], x[1], x[2], {2, 2}, CP::Valid); },
       [](T x) { return torch::nn::functional::conv2d(x[0], x[1], torch::nn::functional::Conv2dFuncOptions().bias(x[2]).stride(2).padding(torch::kValid)); }},
      {"conv1d same, even kernel, dilation 3", {{2, 3, 12}, {5, 3, 4}, {5}},
       [](L x) { return F::conv1d(x[0], x[1], x[2], 1, CP::Same, 3); },
       [](T x) { return torch::nn::functional::conv1d(x[0], x[1], torch::nn::functional::Conv1dFuncOptions().bias(x[2]).padding(torch::kSame).dilation(3)); }},
      {"conv1d same, unbatched", {{3, 8}, {2, 3, 5}, {2}},
       [](L x) { return F::conv1d(x[0], x[1], x[2], 1, CP::Same); },
       [](T x) { return torch::nn::functional::conv1d(x[0].unsqueeze(0), x[1], torch::nn::functional::Conv1dFuncOptions().bias(x[2]).padding(torch::kSame)).squeeze(0); }},
  });
}

TEST_CASE("Conv2d with padding \"same\" in each padding_mode equals libtorch's with the same weights",
          "[nn][libtorch][conv]") {
  torch::set_num_threads(1);
  using PM = F::PadMode;
  const std::vector<std::pair<PM, torch::nn::detail::conv_padding_mode_t>> modes = {
      {PM::Constant, torch::kZeros}, {PM::Reflect, torch::kReflect}, {PM::Replicate, torch::kReplicate},
      {PM::Circular, torch::kCircular}};
  for (const bool same : {true, false}) {
    for (const auto& [mode, tmode] : modes) {
      INFO(F::pad_mode_name(mode) << (same ? " same" : " padding (1, 2)"));
      c::manual_seed(4);
      auto opts = c::nn::Conv2dOptions(4, 6, {4, 3}).dilation({1, 2}).groups(2).padding_mode(mode);
      auto topts = torch::nn::Conv2dOptions(4, 6, {4, 3}).dilation({1, 2}).groups(2).padding_mode(tmode);
      if (same) {
        opts.padding(F::ConvPadding::Same);
        topts.padding(torch::kSame);
      } else {
        opts.padding(c::nn::Pair{1, 2});
        topts.padding({1, 2});
      }
      c::nn::Conv2d ours(opts);
      ours.to(c::kFloat64);
      torch::nn::Conv2d theirs(topts);
      theirs->to(torch::kFloat64);
      {
        torch::NoGradGuard no_grad;
        theirs->weight.copy_(to_torch(ours.weight));
        theirs->bias.copy_(to_torch(ours.bias));
      }
      c::Tensor x = c::randn({2, 4, 8, 7}, {.dtype = c::kFloat64});
      c::Tensor y = ours(x);
      torch::Tensor ty;
      if (same && mode != PM::Constant) {
        // libtorch 1.13's C++ Conv2d applies the height's "same" amounts to the width and the
        // width's to the height in a non-zeros padding_mode (its output here is [2, 6, 9, 6]), so the
        // reference is what Python's Conv2d does: F.pad by (2, 2, 1, 2) in the mode, then an
        // unpadded convolution with the same weights.
        namespace tf = torch::nn::functional;
        const tf::PadFuncOptions::mode_t tm = mode == PM::Reflect     ? tf::PadFuncOptions::mode_t(torch::kReflect)
                                              : mode == PM::Replicate ? tf::PadFuncOptions::mode_t(torch::kReplicate)
                                                                      : tf::PadFuncOptions::mode_t(torch::kCircular);
        ty = torch::conv2d(tf::pad(to_torch(x), tf::PadFuncOptions({2, 2, 1, 2}).mode(tm)), theirs->weight, theirs->bias,
                           std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 2}, 2);
      } else {
        ty = theirs(to_torch(x));
      }
      if (same) CHECK((y.size(2) == 8 && y.size(3) == 7));
      INFO("chorus " << c::shape_str(y.sizes()) << " libtorch " << ty.sizes());
      REQUIRE(max_diff(y, ty) < 1e-12);
      c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
      c::sum(c::mul(y, g)).backward();
      (ty * to_torch(g)).sum().backward();
      CHECK(max_diff(ours.weight.grad(), theirs->weight.grad()) < 1e-12);
      CHECK(max_diff(ours.bias.grad(), theirs->bias.grad()) < 1e-12);
    }
  }
  // Conv1d padding "same" in reflect mode, and the refusals of "same" with a stride.
  c::manual_seed(5);
  c::nn::Conv1d ours(c::nn::Conv1dOptions(3, 2, 4).padding(F::ConvPadding::Same).dilation(2).padding_mode(PM::Reflect));
  ours.to(c::kFloat64);
  torch::nn::Conv1d theirs(torch::nn::Conv1dOptions(3, 2, 4).padding(torch::kSame).dilation(2).padding_mode(torch::kReflect));
  theirs->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    theirs->weight.copy_(to_torch(ours.weight));
    theirs->bias.copy_(to_torch(ours.bias));
  }
  c::Tensor x = c::randn({2, 3, 10}, {.dtype = c::kFloat64});
  CHECK(max_diff(ours(x), theirs(to_torch(x))) < 1e-12);
  CHECK(ours(x).size(2) == 10);
  CHECK_THROWS_WITH(c::nn::Conv2d(c::nn::Conv2dOptions(2, 2, 3).stride(2).padding(F::ConvPadding::Same)),
                    Catch::Contains("padding=\"same\" is not supported for strided convolutions, got stride (2, 2)"));
  CHECK_THROWS_WITH(c::nn::Conv1d(c::nn::Conv1dOptions(2, 2, 3).stride(3).padding(F::ConvPadding::Same)),
                    Catch::Contains("got stride 3; expected 1"));
  CHECK_THROWS_WITH(F::conv2d(x.unsqueeze(0), c::randn({2, 3, 1, 3}, {.dtype = c::kFloat64}), c::Tensor(), {1, 2}, F::ConvPadding::Same),
                    Catch::Contains("not supported for strided convolutions"));
}

TEST_CASE("cross_entropy with class-probability targets equals libtorch's, forward and backward",
          "[nn][libtorch][loss]") {
  // The second input becomes probabilities through a softmax on both sides, so its gradient is
  // compared too (a soft target may require grad).
  auto probs = [](const Tensor& t) { return c::softmax(t, 1); };
  auto tprobs = [](const torch::Tensor& t) { return torch::softmax(t, 1); };
  check_all({
      {"probabilities, mean", {{5, 7}, {5, 7}}, [=](L x) { return F::cross_entropy(x[0], probs(x[1])); },
       [=](T x) { return TF::cross_entropy(x[0], tprobs(x[1])); }},
      {"probabilities, sum, label smoothing", {{4, 6}, {4, 6}},
       [=](L x) { return F::cross_entropy(x[0], probs(x[1]), {.label_smoothing = 0.2, .reduction = F::Reduction::Sum}); },
       [=](T x) {
         return TF::cross_entropy(x[0], tprobs(x[1]), TF::CrossEntropyFuncOptions().label_smoothing(0.2).reduction(torch::kSum));
       }},
      {"probabilities, spatial, none", {{2, 3, 4, 5}, {2, 3, 4, 5}},
       [=](L x) { return F::cross_entropy(x[0], probs(x[1]), {.reduction = F::Reduction::None}); },
       [=](T x) { return TF::cross_entropy(x[0], tprobs(x[1]), TF::CrossEntropyFuncOptions().reduction(torch::kNone)); }},
      {"probabilities, class weights, mean", {{6, 4}, {6, 4}},
       [=](L x) {
         const Tensor w = c::tensor({0.5, 1.0, 2.0, 0.25}).to(x[0].dtype());
         return F::cross_entropy(x[0], probs(x[1]), {.weight = w});
       },
       [=](T x) {
         const torch::Tensor w = torch::tensor({0.5, 1.0, 2.0, 0.25}, x[0].options()).detach();
         return TF::cross_entropy(x[0], tprobs(x[1]), TF::CrossEntropyFuncOptions().weight(w));
       }},
  });
  c::Tensor logits = c::randn({3, 4});
  CHECK_THROWS_WITH(F::cross_entropy(logits, c::rand({3, 5})), Catch::Contains("nor class probabilities (the input's shape [3, 4]"));
  CHECK_THROWS_WITH(F::cross_entropy(logits, c::rand({3, 4}, {.dtype = c::kFloat64})),
                    Catch::Contains("must match the input's dtype"));
}

TEST_CASE("ModuleDict and the norm layers name their state as libtorch's", "[nn][libtorch][container]") {
  auto names = [](const auto& pairs) {
    std::vector<std::string> out;
    for (const auto& p : pairs) out.push_back(p.key());
    return out;
  };
  auto our_names = [](const c::nn::Module& m) {
    std::vector<std::string> out;
    for (const auto& [n, t] : m.state_dict()) out.push_back(n);
    return out;
  };
  c::nn::ModuleDict ours{{"conv", std::make_shared<c::nn::Conv1d>(2, 4, 3)},
                         {"gn", std::make_shared<c::nn::GroupNorm>(2, 4)},
                         {"inorm", std::make_shared<c::nn::InstanceNorm2d>(4, 1e-5, 0.1, true, true)},
                         {"up", std::make_shared<c::nn::Upsample>(F::InterpolateOptions{.scale_factor = {2.0}})}};
  torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>> items;
  items.insert("conv", torch::nn::Conv1d(2, 4, 3).ptr());
  items.insert("gn", torch::nn::GroupNorm(2, 4).ptr());
  items.insert("inorm",
               torch::nn::InstanceNorm2d(torch::nn::InstanceNorm2dOptions(4).affine(true).track_running_stats(true)).ptr());
  items.insert("up", torch::nn::Upsample(torch::nn::UpsampleOptions().scale_factor(std::vector<double>{2.0, 2.0})).ptr());
  torch::nn::ModuleDict theirs(items);
  std::vector<std::string> expected = names(theirs->named_parameters());
  for (const auto& b : names(theirs->named_buffers())) expected.push_back(b);
  CHECK(our_names(ours) == expected);
  CHECK(expected.size() == 9);
}

TEST_CASE("conv_transpose1d/2d equal libtorch's, forward and backward", "[nn][libtorch][conv_transpose]") {
  check_all({
      {"conv_transpose2d plain", {{2, 3, 4, 5}, {3, 4, 3, 3}, {4}}, [](L x) { return F::conv_transpose2d(x[0], x[1], x[2]); },
       [](T x) { return torch::conv_transpose2d(x[0], x[1], x[2]); }},
      {"conv_transpose2d stride 2 padding 1 output_padding 1", {{2, 4, 3, 4}, {4, 3, 3, 2}, {3}},
       [](L x) { return F::conv_transpose2d(x[0], x[1], x[2], {2, 2}, {1, 1}, {1, 1}); },
       [](T x) { return torch::conv_transpose2d(x[0], x[1], x[2], {2, 2}, {1, 1}, {1, 1}); }},
      {"conv_transpose2d stride (3, 2) padding (2, 0) output_padding (2, 1) groups 2", {{2, 4, 3, 3}, {4, 3, 4, 3}, {6}},
       [](L x) { return F::conv_transpose2d(x[0], x[1], x[2], {3, 2}, {2, 0}, {2, 1}, 2); },
       [](T x) { return torch::conv_transpose2d(x[0], x[1], x[2], {3, 2}, {2, 0}, {2, 1}, 2); }},
      {"conv_transpose2d dilation 2 stride 2, no bias", {{2, 2, 4, 3}, {2, 3, 2, 3}},
       [](L x) { return F::conv_transpose2d(x[0], x[1], c::Tensor(), {2, 2}, {1, 2}, {0, 1}, 1, {2, 2}); },
       [](T x) { return torch::conv_transpose2d(x[0], x[1], {}, {2, 2}, {1, 2}, {0, 1}, 1, {2, 2}); }},
      {"conv_transpose2d output_padding >= stride, < dilation", {{2, 2, 3, 4}, {2, 2, 3, 2}, {2}},
       [](L x) { return F::conv_transpose2d(x[0], x[1], x[2], {1, 2}, {1, 0}, {2, 2}, 1, {3, 3}); },
       [](T x) { return torch::conv_transpose2d(x[0], x[1], x[2], {1, 2}, {1, 0}, {2, 2}, 1, {3, 3}); }},
      {"conv_transpose2d unbatched, groups 3", {{3, 4, 4}, {3, 2, 2, 2}, {6}},
       [](L x) { return F::conv_transpose2d(x[0], x[1], x[2], {2, 1}, {0, 1}, {1, 0}, 3); },
       [](T x) { return torch::conv_transpose2d(x[0], x[1], x[2], {2, 1}, {0, 1}, {1, 0}, 3); }},
      {"conv_transpose2d larger, oneDNN-sized", {{4, 8, 6, 7}, {8, 4, 3, 3}, {8}},
       [](L x) { return F::conv_transpose2d(x[0], x[1], x[2], {2, 2}, {1, 1}, {1, 0}, 2); },
       [](T x) { return torch::conv_transpose2d(x[0], x[1], x[2], {2, 2}, {1, 1}, {1, 0}, 2); }},
      {"conv_transpose1d plain", {{2, 3, 6}, {3, 5, 3}, {5}}, [](L x) { return F::conv_transpose1d(x[0], x[1], x[2]); },
       [](T x) { return torch::conv_transpose1d(x[0], x[1], x[2]); }},
      {"conv_transpose1d stride 3 padding 1 output_padding 2 groups 2 dilation 2", {{2, 4, 5}, {4, 3, 3}, {6}},
       [](L x) { return F::conv_transpose1d(x[0], x[1], x[2], 3, 1, 2, 2, 2); },
       [](T x) { return torch::conv_transpose1d(x[0], x[1], x[2], 3, 1, 2, 2, 2); }},
      {"conv_transpose1d unbatched, no bias", {{3, 7}, {3, 2, 4}},
       [](L x) { return F::conv_transpose1d(x[0], x[1], c::Tensor(), 2, 1, 1); },
       [](T x) { return torch::conv_transpose1d(x[0], x[1], {}, 2, 1, 1); }},
  });
}

TEST_CASE("ConvTranspose1d/2d with the same weights and an output_size equal libtorch's", "[nn][libtorch][conv_transpose]") {
  torch::set_num_threads(1);
  c::manual_seed(5);
  c::nn::ConvTranspose2d ours(c::nn::ConvTranspose2dOptions(4, 6, {3, 2}).stride({2, 3}).padding(1).groups(2));
  ours.to(c::kFloat64);
  torch::nn::ConvTranspose2d theirs(torch::nn::ConvTranspose2dOptions(4, 6, {3, 2}).stride({2, 3}).padding(1).groups(2));
  theirs->to(torch::kFloat64);
  REQUIRE(ours.weight.sizes() == c::Shape(theirs->weight.sizes().begin(), theirs->weight.sizes().end()));
  {
    torch::NoGradGuard no_grad;
    theirs->weight.copy_(to_torch(ours.weight));
    theirs->bias.copy_(to_torch(ours.bias));
  }
  c::Tensor x = c::randn({2, 4, 3, 4}, {.dtype = c::kFloat64});
  c::Tensor y = ours.forward(x, std::vector<int64_t>{6, 11});
  torch::Tensor ty = theirs->forward(to_torch(x), std::vector<int64_t>{6, 11});
  CHECK(y.sizes() == c::Shape{2, 6, 6, 11});
  CHECK(max_diff(y, ty) < 1e-10);
  c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
  c::sum(c::mul(y, g)).backward();
  (ty * to_torch(g)).sum().backward();
  CHECK(max_diff(ours.weight.grad(), theirs->weight.grad()) < 1e-10);
  CHECK(max_diff(ours.bias.grad(), theirs->bias.grad()) < 1e-10);

  // Dilation 1 here: libtorch 1.13's C++ _output_padding leaves dilation out of the smallest size
  // (Python's includes it, as chorus does).
  c::nn::ConvTranspose1d ours1(c::nn::ConvTranspose1dOptions(3, 2, 4).stride(3).bias(false));
  ours1.to(c::kFloat64);
  torch::nn::ConvTranspose1d theirs1(torch::nn::ConvTranspose1dOptions(3, 2, 4).stride(3).bias(false));
  theirs1->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    theirs1->weight.copy_(to_torch(ours1.weight));
  }
  c::Tensor x1 = c::randn({2, 3, 5}, {.dtype = c::kFloat64}).requires_grad_();
  torch::Tensor tx1 = to_torch(x1).requires_grad_();
  c::Tensor y1 = ours1.forward(x1, std::vector<int64_t>{2, 2, 17});
  torch::Tensor ty1 = theirs1->forward(tx1, std::vector<int64_t>{2, 2, 17});
  CHECK(max_diff(y1, ty1) < 1e-10);
  c::Tensor g1 = c::randn(y1.sizes(), {.dtype = c::kFloat64});
  c::sum(c::mul(y1, g1)).backward();
  (ty1 * to_torch(g1)).sum().backward();
  CHECK(max_diff(x1.grad(), tx1.grad()) < 1e-10);
  CHECK(max_diff(ours1.weight.grad(), theirs1->weight.grad()) < 1e-10);
}

TEST_CASE("embedding_bag equals libtorch's in every mode, forward and backward", "[nn][libtorch][embedding_bag]") {
  using M = F::EmbeddingBagMode;
  // Fixed bags with an empty one and repeated indices; 7 is padding_idx where one is given.
  const std::vector<int64_t> idx = {1, 7, 3, 3, 0, 9, 7, 2, 5, 1, 8};
  const std::vector<int64_t> off = {0, 3, 3, 6};
  const std::vector<int64_t> off_last = {0, 3, 3, 6, 11};
  const c::Tensor ci = c::tensor<int64_t>(idx), co = c::tensor<int64_t>(off), co_last = c::tensor<int64_t>(off_last);
  const c::Tensor ci2 = c::tensor<int64_t>({4, 1, 4, 0, 7, 2, 9, 9, 3, 7, 7, 7}, c::Shape{4, 3});
  const torch::Tensor ti = torch::tensor(idx), to = torch::tensor(off), to_last = torch::tensor(off_last);
  const torch::Tensor ti2 = torch::tensor({4, 1, 4, 0, 7, 2, 9, 9, 3, 7, 7, 7}, torch::kInt64).view({4, 3});
  using EO = TF::EmbeddingBagFuncOptions;
  check_all({
      {"sum with offsets", {{10, 3}}, [=](L x) { return F::embedding_bag(ci, x[0], co, M::Sum); },
       [=](T x) { return TF::embedding_bag(ti, x[0], EO().offsets(to).mode(torch::kSum)); }},
      {"mean with offsets", {{10, 3}}, [=](L x) { return F::embedding_bag(ci, x[0], co, M::Mean); },
       [=](T x) { return TF::embedding_bag(ti, x[0], EO().offsets(to).mode(torch::kMean)); }},
      {"max with offsets", {{10, 3}}, [=](L x) { return F::embedding_bag(ci, x[0], co, M::Max); },
       [=](T x) { return TF::embedding_bag(ti, x[0], EO().offsets(to).mode(torch::kMax)); }},
      {"sum with per_sample_weights", {{10, 4}, {11}},
       [=](L x) { return F::embedding_bag(ci, x[0], co, M::Sum, x[1]); },
       [=](T x) { return TF::embedding_bag(ti, x[0], EO().offsets(to).mode(torch::kSum).per_sample_weights(x[1])); }},
      {"sum include_last_offset, per_sample_weights, padding_idx", {{10, 2}, {11}},
       [=](L x) { return F::embedding_bag(ci, x[0], co_last, M::Sum, x[1], true, 7); },
       [=](T x) {
         return TF::embedding_bag(
             ti, x[0], EO().offsets(to_last).mode(torch::kSum).per_sample_weights(x[1]).include_last_offset(true).padding_idx(7));
       }},
      {"mean include_last_offset, padding_idx", {{10, 3}},
       [=](L x) { return F::embedding_bag(ci, x[0], co_last, M::Mean, c::Tensor(), true, 7); },
       [=](T x) { return TF::embedding_bag(ti, x[0], EO().offsets(to_last).mode(torch::kMean).include_last_offset(true).padding_idx(7)); }},
      {"max padding_idx -3", {{10, 3}}, [=](L x) { return F::embedding_bag(ci, x[0], co, M::Max, c::Tensor(), false, -3); },
       [=](T x) { return TF::embedding_bag(ti, x[0], EO().offsets(to).mode(torch::kMax).padding_idx(7)); }},
      {"2-D input sum", {{10, 3}}, [=](L x) { return F::embedding_bag(ci2, x[0], c::Tensor(), M::Sum); },
       [=](T x) { return TF::embedding_bag(ti2, x[0], EO().mode(torch::kSum)); }},
      {"2-D input mean, padding_idx", {{10, 3}},
       [=](L x) { return F::embedding_bag(ci2, x[0], c::Tensor(), M::Mean, c::Tensor(), false, 7); },
       [=](T x) { return TF::embedding_bag(ti2, x[0], EO().mode(torch::kMean).padding_idx(7)); }},
      {"2-D input max with per_sample_weights for sum", {{10, 3}, {4, 3}},
       [=](L x) { return F::embedding_bag(ci2, x[0], c::Tensor(), M::Sum, x[1]); },
       [=](T x) { return TF::embedding_bag(ti2, x[0], EO().mode(torch::kSum).per_sample_weights(x[1])); }},
      {"2-D input max", {{10, 3}}, [=](L x) { return F::embedding_bag(ci2, x[0], c::Tensor(), M::Max, c::Tensor(), false, 7); },
       [=](T x) { return TF::embedding_bag(ti2, x[0], EO().mode(torch::kMax).padding_idx(7)); }},
      {"EmbeddingBag module, weight as input", {{10, 3}},
       [=](L x) {
         c::nn::EmbeddingBag bag(10, 3, {.mode = M::Sum, .include_last_offset = true});
         bag.weight = x[0];
         return bag.forward(ci, co_last);
       },
       [=](T x) {
         // (libtorch 1.13's from_pretrained drops include_last_offset, so the weight is set by hand.)
         torch::nn::EmbeddingBag bag(torch::nn::EmbeddingBagOptions(10, 3).mode(torch::kSum).include_last_offset(true));
         bag->weight = x[0];
         return bag(ti, to_last);
       }},
  });
}

namespace {

// Copies every chorus parameter into the libtorch parameter of the same name; the two name lists
// must be equal (which is what makes state dicts portable).
void copy_parameters_by_name(const c::nn::Module& ours, torch::nn::Module& theirs) {
  std::vector<std::string> our_names, their_names;
  for (const auto& [name, p] : ours.named_parameters()) our_names.push_back(name);
  for (const auto& item : theirs.named_parameters()) their_names.push_back(item.key());
  std::sort(our_names.begin(), our_names.end());
  std::sort(their_names.begin(), their_names.end());
  REQUIRE(our_names == their_names);
  torch::NoGradGuard no_grad;
  auto theirs_by_name = theirs.named_parameters();
  for (const auto& [name, p] : ours.named_parameters()) {
    torch::Tensor& t = theirs_by_name[name];
    REQUIRE(c::Shape(t.sizes().begin(), t.sizes().end()) == p.sizes());
    t.copy_(to_torch(p));
  }
}

// Every parameter's gradient of ours against the same-named one of theirs.
void check_parameter_grads(const c::nn::Module& ours, torch::nn::Module& theirs, double tol) {
  auto theirs_by_name = theirs.named_parameters();
  for (const auto& [name, p] : ours.named_parameters()) {
    INFO("gradient of " << name);
    REQUIRE(p.grad().defined());
    CHECK(max_diff(p.grad(), theirs_by_name[name].grad()) < tol);
  }
}

}  // namespace

TEST_CASE("Transformer, TransformerDecoder(Layer) equal libtorch's with every parameter copied by name",
          "[nn][libtorch][transformer]") {
  torch::set_num_threads(1);
  const int64_t E = 8, H = 2, S = 5, T = 4, N = 3;
  c::manual_seed(31);
  for (const bool gelu : {false, true}) {
    INFO((gelu ? "gelu" : "relu"));
    c::nn::Transformer ours({.d_model = E, .nhead = H, .num_encoder_layers = 2, .num_decoder_layers = 2,
                             .dim_feedforward = 12, .dropout = 0.0, .activation = gelu ? "gelu" : "relu"});
    ours.to(c::kFloat64);
    ours.eval();
    torch::nn::TransformerOptions topts(E, H);
    topts.num_encoder_layers(2).num_decoder_layers(2).dim_feedforward(12).dropout(0.0);
    if (gelu) topts.activation(torch::kGELU);
    torch::nn::Transformer theirs(topts);
    theirs->to(torch::kFloat64);
    theirs->eval();
    copy_parameters_by_name(ours, *theirs);

    c::Tensor src = c::randn({S, N, E}, {.dtype = c::kFloat64}).requires_grad_();
    c::Tensor tgt = c::randn({T, N, E}, {.dtype = c::kFloat64}).requires_grad_();
    c::Tensor tgt_mask = c::nn::Transformer::generate_square_subsequent_mask(T, {.dtype = c::kFloat64});
    c::Tensor memory_mask = c::randn({T, S}, {.dtype = c::kFloat64});
    c::Tensor src_pad = c::tensor<bool>({false, false, false, false, true, false, false, false, true, true,
                                         false, false, false, false, false}, c::Shape{N, S});
    c::Tensor tgt_pad = c::tensor<bool>({false, false, false, true, false, false, false, false, false, false,
                                         false, true}, c::Shape{N, T});
    torch::Tensor tsrc = to_torch(src).requires_grad_(), ttgt = to_torch(tgt).requires_grad_();
    torch::Tensor ttgt_mask = torch::nn::TransformerImpl::generate_square_subsequent_mask(T).to(torch::kFloat64);
    CHECK(torch::equal(to_torch(tgt_mask), ttgt_mask));
    auto to_bool = [](const c::Tensor& m) { return to_torch(m).to(torch::kBool); };

    c::Tensor y = ours.forward(src, tgt, c::Tensor(), tgt_mask, memory_mask, src_pad, tgt_pad, src_pad);
    torch::Tensor ty = theirs->forward(tsrc, ttgt, {}, ttgt_mask, to_torch(memory_mask), to_bool(src_pad),
                                       to_bool(tgt_pad), to_bool(src_pad));
    REQUIRE(y.sizes() == c::Shape{T, N, E});
    CHECK(max_diff(y, ty) < 1e-10);
    c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
    c::sum(c::mul(y, g)).backward();
    (ty * to_torch(g)).sum().backward();
    CHECK(max_diff(src.grad(), tsrc.grad()) < 1e-10);
    CHECK(max_diff(tgt.grad(), ttgt.grad()) < 1e-10);
    check_parameter_grads(ours, *theirs, 1e-10);
  }

  // The decoder stack alone, with a final norm, and one layer.
  c::nn::TransformerDecoder ours_dec(E, H, 2, {.dim_feedforward = 6, .dropout = 0.0}, true);
  ours_dec.to(c::kFloat64);
  torch::nn::TransformerDecoder theirs_dec(
      torch::nn::TransformerDecoderOptions(torch::nn::TransformerDecoderLayerOptions(E, H).dim_feedforward(6).dropout(0.0), 2)
          .norm(torch::nn::AnyModule(torch::nn::LayerNorm(torch::nn::LayerNormOptions({E})))));
  theirs_dec->to(torch::kFloat64);
  copy_parameters_by_name(ours_dec, *theirs_dec);
  c::Tensor tgt = c::randn({T, N, E}, {.dtype = c::kFloat64}).requires_grad_();
  c::Tensor memory = c::randn({S, N, E}, {.dtype = c::kFloat64}).requires_grad_();
  torch::Tensor ttgt = to_torch(tgt).requires_grad_(), tmemory = to_torch(memory).requires_grad_();
  c::Tensor y = ours_dec.forward(tgt, memory, c::nn::Transformer::generate_square_subsequent_mask(T, {.dtype = c::kFloat64}));
  torch::Tensor ty = theirs_dec->forward(ttgt, tmemory, torch::nn::TransformerImpl::generate_square_subsequent_mask(T).to(torch::kFloat64));
  CHECK(max_diff(y, ty) < 1e-10);
  c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
  c::sum(c::mul(y, g)).backward();
  (ty * to_torch(g)).sum().backward();
  CHECK(max_diff(tgt.grad(), ttgt.grad()) < 1e-10);
  CHECK(max_diff(memory.grad(), tmemory.grad()) < 1e-10);
  check_parameter_grads(ours_dec, *theirs_dec, 1e-10);

  c::nn::TransformerDecoderLayer ours_layer(E, H, {.dim_feedforward = 6, .dropout = 0.0, .activation = "gelu"});
  ours_layer.to(c::kFloat64);
  torch::nn::TransformerDecoderLayer theirs_layer(
      torch::nn::TransformerDecoderLayerOptions(E, H).dim_feedforward(6).dropout(0.0).activation(torch::kGELU));
  theirs_layer->to(torch::kFloat64);
  copy_parameters_by_name(ours_layer, *theirs_layer);
  c::Tensor memory_pad = c::tensor<bool>({false, true, false, false, false, false, false, false, false, false, false,
                                          false, false, true, true}, c::Shape{N, S});
  c::Tensor y1 = ours_layer.forward(tgt, memory, c::Tensor(), c::Tensor(), c::Tensor(), memory_pad);
  torch::Tensor ty1 = theirs_layer->forward(ttgt, tmemory, {}, {}, {}, to_torch(memory_pad).to(torch::kBool));
  CHECK(max_diff(y1, ty1) < 1e-10);
}

// Channels-last: the layout of each result (and of the input's gradient) is libtorch's, op by op,
// with the same values. Inputs are made channels-last in both libraries the same way.
TEST_CASE("channels-last results have libtorch's layouts and values", "[nn][libtorch][channels_last]") {
  torch::set_num_threads(1);
  constexpr auto kCL = c::MemoryFormat::ChannelsLast;
  struct Op {
    std::string name;
    std::function<c::Tensor(const c::Tensor&)> ours;
    std::function<torch::Tensor(const torch::Tensor&)> theirs;
  };
  c::manual_seed(31);
  const c::Tensor w = c::randn({6, 4, 3, 3}, {.dtype = c::kFloat64}), b = c::randn({6}, {.dtype = c::kFloat64});
  const c::Tensor g4 = c::randn({4}, {.dtype = c::kFloat64}), b4 = c::randn({4}, {.dtype = c::kFloat64});
  const torch::Tensor tw = to_torch(w), tb = to_torch(b), tg4 = to_torch(g4), tb4 = to_torch(b4);
  const std::vector<Op> ops = {
      {"conv2d", [&](const c::Tensor& x) { return F::conv2d(x, w, b, {1, 1}, {1, 1}); },
       [&](const torch::Tensor& x) { return torch::conv2d(x, tw, tb, 1, 1); }},
      {"conv2d with a channels-last weight on an NCHW input",
       [&](const c::Tensor& x) { return F::conv2d(x.contiguous(), w.contiguous(kCL), b); },
       [&](const torch::Tensor& x) { return torch::conv2d(x.contiguous(), tw.contiguous(torch::MemoryFormat::ChannelsLast), tb); }},
      {"batch_norm (training)",
       [&](const c::Tensor& x) { return F::batch_norm(x, c::Tensor(), c::Tensor(), g4, b4, true, 0.1, 1e-5); },
       [&](const torch::Tensor& x) { return torch::batch_norm(x, tg4, tb4, {}, {}, true, 0.1, 1e-5, false); }},
      {"relu", [](const c::Tensor& x) { return x.relu(); }, [](const torch::Tensor& x) { return x.relu(); }},
      {"x + x * 2", [](const c::Tensor& x) { return x + x * 2.0; }, [](const torch::Tensor& x) { return x + x * 2.0; }},
      {"max_pool2d", [](const c::Tensor& x) { return F::max_pool2d(x, {3, 3}, F::Pair{2, 2}, {1, 1}); },
       [](const torch::Tensor& x) { return torch::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}); }},
      {"avg_pool2d", [](const c::Tensor& x) { return F::avg_pool2d(x, {2, 2}); },
       [](const torch::Tensor& x) { return torch::avg_pool2d(x, {2, 2}); }},
      {"adaptive_avg_pool2d 2x3", [](const c::Tensor& x) { return F::adaptive_avg_pool2d(x, {2, 3}); },
       [](const torch::Tensor& x) { return torch::adaptive_avg_pool2d(x, {2, 3}); }},
  };
  for (const Op& op : ops) {
    INFO(op.name);
    c::manual_seed(32);
    c::Tensor x = c::randn({3, 4, 7, 6}, {.dtype = c::kFloat64}).contiguous(kCL).requires_grad_();
    torch::Tensor tx = to_torch(x).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_();
    c::Tensor y = op.ours(x);
    torch::Tensor ty = op.theirs(tx);
    CHECK(y.strides() == c::Strides(ty.strides().begin(), ty.strides().end()));
    CHECK(max_diff(y, ty) < 1e-10);
    c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
    c::sum(y * g).backward();
    (ty * to_torch(g)).sum().backward();
    REQUIRE(x.grad().defined());
    CHECK(x.grad().strides() == c::Strides(tx.grad().strides().begin(), tx.grad().strides().end()));
    CHECK(max_diff(x.grad(), tx.grad()) < 1e-10);
  }
}
