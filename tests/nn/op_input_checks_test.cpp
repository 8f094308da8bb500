// Input that once reached a kernel unchecked (a read-only audit of the op layer, 2026-12-04): each
// case here wrote outside an allocation, crashed, or gave a silently wrong or order-dependent
// answer, and now gets a chorus::Error naming what was given (or PyTorch's answer). Every case
// fails without its fix: the allocation, as_strided and index-version cases cleanly (the call
// returned where it now throws, having written nothing yet); the 0-d cases by crashing (size(0) read
// an empty shape).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "autograd/gradcheck.h"
#include "nn/nn.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace F = nn::functional;
using Catch::Contains;
// t has `shape` and the values `v` exactly (compared in float64).
bool matches_exactly(const Tensor& t, const Shape& shape, const std::vector<double>& v) {
  return t.sizes() == shape && equal(t.cpu().to(kFloat64).reshape({-1}), tensor(v));
}

TEST_CASE("a tensor whose byte count overflows is refused before allocating", "[tensor][checks]") {
  // float32 [2^62]: 2^64 bytes wrapped to 0, a 64-byte block, then 2^62 elements written (empty()
  // writes nothing, so without the check this returns where it must throw).
  CHECK_THROWS_WITH(empty({int64_t{1} << 62}), Contains("needs more bytes than a process can address"));
  CHECK_THROWS_WITH(empty({int64_t{1} << 61}, {.dtype = kFloat64}), Contains("float64 tensor of shape"));
  CHECK(empty({1 << 20}).numel() == 1 << 20);
}

TEST_CASE("size and stride of a 0-d tensor are refused; roll and repeat_interleave take it as one element",
          "[tensor][checks]") {
  const Tensor s = scalar_tensor(5.0);
  CHECK_THROWS_WITH(s.size(0), Contains("size: dimension 0 was given, but the tensor has no dimensions"));
  CHECK_THROWS_WITH(s.stride(-1), Contains("stride: dimension -1 was given"));
  CHECK(matches_exactly(roll(s, {1}, {0}), {}, {5}));
  CHECK(matches_exactly(repeat_interleave(s, 3, 0), {3}, {5, 5, 5}));
  CHECK(matches_exactly(repeat_interleave(s, 2, -1), {2}, {5, 5}));
}

TEST_CASE("as_strided, expand, narrow and slice refuse sizes and strides that overflow or are negative",
          "[tensor][checks]") {
  const Tensor z = zeros({4});
  // 2 x (2^62 + 2^40) wraps negative, so the view passed the storage check, 2^42 bytes past it.
  CHECK_THROWS_WITH(as_strided(z, {3}, {(int64_t{1} << 62) + (int64_t{1} << 40)}), Contains("overflows int64"));
  CHECK(as_strided(z, {2}, {2}).numel() == 2);
  CHECK_THROWS_WITH(expand(ones({1}), {-3}), Contains("expand: size -3 at dimension 0 is negative"));
  CHECK(expand(ones({1}), {-1}).sizes() == Shape{1});
  CHECK_THROWS_WITH(narrow(z, 0, 1, INT64_MAX), Contains("exceeds dimension size"));
  const Tensor a = arange(0.0, 4.0);
  CHECK(matches_exactly(slice(a, 0, 0, 4, INT64_MAX), {1}, {0}));  // PyTorch: one element
  CHECK(matches_exactly(slice(a, 0, 1, 4, 2), {2}, {1, 3}));
}

TEST_CASE("in-place writes to a tensor with several elements at one address are refused; fill_ is not",
          "[tensor][checks]") {
  Tensor y = zeros({1}).expand({4});
  CHECK_THROWS_WITH(y.add_(ones({4})), Contains("add_: more than one element of the written-to tensor"));
  CHECK_THROWS_WITH(y.copy_(arange(0.0, 4.0).to(kFloat32)), Contains("copy_: more than one element"));
  CHECK_THROWS_WITH(clamp_(y, Scalar(0.5), std::nullopt), Contains("clamp_"));
  {
    NoGradGuard no_grad;  // refused in every mode (the check once ran only when recording)
    CHECK_THROWS_AS(y.mul_(ones({4})), Error);
  }
  y.fill_(3.0f);
  CHECK(matches_exactly(y, {4}, {3, 3, 3, 3}));
}

TEST_CASE("sort, argsort and topk order int64 values past 2^53 exactly", "[tensor][checks]") {
  const int64_t big = int64_t{1} << 53;
  const Tensor t = tensor(std::vector<int64_t>{big + 1, big, big + 3, big + 2});
  const auto [v, i] = sort(t);
  CHECK(equal(v, tensor(std::vector<int64_t>{big, big + 1, big + 2, big + 3})));
  CHECK(equal(i, tensor(std::vector<int64_t>{1, 0, 3, 2})));
  CHECK(equal(argsort(t, 0, true), tensor(std::vector<int64_t>{2, 3, 0, 1})));
  CHECK(equal(topk(t, 1).first, tensor(std::vector<int64_t>{big + 3})));
}

TEST_CASE("index ops name themselves when the index or source is on another device", "[tensor][checks][sim]") {
  const Tensor x = arange(0.0, 6.0).to(Device::sim(0));
  const Tensor idx = tensor(std::vector<int64_t>{0, 2});
  CHECK_THROWS_WITH(index_select(x, 0, idx), Contains("index_select: expected all tensors on the same device"));
  CHECK_THROWS_WITH(gather(x, 0, idx), Contains("gather: expected all tensors on the same device"));
  CHECK_THROWS_WITH(scatter_add(zeros({6}), 0, idx, ones({2}).to(Device::sim(0))), Contains("scatter_add"));
  CHECK(equal(index_select(x, 0, idx.to(Device::sim(0))).cpu(), tensor(std::vector<double>{0, 2})));
}

TEST_CASE("embedding and cross_entropy refuse indices changed in place before backward", "[tensor][checks]") {
  // The indices were captured as they are: a reused batch buffer refilled before backward sent the
  // gradient's rows to other rows (out of range even: the range check ran in the forward).
  Tensor w = randn({10, 4}, {.dtype = kFloat64}).requires_grad_();
  Tensor idx = tensor(std::vector<int64_t>{1, 2, 3});
  Tensor y = F::embedding(idx, w);
  idx.fill_(2);
  CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an inplace operation") && Contains("embedding"));
  Tensor logits = randn({3, 5}, {.dtype = kFloat64}).requires_grad_();
  Tensor target = tensor(std::vector<int64_t>{0, 4, 2});
  Tensor loss = F::cross_entropy(logits, target);
  target.fill_(1);
  CHECK_THROWS_WITH(loss.backward(), Contains("modified by an inplace operation") && Contains("cross_entropy"));
  // Class weights changed in place before backward: refused too (the backward read them).
  Tensor weight = ones({5}, {.dtype = kFloat64});
  Tensor weighted = F::cross_entropy(logits, tensor(std::vector<int64_t>{0, 4, 2}), {.weight = weight});
  weight.fill_(2.0);
  CHECK_THROWS_WITH(weighted.backward(), Contains("modified by an inplace operation"));
  // Unchanged indices: backward as before.
  Tensor idx2 = tensor(std::vector<int64_t>{1, 1});
  F::embedding(idx2, w).sum().backward();
  CHECK(matches_exactly(w.grad().select(0, 1), {4}, {2, 2, 2, 2}));
}

TEST_CASE("max_pool2d refuses a window that covers only padding", "[tensor][checks]") {
  // kernel 1x2, dilation 1x5, padding 0x1: output column 0's taps are at -1 and 4, both outside a
  // width of 4. Its gradient went one past the row: into the next plane, or past the buffer.
  Tensor x = randn({1, 2, 1, 4}).requires_grad_();
  CHECK_THROWS_WITH(F::max_pool2d(x, {1, 2}, std::nullopt, {0, 1}, {1, 5}),
                    Contains("max_pool2d: the window of output column 0 covers only padding"));
  Tensor out = F::max_pool2d(x, {1, 2}, std::nullopt, {0, 1}, {1, 2});  // taps -1 and 1: one in range
  out.sum().backward();
  CHECK(x.grad().sum().item<double>() == static_cast<double>(out.numel()));
}

TEST_CASE("nll_loss refuses a weight that is not one entry per class", "[tensor][checks]") {
  const Tensor logp = log_softmax(randn({3, 4}), 1), target = tensor(std::vector<int64_t>{0, 3, 1});
  CHECK_THROWS_WITH(F::nll_loss(logp, target, {.weight = ones({4, 1})}),
                    Contains("nll_loss: weight of shape [4, 1] must have one entry per class (4)"));
  CHECK(std::isfinite(F::nll_loss(logp, target, {.weight = ones({4})}).item<double>()));
}

TEST_CASE("gradcheck refuses device inputs and takes a function whose output is on a device", "[tensor][checks][sim]") {
  const Tensor on_sim = randn({3}, {.dtype = kFloat64}).to(Device::sim(0)).requires_grad_();
  CHECK_THROWS_WITH(autograd::gradcheck([](const TensorList& in) { return mul(in[0], 2.0); }, {on_sim}),
                    Contains("gradcheck: input 0 is on sim:0; expected CPU inputs"));
  CHECK(autograd::gradcheck([](const TensorList& in) { return mul(in[0].to(Device::sim(0)), in[0].to(Device::sim(0))); },
                            {randn({3}, {.dtype = kFloat64}).requires_grad_()}));
}

}  // namespace
}  // namespace chorus
