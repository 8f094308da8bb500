// einsum beyond the libtorch parity cases: values checked by hand (trace, outer product), gradients
// against gradcheck, the sim device giving the CPU's numbers, and the chorus::Error each malformed
// equation gets.
#include <catch2/catch.hpp>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"

namespace c = chorus;
using Catch::Matchers::Contains;

namespace {

template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const c::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("einsum: trace, diagonal and outer product by hand", "[tensor][einsum]") {
  c::Tensor m = c::tensor<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, c::Shape{3, 3});
  CHECK(c::einsum("ii->", {m}).item<double>() == 15.0);
  CHECK(c::equal(c::einsum("ii->i", {m}), c::tensor<double>({1, 5, 9})));
  CHECK(c::equal(c::einsum("ij->ji", {m}), m.t().contiguous()));
  c::Tensor a = c::tensor<double>({1, 2}), b = c::tensor<double>({3, 4, 5});
  CHECK(c::equal(c::einsum("i,j->ij", {a, b}), c::tensor<double>({3, 4, 5, 6, 8, 10}, c::Shape{2, 3})));
  CHECK(c::einsum("i,j", {a, b}).sizes() == c::Shape{2, 3});
}

TEST_CASE("einsum: gradients pass gradcheck on a three-operand chain and a diagonal", "[tensor][einsum]") {
  c::manual_seed(4);
  c::Tensor x = c::randn({2, 3}, {.dtype = c::kFloat64}).requires_grad_();
  c::Tensor y = c::randn({3, 3, 4}, {.dtype = c::kFloat64}).requires_grad_();
  c::Tensor z = c::randn({4, 2}, {.dtype = c::kFloat64}).requires_grad_();
  CHECK(c::autograd::gradcheck([](const c::TensorList& in) { return c::einsum("ij,jjk,kl->il", in); }, {x, y, z}));
}

TEST_CASE("einsum: the sim device gives the CPU's values and gradients", "[tensor][einsum][sim]") {
  c::manual_seed(8);
  c::Tensor q = c::randn({2, 3, 4, 5}, {.dtype = c::kFloat64}).requires_grad_();
  c::Tensor k = c::randn({2, 3, 6, 5}, {.dtype = c::kFloat64}).requires_grad_();
  c::Tensor qs = q.detach().to(c::Device("sim:0")).requires_grad_();
  c::Tensor ks = k.detach().to(c::Device("sim:0")).requires_grad_();
  c::Tensor out = c::einsum("bhqd,bhkd->bhqk", {q, k}), outs = c::einsum("bhqd,bhkd->bhqk", {qs, ks});
  REQUIRE(outs.device() == c::Device("sim:0"));
  CHECK(c::allclose(outs.to(c::kCPU), out, 1e-12, 1e-12));
  c::sum(c::mul(out, out)).backward();
  c::sum(c::mul(outs, outs)).backward();
  CHECK(c::allclose(qs.grad().to(c::kCPU), q.grad(), 1e-12, 1e-12));
  CHECK(c::allclose(ks.grad().to(c::kCPU), k.grad(), 1e-12, 1e-12));
}

TEST_CASE("einsum: malformed equations and mismatched operands are errors naming them", "[tensor][einsum][errors]") {
  c::Tensor a = c::randn({3, 4}), b = c::randn({4, 5});
  CHECK_THAT(error_message([&] { c::einsum("ij,jk->ik", {a}); }), Contains("2 operand(s), but 1 were given"));
  CHECK_THAT(error_message([&] { c::einsum("ijk,jk->ik", {a, b}); }), Contains("operand 0 has 2 dims") && Contains("name 3"));
  CHECK_THAT(error_message([&] { c::einsum("ij,jk->iz", {a, b}); }), Contains("'z'") && Contains("does not appear"));
  CHECK_THAT(error_message([&] { c::einsum("ij,jk->ii", {a, b}); }), Contains("'i' appears more than once"));
  CHECK_THAT(error_message([&] { c::einsum("ij,kj->ik", {a, b}); }),
             Contains("subscript 'j' has size 5 in operand 1") && Contains("size 4 elsewhere"));
  CHECK_THAT(error_message([&] { c::einsum("i1,jk", {a, b}); }), Contains("invalid character '1' at position 1"));
  CHECK_THAT(error_message([&] { c::einsum("i.j,jk", {a, b}); }), Contains("not part of an ellipsis"));
  CHECK_THAT(error_message([&] { c::einsum("...i...,jk", {a, b}); }), Contains("more than one ellipsis"));
  CHECK_THAT(error_message([&] { c::einsum("ij->j->i", {a}); }), Contains("more than one \"->\""));
  CHECK_THAT(error_message([&] { c::einsum("ii", {a}); }), Contains("repeated in operand 0") && Contains("3 and 4"));
  CHECK_THAT(error_message([&] { c::einsum("ij,jk", {a, b.to(c::kFloat64)}); }), Contains("float32 (operand 0) and float64"));
  CHECK_THAT(error_message([&] { c::einsum("ij", {}); }), Contains("at least one operand"));
  CHECK_THAT(error_message([&] { c::einsum("ij,jk", {a, b.to(c::Device("sim:0"))}); }), Contains("sim"));
}
