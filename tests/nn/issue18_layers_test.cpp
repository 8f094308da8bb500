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
  CHECK_THAT(error_message([&] { F::pad(x, {-5, 6}); }), Contains("crops 5 elements from a dim of size 4"));
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
  check_sim_equals_cpu({2, 3, 4, 5}, [](const c::Tensor& x) { return F::interpolate(x, {.size = {6, 3}, .mode = M::Bicubic}); });
  check_sim_equals_cpu({2, 3, 7, 5}, [](const c::Tensor& x) { return F::interpolate(x, {.size = {3, 4}, .mode = M::Area}); });
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
  CHECK_THAT(error_message([&] { F::interpolate(x, {.size = {4}, .mode = M::Area, .align_corners = false}); }),
             Contains("not area"));
  CHECK_THAT(error_message([&] { F::interpolate(c::randn({2, 3, 4}), {.size = {4}, .mode = M::Bicubic}); }),
             Contains("bicubic expects a 4-D input") && Contains("[2, 3, 4]"));
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

TEST_CASE("Conv1d: parameters, state_dict names, default init bounds and errors", "[nn][conv]") {
  c::nn::Conv1d conv(c::nn::Conv1dOptions(4, 6, 5).groups(2));
  CHECK(state_names(conv) == std::vector<std::string>{"weight", "bias"});
  CHECK(conv.weight.sizes() == c::Shape{6, 2, 5});
  // kaiming_uniform(a = sqrt(5)) bounds the weights by 1/sqrt(fan_in) = 1/sqrt(2 * 5), as the bias.
  const double bound = 1.0 / std::sqrt(10.0);
  CHECK(c::amax(c::abs(conv.weight)).item<float>() <= bound);
  CHECK(c::amax(c::abs(conv.weight)).item<float>() > 0.5 * bound);
  CHECK(c::nn::Conv1d(c::nn::Conv1dOptions(2, 2, 3).bias(false)).state_dict().size() == 1);
  c::Tensor w = c::randn({4, 3, 3});
  CHECK_THAT(error_message([&] { F::conv1d(c::randn({2, 3, 4, 5}), w); }), Contains("2-D [C_in, L] or 3-D") && Contains("[2, 3, 4, 5]"));
  CHECK_THAT(error_message([&] { F::conv1d(c::randn({2, 5, 8}), w); }), Contains("5 channels") && Contains("expects 3"));
  CHECK_THAT(error_message([&] { F::conv1d(c::randn({2, 3, 8}), c::randn({4, 3})); }), Contains("3-D weight"));
  CHECK_THAT(error_message([&] { F::conv1d(c::randn({2, 3, 2}), w); }), Contains("shorter than the kernel's span 3"));
  CHECK_THAT(error_message([&] { F::conv1d(c::randn({2, 3, 8}), w, c::Tensor(), 0); }), Contains("stride >= 1"));
  CHECK_THAT(error_message([&] { c::nn::Conv1d(c::nn::Conv1dOptions(3, 4, 3).groups(2)); }), Contains("divisible by groups (2)"));
}

TEST_CASE("conv1d: the sim device gives the CPU's values and gradients", "[nn][conv][sim]") {
  c::manual_seed(9);
  c::Tensor w = c::randn({4, 3, 3}, {.dtype = c::kFloat64});
  check_sim_equals_cpu({2, 3, 10}, [&](const c::Tensor& x) { return F::conv1d(x, w.to(x.device()), c::Tensor(), 2, 1); });
}

TEST_CASE("dropout2d zeroes whole channels with probability p and scales the rest", "[nn][dropout]") {
  c::manual_seed(21);
  const double p = 0.3;
  c::Tensor x = c::add(c::rand({200, 50, 3, 4}, {.dtype = c::kFloat64}), 0.5).requires_grad_();
  c::Tensor y = F::dropout2d(x, p);
  // Per channel: y / x is 0 everywhere or 1/(1-p) everywhere.
  c::Tensor ratio = c::div(y.detach(), x.detach());
  c::Tensor lo = c::amin(ratio, {2, 3}), hi = c::amax(ratio, {2, 3});
  CHECK(c::amax(c::abs(c::sub(hi, lo))).item<double>() < 1e-12);
  c::Tensor dropped = c::eq(hi, 0.0);
  CHECK(c::all(c::logical_or(dropped, c::lt(c::abs(c::sub(hi, 1.0 / (1.0 - p))), 1e-12))).item<bool>());
  const double fraction = c::mean(dropped.to(c::kFloat64)).item<double>();
  CHECK(std::abs(fraction - p) < 0.02);  // 10,000 channels: the standard deviation is 0.0046
  // The gradient is the same mask.
  c::sum(y).backward();
  CHECK(c::allclose(x.grad(), c::div(y.detach(), x.detach()), 1e-12, 1e-12));
  // Unbatched [C, H, W]: channels are dim 0.
  c::Tensor u = F::dropout2d(c::ones({400, 2, 2}), 0.5);
  CHECK(c::equal(c::amin(u, {1, 2}), c::amax(u, {1, 2})));
  // dropout1d: [N, C, L] channels.
  c::Tensor v = F::dropout1d(c::ones({40, 30, 5}), 0.5);
  CHECK(c::equal(c::amin(v, {2}), c::amax(v, {2})));
  CHECK(c::any(c::eq(v, 0.0)).item<bool>());
}

TEST_CASE("Dropout2d: identity in eval, p = 0 and p = 1, same numbers on sim, errors", "[nn][dropout]") {
  c::nn::Dropout2d drop(0.4);
  c::Tensor x = c::randn({4, 6, 3, 3});
  drop.eval();
  CHECK(c::equal(drop(x), x));
  drop.train();
  CHECK_FALSE(c::equal(drop(x), x));
  CHECK(c::equal(F::dropout2d(x, 0.0), x));
  CHECK(c::equal(F::dropout2d(x, 1.0), c::zeros_like(x)));
  c::manual_seed(5);
  c::Tensor on_cpu = F::dropout2d(x, 0.5);
  c::manual_seed(5);
  c::Tensor on_sim = F::dropout2d(x.to(c::Device("sim:0")), 0.5);
  CHECK(c::equal(on_sim.to(c::kCPU), on_cpu));
  CHECK_THAT(error_message([&] { F::dropout2d(c::randn({4, 6}), 0.5); }), Contains("4-D (batched) or 3-D") && Contains("[4, 6]"));
  CHECK_THAT(error_message([&] { c::nn::Dropout2d(1.5); }), Contains("between 0 and 1, but got 1.5"));
  CHECK_THAT(error_message([&] { F::dropout1d(c::randn({4, 6, 2, 2})); }), Contains("3-D (batched) or 2-D"));
}

TEST_CASE("ModuleDict keeps insertion order, replaces in place, and names state as <key>.<param>", "[nn][container]") {
  auto enc = std::make_shared<c::nn::Linear>(3, 4);
  c::nn::ModuleDict dict{{"encoder", enc}, {"act", std::make_shared<c::nn::ReLU>()}};
  dict.insert("head", std::make_shared<c::nn::Linear>(4, 2));
  CHECK(dict.keys() == std::vector<std::string>{"encoder", "act", "head"});
  CHECK(state_names(dict) == std::vector<std::string>{"encoder.weight", "encoder.bias", "head.weight", "head.bias"});
  CHECK(dict.parameters().size() == 4);
  CHECK(dict.at<c::nn::Linear>("encoder") == enc);
  CHECK(dict.contains("act"));
  CHECK_FALSE(dict.contains("missing"));
  // Replacing "encoder" keeps its position and swaps its parameters.
  auto enc2 = std::make_shared<c::nn::Linear>(3, 4, false);
  dict.insert("encoder", enc2);
  CHECK(dict.keys() == std::vector<std::string>{"encoder", "act", "head"});
  CHECK(state_names(dict) == std::vector<std::string>{"encoder.weight", "head.weight", "head.bias"});
  CHECK(dict["encoder"] == enc2);
  // pop removes the module and its parameters; update appends new keys.
  CHECK(dict.pop("act")->type_name() == "ReLU");
  dict.update({{"norm", std::make_shared<c::nn::GroupNorm>(2, 4)}, {"head", std::make_shared<c::nn::Linear>(4, 3)}});
  CHECK(dict.keys() == std::vector<std::string>{"encoder", "head", "norm"});
  CHECK(dict.at<c::nn::Linear>("head")->weight.sizes() == c::Shape{3, 4});
  CHECK(dict.children().size() == 3);
  // Inside a model, the dict's registered name prefixes its keys, and state loads by those names.
  c::nn::Sequential model{std::make_shared<c::nn::ModuleDict>(std::initializer_list<c::nn::ModuleDict::Item>{
      {"proj", std::make_shared<c::nn::Linear>(2, 2)}})};
  CHECK(state_names(model) == std::vector<std::string>{"0.proj.weight", "0.proj.bias"});
  c::nn::Sequential copy{std::make_shared<c::nn::ModuleDict>(std::initializer_list<c::nn::ModuleDict::Item>{
      {"proj", std::make_shared<c::nn::Linear>(2, 2)}})};
  copy.load_state_dict(model.state_dict());
  CHECK(c::equal(copy.state_dict()[0].second, model.state_dict()[0].second));
  dict.clear();
  CHECK(dict.empty());
  CHECK(dict.parameters().empty());
}

TEST_CASE("ModuleDict: bad keys and missing keys are errors naming them", "[nn][container][errors]") {
  c::nn::ModuleDict dict{{"a", std::make_shared<c::nn::ReLU>()}};
  CHECK_THAT(error_message([&] { dict["b"]; }), Contains("no key 'b'") && Contains("keys: a"));
  CHECK_THAT(error_message([&] { dict.pop("b"); }), Contains("no key 'b'"));
  CHECK_THAT(error_message([&] { dict.insert("x.y", std::make_shared<c::nn::ReLU>()); }), Contains("'x.y'") && Contains("no '.'"));
  CHECK_THAT(error_message([&] { dict.insert("", std::make_shared<c::nn::ReLU>()); }), Contains("non-empty"));
  CHECK_THAT(error_message([&] { dict.insert("n", nullptr); }), Contains("'n' is null"));
  CHECK_THAT(error_message([&] { dict.at<c::nn::Linear>("a"); }), Contains("'a' is a ReLU"));
  CHECK_THAT(error_message([&] { dict.forward(c::randn({2})); }), !Contains("no error"));
}
