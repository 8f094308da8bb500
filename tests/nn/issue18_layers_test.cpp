// The issue-18 layers beyond what the libtorch parity test compares: the chorus::Error each kind of
// bad input gets, module state_dict names, the sim device giving the CPU's numbers, and behaviour
// checked by hand (the values of a small pad).
#include <catch2/catch.hpp>

#include "nn/functional.h"
#include "nn/nn.h"
#include "tensor/ops.h"
#include "tests/nn/reference.h"

namespace c = chorus;
namespace F = chorus::nn::functional;
using c::nn_test::error_message;
using Catch::Matchers::Contains;

namespace {

// Runs fn on the CPU and on the sim device with the same float64 input; forward and gradient agree.
template <typename Fn>
void check_sim_equals_cpu(const c::Shape& shape, Fn fn) {
  c::manual_seed(7);
  c::Tensor x = c::randn(shape, {.dtype = c::kFloat64}).requires_grad_();
  c::Tensor xs = x.detach().to(c::Device("sim:0")).requires_grad_();
  c::Tensor y = fn(x), ys = fn(xs);
  REQUIRE(ys.device() == c::Device("sim:0"));
  CHECK(c::allclose(ys.to(c::kCPU), y, 1e-12, 1e-12));
  c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
  c::sum(c::mul(y, g)).backward();
  c::sum(c::mul(ys, g.to(c::Device("sim:0")))).backward();
  CHECK(c::allclose(xs.grad().to(c::kCPU), x.grad(), 1e-12, 1e-12));
}

}  // namespace

TEST_CASE("pad: values of a small reflect, replicate and circular pad", "[nn][pad]") {
  c::Tensor x = c::tensor<double>({1, 2, 3}, c::Shape{1, 1, 3});
  CHECK(c::nn_test::doubles(F::pad(x, {2, 2}, F::PadMode::Reflect)) == std::vector<double>{3, 2, 1, 2, 3, 2, 1});
  CHECK(c::nn_test::doubles(F::pad(x, {2, 1}, F::PadMode::Replicate)) == std::vector<double>{1, 1, 1, 2, 3, 3});
  CHECK(c::nn_test::doubles(F::pad(x, {2, 3}, F::PadMode::Circular)) ==
        std::vector<double>{2, 3, 1, 2, 3, 1, 2, 3});
  CHECK(c::nn_test::doubles(F::pad(x, {-1, 1}, F::PadMode::Constant, 9)) == std::vector<double>{2, 3, 9});
}

TEST_CASE("pad: the sim device gives the CPU's values and gradients", "[nn][pad][sim]") {
  check_sim_equals_cpu({2, 3, 4, 5}, [](const c::Tensor& x) { return F::pad(x, {2, 1, 1, 3}, F::PadMode::Reflect); });
  check_sim_equals_cpu({2, 3, 4, 5}, [](const c::Tensor& x) { return F::pad(x, {-1, 2, 1, 0}, F::PadMode::Constant, 2); });
}

TEST_CASE("pad: bad padding lists and sizes are errors naming what was given", "[nn][pad][errors]") {
  c::Tensor x = c::randn({2, 3, 4});
  CHECK_THAT(error_message([&] { F::pad(x, {1, 2, 3}); }), Contains("even length") && Contains("{1, 2, 3}"));
  CHECK_THAT(error_message([&] { F::pad(x, {1, 1, 1, 1, 1, 1, 1, 1}); }), Contains("pads 4 dims") && Contains("[2, 3, 4]"));
  CHECK_THAT(error_message([&] { F::pad(x, {4, 0}, F::PadMode::Reflect); }),
             Contains("reflect") && Contains("smaller than the dim's size 4"));
  CHECK_THAT(error_message([&] { F::pad(x, {5, 0}, F::PadMode::Circular); }), Contains("at most the dim's size 4"));
  CHECK_THAT(error_message([&] { F::pad(c::randn({4}), {1, 1}, F::PadMode::Replicate); }),
             Contains("2-D or 3-D input") && Contains("[4]"));
  CHECK_THAT(error_message([&] { F::pad(x, {1, 1}, F::PadMode::Reflect, 3.0); }), Contains("only used in constant mode"));
  CHECK_THAT(error_message([&] { F::pad(x, {-3, -2}); }), Contains("negative or empty size -1"));
}

namespace {
std::vector<std::string> state_names(const c::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, t] : m.state_dict()) names.push_back(name);
  return names;
}
}  // namespace

TEST_CASE("GroupNorm and InstanceNorm2d: state_dict names and initial values as PyTorch's", "[nn][norm]") {
  c::nn::GroupNorm gn(2, 4);
  CHECK(state_names(gn) == std::vector<std::string>{"weight", "bias"});
  CHECK(c::nn_test::doubles(gn.weight) == std::vector<double>(4, 1.0));
  CHECK(state_names(c::nn::GroupNorm(2, 4, 1e-5, false)).empty());
  CHECK(state_names(c::nn::InstanceNorm2d(3)).empty());
  CHECK(state_names(c::nn::InstanceNorm2d(3, 1e-5, 0.1, true, true)) ==
        std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"});
  c::nn::Sequential seq{std::make_shared<c::nn::InstanceNorm2d>(3, 1e-5, 0.1, false, true)};
  CHECK(state_names(seq) == std::vector<std::string>{"0.running_mean", "0.running_var", "0.num_batches_tracked"});
}

TEST_CASE("group_norm and instance_norm: the sim device gives the CPU's values and gradients", "[nn][norm][sim]") {
  check_sim_equals_cpu({2, 6, 3, 4}, [](const c::Tensor& x) { return F::group_norm(x, 3); });
  check_sim_equals_cpu({2, 3, 4, 5}, [](const c::Tensor& x) { return F::instance_norm(x); });
}

TEST_CASE("group_norm, instance_norm and their modules: bad input is an error naming it", "[nn][norm][errors]") {
  c::Tensor x = c::randn({2, 6, 4});
  CHECK_THAT(error_message([&] { F::group_norm(x, 4); }), Contains("6 channels") && Contains("num_groups (4)"));
  CHECK_THAT(error_message([&] { F::group_norm(x, 3, c::ones({5})); }), Contains("weight must have shape [6]"));
  CHECK_THAT(error_message([&] { F::group_norm(c::randn({2, 6, 1}), 6); }), Contains("more than one value"));
  CHECK_THAT(error_message([&] { c::nn::GroupNorm(4, 6); }), Contains("divisible by num_groups (4)"));
  CHECK_THAT(error_message([&] { c::nn::GroupNorm(3, 6)(c::randn({2, 5, 4})); }), Contains("[2, 5, 4]"));
  CHECK_THAT(error_message([&] { F::instance_norm(c::randn({2, 6})); }), Contains("at least 3 dims"));
  CHECK_THAT(error_message([&] { F::instance_norm(x, c::Tensor(), c::Tensor(), c::Tensor(), c::Tensor(), false); }),
             Contains("needs running_mean"));
  CHECK_THAT(error_message([&] { c::nn::InstanceNorm2d(6)(c::randn({2, 6})); }),
             Contains("4-D (batched) or 3-D (unbatched) input, got shape [2, 6]"));
  CHECK_THAT(error_message([&] { c::nn::InstanceNorm2d(5)(c::randn({2, 6, 4, 4})); }), Contains("expected input with 5 channels"));
}

TEST_CASE("InstanceNorm2d without running statistics normalizes with the input's in eval too", "[nn][norm]") {
  c::nn::InstanceNorm2d norm(2);
  norm.eval();
  c::Tensor y = norm(c::add(c::mul(c::randn({3, 2, 4, 4}, {.dtype = c::kFloat64}), 3.0), 5.0));
  c::Tensor m = c::mean(y, {2, 3});
  CHECK(c::amax(c::abs(m)).item<double>() < 1e-12);
  CHECK(c::amax(c::abs(c::sub(c::var(y, {2, 3}, false), 1.0))).item<double>() < 1e-3);
}

TEST_CASE("interpolate: the sim device gives the CPU's values and gradients", "[nn][upsample][sim]") {
  using M = F::InterpolateMode;
  check_sim_equals_cpu({2, 3, 4, 5}, [](const c::Tensor& x) { return F::interpolate(x, {.size = {7, 3}, .mode = M::Bilinear}); });
  check_sim_equals_cpu({2, 3, 4, 5}, [](const c::Tensor& x) { return F::interpolate(x, {.scale_factor = {1.5}}); });
  check_sim_equals_cpu({2, 8, 3, 5}, [](const c::Tensor& x) { return F::pixel_shuffle(x, 2); });
}

TEST_CASE("pixel_unshuffle undoes pixel_shuffle exactly", "[nn][upsample]") {
  c::Tensor x = c::randn({2, 18, 3, 4});
  CHECK(c::equal(F::pixel_unshuffle(F::pixel_shuffle(x, 3), 3), x));
  // Output pixel (h*r + i, w*r + j) of channel c is input channel c*r*r + i*r + j at (h, w).
  c::Tensor y = F::pixel_shuffle(x, 3);
  CHECK(y.sizes() == c::Shape{2, 2, 9, 12});
  CHECK(y.select(0, 1).select(0, 1).select(0, 4).select(0, 7).item<float>() ==
        x.select(0, 1).select(0, 9 + 1 * 3 + 1).select(0, 1).select(0, 2).item<float>());
}

TEST_CASE("interpolate, Upsample and pixel (un)shuffle: bad arguments are errors naming them", "[nn][upsample][errors]") {
  using M = F::InterpolateMode;
  c::Tensor x = c::randn({2, 3, 4, 5});
  CHECK_THAT(error_message([&] { F::interpolate(x, {}); }), Contains("exactly one of size ({}) and scale_factor ({})"));
  CHECK_THAT(error_message([&] { F::interpolate(x, {.size = {4}, .scale_factor = {2.0}}); }), Contains("exactly one"));
  CHECK_THAT(error_message([&] { F::interpolate(x, {.size = {4, 5, 6}}); }), Contains("1 or 2 values") && Contains("{4, 5, 6}"));
  CHECK_THAT(error_message([&] { F::interpolate(x, {.size = {4}, .mode = M::Linear}); }),
             Contains("linear expects a 3-D input") && Contains("[2, 3, 4, 5]"));
  CHECK_THAT(error_message([&] { F::interpolate(x, {.size = {4}, .align_corners = true}); }), Contains("not nearest"));
  CHECK_THAT(error_message([&] { F::interpolate(x, {.scale_factor = {-1.0}}); }), Contains("positive and finite"));
  CHECK_THAT(error_message([&] { F::interpolate(x, {.scale_factor = {0.1}}); }), Contains("must both be positive"));
  CHECK_THAT(error_message([&] { F::interpolate(c::ones({1, 1, 2, 2}, {.dtype = c::kInt64}), {.size = {4}}); }),
             Contains("floating-point"));
  CHECK_THAT(error_message([&] { c::nn::Upsample({.mode = M::Bilinear}); }), Contains("exactly one"));
  CHECK_THAT(error_message([&] { F::pixel_shuffle(x, 2); }), Contains("3 channels") && Contains("upscale_factor^2 = 4"));
  CHECK_THAT(error_message([&] { F::pixel_unshuffle(x, 2); }), Contains("divisible by downscale_factor 2"));
  CHECK_THAT(error_message([&] { F::pixel_shuffle(c::randn({4, 4}), 2); }), Contains("at least 3 dims"));
  CHECK_THAT(error_message([&] { c::nn::PixelShuffle(0); }), Contains("must be positive, got 0"));
}
