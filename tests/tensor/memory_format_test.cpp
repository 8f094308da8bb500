// The channels-last memory format at the tensor level: strides, is_contiguous(format),
// contiguous(format) / to(format) / clone, the factories, and the op layer's layout rule (the first
// input of the output's whole shape decides, as PyTorch's TensorIterator) for pointwise ops, casts
// and device copies. Values are always read through each tensor's own strides (tensor_testing.h),
// so a layout bug shows as wrong values, not only as wrong strides.
#include <catch2/catch.hpp>

#include "tensor/ops.h"
#include "tests/tensor/tensor_testing.h"

namespace chorus {
namespace {

using testing::values;

const Strides kNhwc2345{60, 1, 15, 3};  // [2, 3, 4, 5] channels-last: H*W*C, 1, W*C, C

Tensor random_nchw(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return testing::random_tensor(shape, kFloat32, gen);
}

TEST_CASE("channels-last strides, is_contiguous(format) and suggest_memory_format", "[memory_format]") {
  CHECK(channels_last_strides({2, 3, 4, 5}) == kNhwc2345);
  CHECK(strides_for({2, 3, 4, 5}, MemoryFormat::Contiguous) == Strides{60, 20, 5, 1});
  Tensor x = random_nchw({2, 3, 4, 5}, 1);
  CHECK(x.is_contiguous(MemoryFormat::Contiguous));
  CHECK_FALSE(x.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(x.suggest_memory_format() == MemoryFormat::Contiguous);

  Tensor y = x.contiguous(MemoryFormat::ChannelsLast);
  CHECK(y.strides() == kNhwc2345);
  CHECK(y.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK_FALSE(y.is_contiguous());
  CHECK(y.suggest_memory_format() == MemoryFormat::ChannelsLast);
  CHECK(values(y) == values(x));                         // the same elements, other memory order
  CHECK(y.contiguous(MemoryFormat::ChannelsLast).is_same(y));  // already dense in that layout: no copy
  CHECK(x.to(MemoryFormat::ChannelsLast).strides() == kNhwc2345);
  // Memory order is N, H, W, C: element (n, c, h, w) sits at n*60 + h*15 + w*3 + c.
  const float* p = y.data_ptr<float>();
  CHECK(p[1 * 60 + 2 * 15 + 3 * 3 + 1] == x[1][1][2][3].item<float>());

  Tensor back = y.contiguous();
  CHECK(back.is_contiguous());
  CHECK(values(back) == values(x));
  // A permuted NHWC tensor is the same thing: PyTorch's way of making one by hand.
  Tensor permuted = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
  CHECK(permuted.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(values(permuted) == values(x));

  // [N, C, 1, 1] and [N, 1, H, W] are dense in both layouts (the same memory): Contiguous wins.
  Tensor both = random_nchw({4, 3, 1, 1}, 2);
  CHECK(both.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(both.suggest_memory_format() == MemoryFormat::Contiguous);
  CHECK(random_nchw({4, 1, 3, 3}, 3).is_contiguous(MemoryFormat::ChannelsLast));
  // Other ranks are never channels-last.
  CHECK_FALSE(random_nchw({3, 4, 5}, 4).is_contiguous(MemoryFormat::ChannelsLast));
}

TEST_CASE("channels-last misuse is a clear error", "[memory_format]") {
  Tensor x3 = random_nchw({3, 4, 5}, 5);
  CHECK_THROWS_WITH(x3.contiguous(MemoryFormat::ChannelsLast),
                    Catch::Contains("4-D") && Catch::Contains("[3, 4, 5]"));
  CHECK_THROWS_WITH(x3.contiguous(MemoryFormat::Preserve), Catch::Contains("Preserve"));
  CHECK_THROWS_WITH(x3.is_contiguous(MemoryFormat::Preserve), Catch::Contains("Preserve"));
  CHECK_THROWS_WITH(zeros({2, 3}, {.memory_format = MemoryFormat::ChannelsLast}), Catch::Contains("4-D"));
}

TEST_CASE("factories, clone and _like keep or make the layout asked for", "[memory_format]") {
  Tensor z = zeros({2, 3, 4, 5}, {.memory_format = MemoryFormat::ChannelsLast});
  CHECK(z.strides() == kNhwc2345);
  CHECK(values(z) == std::vector<double>(120, 0.0));
  CHECK(ones({2, 3, 4, 5}, {.memory_format = MemoryFormat::ChannelsLast}).strides() == kNhwc2345);
  CHECK(empty({2, 3, 4, 5}, {.memory_format = MemoryFormat::ChannelsLast}).strides() == kNhwc2345);

  Tensor x = random_nchw({2, 3, 4, 5}, 6);
  Tensor y = x.contiguous(MemoryFormat::ChannelsLast);
  for (const Tensor& t : {empty_like(y), zeros_like(y), ones_like(y), full_like(y, 2.5), rand_like(y), randn_like(y)}) {
    CHECK(t.strides() == kNhwc2345);
  }
  CHECK(zeros_like(x).is_contiguous());
  // rand_like draws the same numbers in either layout: element (n, c, h, w) gets the same value.
  manual_seed(3);
  Tensor r1 = rand_like(x);
  manual_seed(3);
  Tensor r2 = rand_like(y);
  CHECK(values(r1) == values(r2));

  Tensor c = y.clone();
  CHECK(c.strides() == kNhwc2345);
  CHECK(values(c) == values(x));
  CHECK(y.clone(MemoryFormat::Contiguous).is_contiguous());
  CHECK(x.clone(MemoryFormat::ChannelsLast).strides() == kNhwc2345);
  // A cast keeps the layout (PyTorch's to(dtype) preserves it).
  Tensor d = y.to(kFloat64);
  CHECK(d.strides() == kNhwc2345);
  CHECK(values(d) == values(x));
}

TEST_CASE("pointwise results take the layout of their first full-shape input", "[memory_format]") {
  Tensor x = random_nchw({2, 3, 4, 5}, 7), u = random_nchw({2, 3, 4, 5}, 8), b = random_nchw({1, 3, 1, 1}, 9);
  Tensor y = x.contiguous(MemoryFormat::ChannelsLast);
  struct Op {
    const char* name;
    Tensor ours;
    Tensor reference;
    MemoryFormat format;
  };
  const std::vector<Op> ops = {
      {"relu", y.relu(), x.relu(), MemoryFormat::ChannelsLast},
      {"exp", y.exp(), x.exp(), MemoryFormat::ChannelsLast},
      {"cl + nchw", y + u, x + u, MemoryFormat::ChannelsLast},
      {"nchw + cl", u + y, u + x, MemoryFormat::Contiguous},
      {"cl + bias", y + b, x + b, MemoryFormat::ChannelsLast},
      {"bias * cl", b * y, b * x, MemoryFormat::ChannelsLast},  // the broadcast input does not decide
      {"cl * scalar", y * 3.0, x * 3.0, MemoryFormat::ChannelsLast},
      {"clamp", y.clamp(-0.5, 0.5), x.clamp(-0.5, 0.5), MemoryFormat::ChannelsLast},
      {"gt", y.gt(u), x.gt(u), MemoryFormat::ChannelsLast},
      {"where", where(y.gt(0.0), y, u), where(x.gt(0.0), x, u), MemoryFormat::ChannelsLast},
      {"pow", y.pow(2.0), x.pow(2.0), MemoryFormat::ChannelsLast},
  };
  for (const Op& op : ops) {
    INFO(op.name);
    CHECK(op.ours.suggest_memory_format() == op.format);
    CHECK(values(op.ours) == values(op.reference));
  }
  // In place on a channels-last tensor writes through its own strides.
  Tensor w = y.clone();
  w.add_(u).mul_(b);
  CHECK(w.strides() == kNhwc2345);
  CHECK(values(w) == values((x + u) * b));
  // copy_ between layouts both ways.
  Tensor into_cl = zeros({2, 3, 4, 5}, {.memory_format = MemoryFormat::ChannelsLast});
  into_cl.copy_(x);
  CHECK(values(into_cl) == values(x));
  Tensor into_nchw = zeros({2, 3, 4, 5});
  into_nchw.copy_(y);
  CHECK(values(into_nchw) == values(x));
}

TEST_CASE("gradients flow through channels-last copies and ops", "[memory_format]") {
  Tensor x = random_nchw({2, 3, 4, 5}, 10).requires_grad_();
  Tensor g = random_nchw({2, 3, 4, 5}, 11);
  Tensor y = x.contiguous(MemoryFormat::ChannelsLast);
  CHECK(y.requires_grad());
  sum((y.tanh() * 2.0 + y) * g).backward();
  Tensor x2 = x.detach().requires_grad_();
  sum((x2.tanh() * 2.0 + x2) * g).backward();
  REQUIRE(x.grad().defined());
  const std::vector<double> a = values(x.grad()), e = values(x2.grad());
  REQUIRE(a.size() == e.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(e[i]).epsilon(1e-6));
}

TEST_CASE("a channels-last tensor moves to the sim device and back in its layout", "[memory_format][sim]") {
  Tensor x = random_nchw({2, 3, 4, 5}, 12);
  Tensor y = x.contiguous(MemoryFormat::ChannelsLast);
  Tensor on_sim = y.to(Device::sim(0));
  CHECK(on_sim.strides() == kNhwc2345);
  Tensor r = (on_sim.relu() + on_sim.to(kFloat64).to(kFloat32)).to(kCPU);
  CHECK(r.strides() == kNhwc2345);
  CHECK(values(r) == values(x.relu() + x));
  // NCHW made channels-last on the device.
  Tensor z = x.to(Device::sim(0)).contiguous(MemoryFormat::ChannelsLast).cpu();
  CHECK(z.strides() == kNhwc2345);
  CHECK(values(z) == values(x));
}

}  // namespace
}  // namespace chorus
