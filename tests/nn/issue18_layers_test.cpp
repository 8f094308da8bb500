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
