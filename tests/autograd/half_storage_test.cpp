// float16/bfloat16 ops run on the tensors as stored ([Half storage], autograd/ops/pointwise.cpp): a
// 16-bit result equal bit for bit to widening to float32 and rounding once, PyTorch's type promotion
// unchanged, no float32 temporaries (seen in the sim device's allocator statistics), 16-bit tensors
// saved for backward, gradients of a bfloat16 chain close to the float32 chain's, and batch_norm on a
// 16-bit input with float32 parameters and running statistics (also under autocast); softmax,
// log_softmax, layer_norm and cross_entropy on 16-bit tensors likewise (no float32 copies).
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "nn/functional.h"
#include "tensor/caching_allocator.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus {
namespace {

namespace F = nn::functional;

const std::vector<Device> kDevices = {Device::cpu(), Device::sim(0)};
const std::vector<DType> kHalves = {kFloat16, kBFloat16};

Tensor uniform(const Shape& shape, double lo, double hi, DType dtype, Device device, Generator& gen) {
  NoGradGuard no_grad;
  return add(mul(rand(shape, {.dtype = kFloat64}, &gen), hi - lo), lo).to(dtype).to(device);
}

std::vector<uint16_t> bits_of(const Tensor& t) {
  Tensor c = t.detach().to(Device::cpu()).contiguous();
  REQUIRE(c.element_size() == 2);
  std::vector<uint16_t> out(static_cast<size_t>(c.numel()));
  std::memcpy(out.data(), c.raw_data_ptr(), out.size() * 2);
  return out;
}

// The most `fn` had allocated on `device` at once beyond what was allocated before it (its work
// finished): the caching allocator's peak, which counts every temporary.
size_t peak_during(Device device, const std::function<void()>& fn) {
  synchronize(device);
  reset_peak_memory_stats(device);
  const size_t before = memory_allocated(device);
  fn();
  synchronize(device);
  return max_memory_allocated(device) - before;
}

// ||a - b|| / ||b||, in float64.
double relative_error(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  Tensor x = a.detach().to(Device::cpu(), kFloat64), y = b.detach().to(Device::cpu(), kFloat64);
  const double diff = sqrt(sum(mul(sub(x, y), sub(x, y)))).item<double>();
  const double ref = sqrt(sum(mul(y, y))).item<double>();
  return diff / ref;
}

TEST_CASE("16-bit ops on 16-bit tensors give 16-bit results equal to widen-compute-round", "[autograd][half]") {
  using Op = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<const char*, Op>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"add alpha 0.3", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.3); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"mul scalar 0.1", [](const Tensor& a, const Tensor&) { return mul(a, 0.1); }},
      {"add scalar 0.1", [](const Tensor& a, const Tensor&) { return add(a, 0.1); }},
      {"div scalar 3", [](const Tensor& a, const Tensor&) { return div(a, 3.0); }},
      {"relu", [](const Tensor& a, const Tensor&) { return relu(a); }},
      {"gelu", [](const Tensor& a, const Tensor&) { return gelu(a, "none"); }},
      {"gelu tanh", [](const Tensor& a, const Tensor&) { return gelu(a, "tanh"); }},
      {"sigmoid", [](const Tensor& a, const Tensor&) { return sigmoid(a); }},
      {"tanh", [](const Tensor& a, const Tensor&) { return tanh(a); }},
      {"exp", [](const Tensor& a, const Tensor&) { return exp(a); }},
      {"pow 1.7", [](const Tensor& a, const Tensor&) { return pow(abs(a), 1.7); }},
      {"clamp", [](const Tensor& a, const Tensor&) { return clamp(a, Scalar(-0.3), Scalar(0.7)); }},
      {"where", [](const Tensor& a, const Tensor& b) { return where(gt(a, b), a, b); }},
  };
  Generator gen(606);
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      Tensor a = uniform({9, 17}, -2, 2, dtype, device, gen), b = uniform({17}, 0.3, 2, dtype, device, gen);
      Tensor a32 = a.to(kFloat32), b32 = b.to(kFloat32);
      for (const auto& [name, op] : ops) {
        INFO(name << " on " << dtype_name(dtype) << " at " << device.str());
        Tensor direct = op(a, b);
        REQUIRE(direct.dtype() == dtype);
        CHECK(bits_of(direct) == bits_of(op(a32, b32).to(dtype)));
      }
      // In place: a 16-bit self stays 16-bit and gets the widened bits.
      Tensor self = a.clone();
      add_(self, b, 0.3);
      CHECK(bits_of(self) == bits_of(add(a32, b32, 0.3).to(dtype)));
      mul_(self, b);
      CHECK(bits_of(self) == bits_of(mul(add(a32, b32, 0.3).to(dtype).to(kFloat32), b32).to(dtype)));
      // Comparisons compare the 16-bit values.
      CHECK(equal(lt(a, b), lt(a32, b32)));
    }
  }
}

TEST_CASE("type promotion with 16-bit tensors is unchanged", "[autograd][half]") {
  Generator gen(707);
  Tensor bf = uniform({4, 5}, -1, 1, kBFloat16, Device::cpu(), gen);
  Tensor hf = uniform({4, 5}, -1, 1, kFloat16, Device::cpu(), gen);
  Tensor f32 = uniform({4, 5}, -1, 1, kFloat32, Device::cpu(), gen);
  Tensor zero_d = full({}, 0.3, {.dtype = kFloat32});
  Tensor ints = arange(20).reshape({4, 5});
  CHECK(add(bf, f32).dtype() == kFloat32);  // a float32 tensor promotes
  CHECK(add(bf, hf).dtype() == kFloat32);   // float16 with bfloat16 is float32
  CHECK(add(bf, zero_d).dtype() == kBFloat16);  // a 0-d float32 tensor does not
  CHECK(add(ints, bf).dtype() == kBFloat16);
  CHECK(div(bf, 3).dtype() == kBFloat16);
  CHECK(mul(hf, 2.5).dtype() == kFloat16);
  // bf16 + 0-d float32 reads the float32 value as it is (the kernel's float32 operand).
  CHECK(bits_of(add(bf, zero_d)) == bits_of(add(bf.to(kFloat32), zero_d).to(kBFloat16)));
  // Mixed inputs still widen: int64 + bfloat16 computes the int64 values in float32.
  CHECK(bits_of(add(ints, bf)) == bits_of(add(ints.to(kFloat32), bf.to(kFloat32)).to(kBFloat16)));
}

// The memory win: on sim the caching allocator counts every block, so the peak during an op shows
// any float32 temporary. Widening relu(x) on n bfloat16 values took 4n bytes for x in float32 plus
// 4n for the float32 result before the 2n-byte output; on storage it takes the 2n-byte output alone.
TEST_CASE("16-bit elementwise ops on sim allocate no float32 temporaries", "[autograd][half][sim]") {
  const Device sim = Device::sim(0);
  const int64_t n = int64_t(1) << 16;
  Generator gen(808);
  for (DType dtype : kHalves) {
    Tensor x = uniform({n}, -2, 2, dtype, sim, gen), y = uniform({n}, -2, 2, dtype, sim, gen);
    using Op = std::function<Tensor()>;
    const std::vector<std::pair<const char*, Op>> ops = {
        {"relu", [&] { return relu(x); }},
        {"gelu", [&] { return gelu(x, "none"); }},
        {"add alpha", [&] { return add(x, y, 0.3); }},
        {"mul scalar", [&] { return mul(x, 0.1); }},
        {"gt", [&] { return gt(x, y); }},
        {"clamp", [&] { return clamp(x, Scalar(-0.5), Scalar(0.5)); }},
    };
    for (const auto& [name, op] : ops) {
      INFO(name << " on " << dtype_name(dtype));
      Tensor out;
      const size_t peak = peak_during(sim, [&out, &op = op] { out = op(); });
      CHECK(out.element_size() <= 2);
      CHECK(peak <= static_cast<size_t>(n) * 2 + 4096);  // the output only (plus a 0-d scalar)
    }
  }
}

// Saved tensors stay 16-bit: the graph of batch_norm -> relu -> gelu on a bfloat16 input holds its
// 16-bit tensors, where widening saved a float32 copy of the input for batch_norm's backward.
TEST_CASE("a 16-bit forward on sim keeps 16-bit tensors for backward", "[autograd][half][sim]") {
  const Device sim = Device::sim(0);
  const int64_t n = 8, c = 4, s = 1024;  // 32768 values
  Generator gen(909);
  for (DType dtype : kHalves) {
    INFO(dtype_name(dtype));
    Tensor x = uniform({n, c, s}, -2, 2, dtype, sim, gen);
    x.requires_grad_();
    Tensor w = uniform({c}, 0.5, 1.5, kFloat32, sim, gen), b = uniform({c}, -0.5, 0.5, kFloat32, sim, gen);
    w.requires_grad_();
    b.requires_grad_();
    synchronize(sim);
    const size_t before = memory_allocated(sim);
    Tensor out = gelu(relu(F::batch_norm(x, Tensor(), Tensor(), w, b, true, 0.1, 1e-5)), "none");
    synchronize(sim);
    REQUIRE(out.dtype() == dtype);
    // Live now: batch_norm's output (saved by relu), relu's output (saved by gelu), gelu's output:
    // three 2-byte tensors; the float32 input copy of widening alone would be 4 bytes per value.
    const size_t held = memory_allocated(sim) - before;
    CHECK(held <= static_cast<size_t>(n * c * s) * 2 * 3 + 16384);
    CHECK(held < static_cast<size_t>(n * c * s) * 2 * 3 + static_cast<size_t>(n * c * s) * 4);
    sum(out.to(kFloat32)).backward();
    REQUIRE(x.grad().defined());
    CHECK(x.grad().dtype() == dtype);
    CHECK(w.grad().dtype() == kFloat32);
  }
}

// The same chain in bfloat16 and in float32 from the same (bfloat16-rounded) values: relu, add,
// mul, gelu, sigmoid and batch_norm (float32 weight and bias) agree within bfloat16's precision.
TEST_CASE("gradients of a bfloat16 chain agree with the float32 chain", "[autograd][half]") {
  Generator gen(1010);
  for (Device device : kDevices) {
    INFO(device.str());
    const Shape shape{4, 3, 6, 5};
    Tensor x16 = uniform(shape, -2, 2, kBFloat16, device, gen), v16 = uniform(shape, 0.5, 1.5, kBFloat16, device, gen);
    Tensor w = uniform({3}, 0.5, 1.5, kFloat32, device, gen), b = uniform({3}, -0.5, 0.5, kFloat32, device, gen);
    Tensor g = uniform(shape, 0.5, 1.5, kFloat32, device, gen);
    auto run = [&](DType dtype) {
      Tensor x = x16.to(dtype).detach().requires_grad_(), v = v16.to(dtype).detach().requires_grad_();
      Tensor wl = w.clone().requires_grad_(), bl = b.clone().requires_grad_();
      Tensor h = F::batch_norm(x, Tensor(), Tensor(), wl, bl, true, 0.1, 1e-5);
      h = add(relu(h), x);
      h = mul(h, v);
      h = sigmoid(gelu(h, "none"));
      REQUIRE(h.dtype() == dtype);
      sum(mul(h.to(kFloat32), g)).backward();
      return std::vector<Tensor>{h, x.grad(), v.grad(), wl.grad(), bl.grad()};
    };
    const std::vector<Tensor> low = run(kBFloat16), ref = run(kFloat32);
    CHECK(low[1].dtype() == kBFloat16);
    CHECK(low[3].dtype() == kFloat32);
    const char* names[] = {"output", "x.grad", "v.grad", "weight.grad", "bias.grad"};
    for (size_t i = 0; i < low.size(); ++i) {
      INFO(names[i]);
      if (i == 3) {
        // sum(dy * xhat) cancels (xhat has zero mean), so its error is measured against the size of
        // its terms: the bias gradient, sum(dy), with dy mostly positive here.
        CHECK(relative_error(low[3], ref[3]) * sqrt(sum(mul(ref[3], ref[3]))).item<double>() <=
              1e-2 * sqrt(sum(mul(ref[4], ref[4]))).item<double>());
      } else {
        CHECK(relative_error(low[i], ref[i]) <= 1e-2);
      }
    }
  }
}

TEST_CASE("batch_norm on a bfloat16 input with float32 parameters matches float32", "[nn][half]") {
  Generator gen(1111);
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      INFO(dtype_name(dtype) << " at " << device.str());
      Tensor x = uniform({6, 4, 7, 3}, -1, 3, dtype, device, gen);
      Tensor w = uniform({4}, 0.5, 1.5, kFloat32, device, gen), b = uniform({4}, -0.5, 0.5, kFloat32, device, gen);
      Tensor rm = zeros({4}, {.device = device}), rv = ones({4}, {.device = device});
      Tensor rm32 = rm.clone(), rv32 = rv.clone();
      Tensor out = F::batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
      Tensor out32 = F::batch_norm(x.to(kFloat32), rm32, rv32, w, b, true, 0.1, 1e-5);
      CHECK(out.dtype() == dtype);
      CHECK(allclose(out.to(kFloat32), out32, 1e-2, 1e-2));
      // The running statistics stay float32 and are updated (they moved away from 0 and 1).
      CHECK(rm.dtype() == kFloat32);
      CHECK(rv.dtype() == kFloat32);
      CHECK(allclose(rm, rm32, 1e-5, 1e-6));
      CHECK(allclose(rv, rv32, 1e-5, 1e-6));
      CHECK(abs(rm).max().item<float>() > 0.05f);
      // Eval with those statistics.
      Tensor eval = F::batch_norm(x, rm, rv, w, b, false, 0.1, 1e-5);
      CHECK(eval.dtype() == dtype);
      CHECK(allclose(eval.to(kFloat32), F::batch_norm(x.to(kFloat32), rm32, rv32, w, b, false, 0.1, 1e-5), 1e-2, 1e-2));
    }
  }
}

TEST_CASE("autocast leaves batch_norm in the input's dtype and group_norm in float32", "[nn][half][autocast]") {
  Generator gen(1212);
  Tensor x = uniform({4, 6, 5, 5}, -1, 1, kFloat32, Device::cpu(), gen);
  Tensor conv_w = uniform({6, 6, 3, 3}, -0.2, 0.2, kFloat32, Device::cpu(), gen);
  Tensor w = ones({6}), b = zeros({6}), rm = zeros({6}), rv = ones({6});
  autocast::AutocastGuard amp(DeviceType::CPU, kBFloat16);
  Tensor h = F::conv2d(x, conv_w, Tensor(), {1, 1}, {1, 1});
  REQUIRE(h.dtype() == kBFloat16);
  Tensor y = F::batch_norm(h, rm, rv, w, b, true, 0.1, 1e-5);
  CHECK(y.dtype() == kBFloat16);  // widened to float32 before
  CHECK(rm.dtype() == kFloat32);
  CHECK(F::group_norm(h, 2, w, b, 1e-5).dtype() == kFloat32);
}

// softmax, log_softmax, layer_norm and cross_entropy on 16-bit tensors: 16-bit outputs and input
// gradients, float32 parameter gradients for float32 parameters, within bfloat16's precision of the
// float32 ops on the same values, and no float32 copy of the input or the output on sim.
TEST_CASE("softmax, layer_norm and cross_entropy run on 16-bit tensors", "[nn][half]") {
  Generator gen(1313);
  const int64_t rows = 24, cols = 200;
  for (Device device : kDevices) {
    for (DType dtype : kHalves) {
      INFO(dtype_name(dtype) << " at " << device.str());
      Tensor x16 = uniform({rows, cols}, -3, 3, dtype, device, gen);
      Tensor w = uniform({cols}, 0.5, 1.5, kFloat32, device, gen), b = uniform({cols}, -0.5, 0.5, kFloat32, device, gen);
      Tensor g = uniform({rows, cols}, -1, 1, kFloat32, device, gen);
      Tensor target = randint(0, cols, {rows}, {.dtype = kInt64}, &gen).to(device);
      auto run = [&](DType t) {
        Tensor x = x16.to(t).detach().requires_grad_();
        Tensor wl = w.clone().requires_grad_(), bl = b.clone().requires_grad_();
        Tensor ln = F::layer_norm(x, {cols}, wl, bl, 1e-5);
        Tensor sm = softmax(ln, 1), lsm = log_softmax(x, 0);
        Tensor ce = F::cross_entropy(ln, target, {.label_smoothing = 0.05});
        REQUIRE(ln.dtype() == t);
        REQUIRE(sm.dtype() == t);
        REQUIRE(lsm.dtype() == t);
        REQUIRE(ce.dtype() == t);
        Tensor loss = add(add(sum(mul(sm.to(kFloat32), g)), sum(mul(lsm.to(kFloat32), g))), ce.to(kFloat32));
        loss.backward();
        return std::vector<Tensor>{ln, sm, lsm, ce, x.grad(), wl.grad(), bl.grad()};
      };
      const std::vector<Tensor> low = run(dtype), ref = run(kFloat32);
      CHECK(low[4].dtype() == dtype);
      CHECK(low[5].dtype() == kFloat32);
      CHECK(low[6].dtype() == kFloat32);
      const char* names[] = {"layer_norm", "softmax", "log_softmax", "cross_entropy", "x.grad", "weight.grad",
                             "bias.grad"};
      for (size_t i = 0; i < low.size(); ++i) {
        INFO(names[i]);
        CHECK(relative_error(low[i], ref[i]) <= 1e-2);
      }
    }
  }
  // A bfloat16 weight gets a bfloat16 gradient (computed in float32, rounded once).
  Tensor x = uniform({rows, cols}, -3, 3, kBFloat16, Device::cpu(), gen).requires_grad_();
  Tensor w16 = uniform({cols}, 0.5, 1.5, kBFloat16, Device::cpu(), gen).requires_grad_();
  sum(F::layer_norm(x, {cols}, w16, Tensor(), 1e-5).to(kFloat32)).backward();
  CHECK(w16.grad().dtype() == kBFloat16);
}

TEST_CASE("16-bit softmax, layer_norm, cross_entropy and reductions on sim allocate no float32 copies", "[nn][half][sim]") {
  const Device sim = Device::sim(0);
  const int64_t rows = 64, cols = 1024, n = rows * cols;
  Generator gen(1414);
  for (DType dtype : kHalves) {
    Tensor x = uniform({rows, cols}, -2, 2, dtype, sim, gen);
    Tensor w = uniform({cols}, 0.5, 1.5, kFloat32, sim, gen), b = uniform({cols}, -0.5, 0.5, kFloat32, sim, gen);
    Tensor target = randint(0, cols, {rows}, {.dtype = kInt64}, &gen).to(sim);
    using Op = std::function<Tensor()>;
    // What each may allocate besides its 2n-byte output: per-row float32 statistics or losses.
    const std::vector<std::tuple<const char*, Op, size_t>> ops = {
        {"softmax", [&] { return softmax(x, 1); }, 0},
        {"log_softmax over dim 0", [&] { return log_softmax(x, 0); }, static_cast<size_t>(n) * 4},
        {"layer_norm", [&] { return F::layer_norm(x, {cols}, w, b, 1e-5); }, rows * 8},
        {"cross_entropy", [&] { return F::cross_entropy(x, target); }, rows * 8 + 64},
        {"sum over dim 0", [&] { return sum(x, {0}); }, 0},
        {"amax over dim 1", [&] { return amax(x, {1}); }, 0},
    };
    for (const auto& [name, op, extra] : ops) {
      INFO(name << " on " << dtype_name(dtype));
      Tensor out;
      const size_t peak = peak_during(sim, [&out, &op = op] { out = op(); });
      CHECK(out.element_size() == 2);
      // (a reduction's output is small: it alone is below the 8 KiB allowance)
      // The probabilities cross_entropy keeps for backward are 2n bytes too; 8 KiB of allocator
      // rounding. A float32 copy of the input alone would add 4n bytes.
      CHECK(peak <= static_cast<size_t>(n) * 2 + extra + 8192);
    }
  }
}

// [Saved as stored] (nn/functional/conv.cpp): on sim (and the CPU) a 16-bit convolution computes in
// float32 but keeps only its 16-bit input and weight for backward; before, the float32 copies of both
// were saved, which made bfloat16 autocast hold more memory than float32 training.
TEST_CASE("a 16-bit convolution on sim holds no float32 copy of its input for backward", "[nn][half][sim]") {
  const Device sim = Device::sim(0);
  Generator gen(1515);
  for (DType dtype : kHalves) {
    INFO(dtype_name(dtype));
    Tensor x = uniform({8, 16, 32, 32}, -1, 1, dtype, sim, gen).requires_grad_();
    Tensor w = uniform({16, 16, 3, 3}, -0.2, 0.2, dtype, sim, gen).requires_grad_();
    synchronize(sim);
    const size_t before = memory_allocated(sim);
    Tensor y = F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    synchronize(sim);
    const size_t held = memory_allocated(sim) - before, out_bytes = static_cast<size_t>(y.numel()) * 2;
    CHECK(y.dtype() == dtype);
    CHECK(held <= out_bytes + 8192);  // the output only (a float32 copy of x alone is 2x its size)
    Tensor g = uniform(y.sizes(), -1, 1, kFloat32, sim, gen);
    sum(mul(y.to(kFloat32), g)).backward();
    // The gradients equal float32 convolution's on the same (16-bit) values, rounded.
    Tensor x32 = x.detach().to(kFloat32).requires_grad_(), w32 = w.detach().to(kFloat32).requires_grad_();
    sum(mul(F::conv2d(x32, w32, Tensor(), {1, 1}, {1, 1}), g)).backward();
    CHECK(x.grad().dtype() == dtype);
    CHECK(relative_error(x.grad(), x32.grad()) <= 1e-2);
    CHECK(relative_error(w.grad(), w32.grad()) <= 1e-2);
  }
}

}  // namespace
}  // namespace chorus
