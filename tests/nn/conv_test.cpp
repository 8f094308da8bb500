// conv2d, pooling and batch norm: forward against plain loops in double written here, gradcheck of
// every input and parameter at small sizes, the layers' options/init/train-eval semantics, and the
// errors bad arguments get.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "kernels/cpu/onednn_conv.h"
#include "nn/nn.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace F = nn::functional;
using nn::Pair;

std::vector<double> doubles(const Tensor& t) {
  Tensor c = t.detach().to(kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

void check_close(const Tensor& actual, const std::vector<double>& expected, double tol) {
  std::vector<double> got = doubles(actual);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", expected " << expected[i]);
    CHECK(std::abs(got[i] - expected[i]) <= tol * (1.0 + std::abs(expected[i])));
  }
}

struct ConvCase {
  int64_t n, c_in, c_out, h, w, kh, kw;
  Pair stride, padding, dilation;
  int64_t groups;
  bool bias;
};

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

// Direct convolution in double: out[n, o, y, x] = b[o] + sum over the group's channels and taps.
std::vector<double> reference_conv(const ConvCase& cc, const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& b) {
  const int64_t oh = out_size(cc.h, cc.kh, cc.stride[0], cc.padding[0], cc.dilation[0]);
  const int64_t ow = out_size(cc.w, cc.kw, cc.stride[1], cc.padding[1], cc.dilation[1]);
  const int64_t cg = cc.c_in / cc.groups, og = cc.c_out / cc.groups;
  std::vector<double> out(cc.n * cc.c_out * oh * ow);
  for (int64_t n = 0; n < cc.n; ++n)
    for (int64_t o = 0; o < cc.c_out; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t xx = 0; xx < ow; ++xx) {
          double s = cc.bias ? b[o] : 0.0;
          const int64_t g = o / og;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < cc.kh; ++i)
              for (int64_t j = 0; j < cc.kw; ++j) {
                const int64_t iy = y * cc.stride[0] - cc.padding[0] + i * cc.dilation[0];
                const int64_t ix = xx * cc.stride[1] - cc.padding[1] + j * cc.dilation[1];
                if (iy < 0 || iy >= cc.h || ix < 0 || ix >= cc.w) continue;
                s += x[((n * cc.c_in + g * cg + c) * cc.h + iy) * cc.w + ix] * w[((o * cg + c) * cc.kh + i) * cc.kw + j];
              }
          out[((n * cc.c_out + o) * oh + y) * ow + xx] = s;
        }
  return out;
}

const std::vector<ConvCase> kConvCases = {
    {2, 3, 4, 7, 6, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {3, 4, 6, 8, 8, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true},
    {2, 4, 4, 9, 7, 3, 2, {1, 2}, {2, 1}, {2, 1}, 2, false},
    {4, 6, 6, 5, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, 6, true},  // depthwise
    {3, 5, 7, 6, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},  // pointwise fast path
    {2, 4, 8, 7, 7, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, false}, // strided 1x1 (im2col path)
    {1, 2, 3, 5, 4, 5, 4, {1, 1}, {2, 2}, {1, 1}, 1, true},  // one sample: multi-threaded GEMM path
};

TEST_CASE("conv2d matches direct convolution in double for strides, padding, dilation and groups",
          "[nn][conv]") {
  Generator gen(11);
  for (DType dt : {kFloat32, kFloat64}) {
    for (const ConvCase& cc : kConvCases) {
      INFO("case n=" << cc.n << " c_in=" << cc.c_in << " c_out=" << cc.c_out << " groups=" << cc.groups
                     << " dtype=" << dtype_name(dt));
      Tensor x = randn({cc.n, cc.c_in, cc.h, cc.w}, {.dtype = dt}, &gen);
      Tensor w = randn({cc.c_out, cc.c_in / cc.groups, cc.kh, cc.kw}, {.dtype = dt}, &gen);
      Tensor b = cc.bias ? randn({cc.c_out}, {.dtype = dt}, &gen) : Tensor();
      Tensor out = F::conv2d(x, w, b, cc.stride, cc.padding, cc.dilation, cc.groups);
      const int64_t oh = out_size(cc.h, cc.kh, cc.stride[0], cc.padding[0], cc.dilation[0]);
      const int64_t ow = out_size(cc.w, cc.kw, cc.stride[1], cc.padding[1], cc.dilation[1]);
      CHECK(out.sizes() == Shape{cc.n, cc.c_out, oh, ow});
      CHECK(out.dtype() == dt);
      check_close(out, reference_conv(cc, doubles(x), doubles(w), cc.bias ? doubles(b) : std::vector<double>{}),
                  dt == kFloat32 ? 1e-5 : 1e-12);
    }
  }
}

// float32 convolutions run through oneDNN (kernels/cpu/onednn_conv), float64 ones through im2col
// + GEMM: the float32 gradients of input, weight and bias must equal the float64 ones (which pass
// gradcheck below) within float32 rounding, for every case, with and without each gradient wanted.
TEST_CASE("conv2d float32 backward equals the float64 gradients", "[nn][conv]") {
  Generator gen(12);
  for (const ConvCase& cc : kConvCases) {
    INFO("case n=" << cc.n << " c_in=" << cc.c_in << " c_out=" << cc.c_out << " groups=" << cc.groups);
    Tensor x64 = randn({cc.n, cc.c_in, cc.h, cc.w}, {.dtype = kFloat64}, &gen);
    Tensor w64 = randn({cc.c_out, cc.c_in / cc.groups, cc.kh, cc.kw}, {.dtype = kFloat64}, &gen);
    Tensor b64 = cc.bias ? randn({cc.c_out}, {.dtype = kFloat64}, &gen) : Tensor();
    Tensor up = randn({cc.n, cc.c_out, out_size(cc.h, cc.kh, cc.stride[0], cc.padding[0], cc.dilation[0]),
                       out_size(cc.w, cc.kw, cc.stride[1], cc.padding[1], cc.dilation[1])},
                      {.dtype = kFloat64}, &gen);
    for (int wanted = 0; wanted < 3; ++wanted) {  // all three; input only; parameters only
      auto run = [&](DType dt) {
        Tensor x = x64.to(dt).detach(), w = w64.to(dt).detach(), b = cc.bias ? b64.to(dt).detach() : Tensor();
        x.requires_grad_(wanted != 2);
        w.requires_grad_(wanted != 1);
        if (b.defined()) b.requires_grad_(wanted != 1);
        (F::conv2d(x, w, b, cc.stride, cc.padding, cc.dilation, cc.groups) * up.to(dt)).sum().backward();
        return std::vector<Tensor>{x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
      };
      const auto g32 = run(kFloat32), g64 = run(kFloat64);
      for (size_t i = 0; i < g32.size(); ++i) {
        INFO("gradient " << i << " wanted " << wanted);
        REQUIRE(g32[i].defined() == g64[i].defined());
        if (!g32[i].defined()) continue;
        const double scale = std::max(1.0, g64[i].abs().max().item<double>());
        CHECK((g32[i].to(kFloat64) - g64[i]).abs().max().item<double>() <= 2e-5 * scale);
      }
    }
  }
}

namespace {

// A 3x3 stride-1 padding-1 convolution with bias, 32 -> 48 channels, of a batch of 2 h x w images
// through autograd (the loss: its output times a fixed tensor, summed), in float64 and in float32
// with Winograd allowed and not: output, input, weight and bias gradients, and the implementation
// each float32 forward ran.
struct WinogradRuns {
  std::vector<Tensor> exact, direct, winograd, again;
  std::string direct_impl, winograd_impl;
};

WinogradRuns winograd_runs(int64_t h, int64_t w, uint64_t seed) {
  namespace od = kernels::cpu::onednn;
  Generator gen(seed);
  const Tensor x64 = randn({2, 32, h, w}, {.dtype = kFloat64}, &gen);
  const Tensor w64 = randn({48, 32, 3, 3}, {.dtype = kFloat64}, &gen) * (1.0 / std::sqrt(288.0));
  const Tensor b64 = randn({48}, {.dtype = kFloat64}, &gen);
  const Tensor up = randn({2, 48, h, w}, {.dtype = kFloat64}, &gen);
  const kernels::Window2d window{.in_h = h, .in_w = w, .out_h = h, .out_w = w, .kernel_h = 3, .kernel_w = 3,
                                 .pad_h = 1, .pad_w = 1};
  auto run = [&](DType dt, bool winograd, std::string* impl) {
    const od::WinogradScope scope(winograd);
    Tensor x = x64.to(dt).detach().requires_grad_(true), wt = w64.to(dt).detach().requires_grad_(true),
           b = b64.to(dt).detach().requires_grad_(true);
    Tensor out = F::conv2d(x, wt, b, {1, 1}, {1, 1});
    (out * up.to(dt)).sum().backward();
    if (impl) *impl = od::implementation(x.detach(), wt.detach(), window, 1);
    return std::vector<Tensor>{out.detach(), x.grad(), wt.grad(), b.grad()};
  };
  WinogradRuns r;
  r.exact = run(kFloat64, true, nullptr);
  r.direct = run(kFloat32, false, &r.direct_impl);
  r.winograd = run(kFloat32, true, &r.winograd_impl);
  r.again = run(kFloat32, true, nullptr);
  return r;
}

}  // namespace

// [Winograd convolutions] (kernels/cpu/onednn_conv.cpp): a 3x3 stride-1 ungrouped convolution with
// channel counts in multiples of 16 and at least 8x8 outputs per image runs oneDNN's Winograd kernels
// where the CPU has them (AVX-512), forward and both gradients; others, and every shape with
// set_winograd(false), run the direct kernels. Both against float64 (the im2col path): the direct
// kernels within 2e-5 of each tensor's largest, as above; Winograd within 1e-5 (measured on a Zen 5:
// at most 1.1e-6, the direct kernels 4.8e-7), different from the direct results (else the Winograd
// kernels did not run) and the same bits on a second run.
TEST_CASE("3x3 convolutions with 16k channels and 8x8 outputs run Winograd kernels on AVX-512, within their round-off",
          "[nn][conv][winograd]") {
  namespace od = kernels::cpu::onednn;
  const WinogradRuns r = winograd_runs(10, 10, 31);
  const auto& [exact, direct, winograd, again, direct_impl, winograd_impl] = r;
  const kernels::Window2d window{.in_h = 10, .in_w = 10, .out_h = 10, .out_w = 10, .kernel_h = 3, .kernel_w = 3,
                                 .pad_h = 1, .pad_w = 1};
  INFO("direct: " << direct_impl << ", winograd: " << winograd_impl);
  CHECK(direct_impl.find("wino") == std::string::npos);
  const bool has_winograd = od::capability().rfind("avx512", 0) == 0;
  if (has_winograd) CHECK(winograd_impl.find("wino") != std::string::npos);
  else std::printf("CHORUS-SKIP: oneDNN has no float32 Winograd kernels for %s (AVX-512 only): both runs were direct\n",
                   od::capability().c_str());
  const char* names[] = {"output", "input gradient", "weight gradient", "bias gradient"};
  for (size_t i = 0; i < exact.size(); ++i) {
    INFO(names[i]);
    const double scale = std::max(1.0, exact[i].abs().max().item<double>());
    const double direct_error = (direct[i].to(kFloat64) - exact[i]).abs().max().item<double>() / scale;
    const double winograd_error = (winograd[i].to(kFloat64) - exact[i]).abs().max().item<double>() / scale;
    std::printf("%s: direct %.3g, winograd %.3g of the largest\n", names[i], direct_error, winograd_error);
    CHECK(direct_error <= 2e-5);
    CHECK(winograd_error <= 1e-5);
    CHECK(equal(winograd[i], again[i]));
    // The bias gradient is a plain sum of the output gradient in both.
    if (has_winograd && i < 3) CHECK((winograd[i] - direct[i]).abs().max().item<double>() > 0);
  }
  // Shapes the rule leaves direct: 8 input channels, 7x7 outputs (49 positions), stride 2, groups.
  const od::WinogradScope on(true);
  auto impl = [&](Shape x, Shape w, kernels::Window2d win, int64_t groups) {
    return od::implementation(randn(x), randn(w), win, groups);
  };
  kernels::Window2d small = window;
  small.in_h = small.in_w = small.out_h = small.out_w = 7;
  kernels::Window2d strided = window;
  strided.stride_h = strided.stride_w = 2;
  strided.out_h = strided.out_w = 5;
  CHECK(impl({2, 8, 10, 10}, {48, 8, 3, 3}, window, 1).find("wino") == std::string::npos);
  CHECK(impl({2, 32, 7, 7}, {48, 32, 3, 3}, small, 1).find("wino") == std::string::npos);
  CHECK(impl({2, 32, 10, 10}, {48, 32, 3, 3}, strided, 1).find("wino") == std::string::npos);
  CHECK(impl({2, 32, 10, 10}, {48, 16, 3, 3}, window, 2).find("wino") == std::string::npos);
}

// [Own Winograd convolutions] (kernels/cpu/winograd.cpp): where oneDNN has no Winograd kernels (every
// CPU without AVX-512, and CHORUS_CPU_CAPABILITY=avx2 or default: tools/test.sh runs this file so),
// the shapes above with padding 1, an even height and a width in multiples of 8 run chorus's
// F(2x2, 3x3) kernels, forward and both gradients through autograd. Against float64 within 1e-5 of
// each tensor's largest (measured on a Zen 5 with AVX2 imposed: at most 3.9e-7), different from the
// direct results (else they did not run), the same bits on a second run; set_winograd(false) and a
// width of 10 stay direct.
TEST_CASE("3x3 convolutions run chorus's own Winograd kernels where oneDNN has none, within their round-off",
          "[nn][conv][winograd]") {
  namespace od = kernels::cpu::onednn;
  if (od::capability().rfind("avx512", 0) == 0) {
    std::printf("CHORUS-SKIP: oneDNN runs its own Winograd kernels on %s; chorus's run under CHORUS_CPU_CAPABILITY=avx2 "
                "(tools/test.sh --full) and in winograd_test\n",
                od::capability().c_str());
    return;
  }
  const WinogradRuns r = winograd_runs(8, 16, 32);
  const auto& [exact, direct, winograd, again, direct_impl, winograd_impl] = r;
  const kernels::Window2d window{.in_h = 8, .in_w = 16, .out_h = 8, .out_w = 16, .kernel_h = 3, .kernel_w = 3,
                                 .pad_h = 1, .pad_w = 1};
  CHECK(direct_impl.find("winograd") == std::string::npos);
  CHECK(winograd_impl == "chorus:winograd_2x3");
  const char* names[] = {"output", "input gradient", "weight gradient", "bias gradient"};
  for (size_t i = 0; i < exact.size(); ++i) {
    INFO(names[i]);
    const double scale = std::max(1.0, exact[i].abs().max().item<double>());
    const double error = (winograd[i].to(kFloat64) - exact[i]).abs().max().item<double>() / scale;
    std::printf("%s: chorus's winograd %.3g of the largest\n", names[i], error);
    CHECK(error <= 1e-5);
    CHECK(equal(winograd[i], again[i]));
    if (i < 3) CHECK((winograd[i] - direct[i]).abs().max().item<double>() > 0);
  }
  const od::WinogradScope on(true);
  kernels::Window2d width10 = window;
  width10.in_w = width10.out_w = 10;
  CHECK(od::implementation(randn({2, 32, 8, 10}), randn({48, 32, 3, 3}), width10, 1) != "chorus:winograd_2x3");
}

// tools/test.sh runs this file again under CHORUS_CPU_CAPABILITY=avx512/avx2/default: oneDNN must
// then use at most that instruction set (and every case above must still hold).
TEST_CASE("CHORUS_CPU_CAPABILITY caps the instruction set of the oneDNN kernels", "[nn][conv]") {
  const std::string isa = kernels::cpu::onednn::capability();
  const char* cap = std::getenv("CHORUS_CPU_CAPABILITY");
  INFO("CHORUS_CPU_CAPABILITY=" << (cap ? cap : "(unset)") << ", oneDNN uses " << isa);
  if (cap && std::string(cap) == "avx2") CHECK(isa == "avx2");
  else if (cap && std::string(cap) == "default") CHECK(isa == "sse41");
  else if (cap && std::string(cap) == "avx512") CHECK(isa.rfind("avx512", 0) == 0);
  else CHECK((isa == "avx2" || isa.rfind("avx512", 0) == 0));  // unset: the best this CPU has
}

TEST_CASE("conv2d reads non-contiguous inputs and unbatched [C, H, W] inputs", "[nn][conv]") {
  Generator gen(12);
  Tensor x = randn({2, 3, 6, 5}, {.dtype = kFloat64}, &gen);
  Tensor xt = x.transpose(2, 3).contiguous().transpose(2, 3);  // same values, other strides
  REQUIRE_FALSE(xt.is_contiguous());
  Tensor w = randn({4, 3, 3, 3}, {.dtype = kFloat64}, &gen);
  check_close(F::conv2d(xt, w, Tensor(), {1, 1}, {1, 1}), doubles(F::conv2d(x, w, Tensor(), {1, 1}, {1, 1})), 1e-12);
  Tensor single = F::conv2d(x.select(0, 1), w);
  CHECK(single.sizes() == Shape{4, 4, 3});
  check_close(single, doubles(F::conv2d(x, w).select(0, 1)), 1e-12);
}

TEST_CASE("conv2d gradients of input, weight and bias pass gradcheck", "[nn][conv][gradcheck]") {
  Generator gen(13);
  for (const ConvCase& cc : kConvCases) {
    INFO("case c_in=" << cc.c_in << " groups=" << cc.groups << " kernel=" << cc.kh << "x" << cc.kw);
    Tensor x = randn({std::min<int64_t>(cc.n, 2), cc.c_in, std::min<int64_t>(cc.h, 6), std::min<int64_t>(cc.w, 6)},
                     {.dtype = kFloat64, .requires_grad = true}, &gen);
    Tensor w = randn({cc.c_out, cc.c_in / cc.groups, cc.kh, cc.kw}, {.dtype = kFloat64, .requires_grad = true}, &gen);
    TensorList inputs{x, w};
    if (cc.bias) inputs.push_back(randn({cc.c_out}, {.dtype = kFloat64, .requires_grad = true}, &gen));
    CHECK(autograd::gradcheck(
        [&](const TensorList& in) {
          return F::conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), cc.stride, cc.padding, cc.dilation,
                           cc.groups);
        },
        inputs));
  }
}

TEST_CASE("conv2d rejects mismatched channels, shapes and kernels larger than the input", "[nn][conv][errors]") {
  Tensor x = randn({2, 3, 5, 5});
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK_THAT(message([&] { F::conv2d(x, randn({4, 2, 3, 3})); }),
             Catch::Contains("has 3 channels") && Catch::Contains("[4, 2, 3, 3]"));
  CHECK_THAT(message([&] { F::conv2d(randn({3, 5}), randn({4, 3, 3, 3})); }),
             Catch::Contains("3-D [C, H, W] or 4-D") && Catch::Contains("[3, 5]"));
  CHECK_THAT(message([&] { F::conv2d(x, randn({4, 3, 7, 7})); }), Catch::Contains("too small"));
  CHECK_THAT(message([&] { F::conv2d(x, randn({4, 3, 3, 3}), randn({5})); }), Catch::Contains("bias must have shape [4]"));
  CHECK_THAT(message([&] { F::conv2d(x, randn({4, 1, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2); }),
             Catch::Contains("divisible by groups 2"));
  CHECK_THAT(message([&] { F::conv2d(x, randn({4, 3, 3, 3}), Tensor(), {0, 1}); }), Catch::Contains("stride must be >= 1"));
  CHECK_THAT(message([&] { F::conv2d(x, randn({4, 3, 3, 3}, {.dtype = kFloat64})); }), Catch::Contains("same dtype"));
  CHECK_THAT(message([&] { nn::Conv2d(nn::Conv2dOptions(3, 4, 3).groups(2)); }), Catch::Contains("divisible by groups"));
}

TEST_CASE("Conv2d layer: options, PyTorch's default init bounds, parameter shapes", "[nn][conv]") {
  manual_seed(3);
  nn::Conv2d conv(nn::Conv2dOptions(8, 16, 3).stride(2).padding(1).bias(true));
  CHECK(conv.weight.sizes() == Shape{16, 8, 3, 3});
  CHECK(conv.bias.sizes() == Shape{16});
  // kaiming_uniform(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 8*3*3.
  const double bound = 1.0 / std::sqrt(72.0);
  std::vector<double> w = doubles(conv.weight);
  double lo = 1, hi = -1;
  for (double v : w) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(hi - lo > 1.8 * bound);  // 1152 draws span nearly the whole interval
  Tensor y = conv.forward(randn({2, 8, 9, 9}));
  CHECK(y.sizes() == Shape{2, 16, 5, 5});
  CHECK(conv.named_parameters().size() == 2);
  nn::Conv2d no_bias(nn::Conv2dOptions(4, 4, 1).bias(false));
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.named_parameters().size() == 1);
}

// ------------------------------------------------------------------ pooling
std::vector<double> reference_max_pool(const std::vector<double>& x, int64_t planes, int64_t h, int64_t w, Pair k,
                                       Pair s, Pair p, Pair d, int64_t oh, int64_t ow) {
  std::vector<double> out(planes * oh * ow);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xx = 0; xx < ow; ++xx) {
        double best = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < k[0]; ++i)
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t iy = y * s[0] - p[0] + i * d[0], ix = xx * s[1] - p[1] + j * d[1];
            if (iy >= 0 && iy < h && ix >= 0 && ix < w) best = std::max(best, x[(pl * h + iy) * w + ix]);
          }
        out[(pl * oh + y) * ow + xx] = best;
      }
  return out;
}

TEST_CASE("max_pool2d matches a reference with stride, padding, dilation and ceil_mode", "[nn][pool]") {
  Generator gen(21);
  struct Case {
    Pair k, s, p, d;
    bool ceil;
    int64_t oh, ow;  // PyTorch's output size for a 7x8 input
  };
  const std::vector<Case> cases = {
      {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, 3, 4},
      {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, 4, 4},
      {{3, 2}, {2, 3}, {1, 1}, {1, 1}, true, 4, 3},
      {{2, 2}, {1, 1}, {0, 1}, {2, 2}, false, 5, 8},
      {{2, 2}, {2, 2}, {0, 0}, {1, 1}, true, 4, 4},
  };
  for (const Case& c : cases) {
    Tensor x = randn({2, 3, 7, 8}, {}, &gen);
    Tensor out = F::max_pool2d(x, c.k, c.s, c.p, c.d, c.ceil);
    REQUIRE(out.sizes() == Shape{2, 3, c.oh, c.ow});
    check_close(out, reference_max_pool(doubles(x), 6, 7, 8, c.k, c.s, c.p, c.d, c.oh, c.ow), 0);
  }
}

TEST_CASE("max_pool2d routes the gradient to the arg-max and passes gradcheck", "[nn][pool][gradcheck]") {
  Tensor x = tensor(std::vector<double>{1, 5, 2, 0, 3, 4, 9, 8, 7, 6, 1, 2, 0, 0, 3, 1}).reshape({1, 1, 4, 4});
  x.requires_grad_();
  F::max_pool2d(x, {2, 2}).sum().backward();
  check_close(x.grad(), {0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0}, 0);
  // Distinct, shuffled values keep the arg-max away from ties, where there is no derivative.
  std::vector<double> vals(2 * 2 * 6 * 5);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = 0.37 * static_cast<double>(i);
  std::mt19937 rng(22);
  std::shuffle(vals.begin(), vals.end(), rng);
  Tensor yp = tensor(vals).reshape({2, 2, 6, 5}).requires_grad_();
  CHECK(autograd::gradcheck([](const TensorList& in) { return F::max_pool2d(in[0], {3, 2}, Pair{2, 1}, {1, 1}); },
                            {yp}));
  Tensor nan_in = tensor(std::vector<float>{1, NAN, 2, 3}).reshape({1, 1, 2, 2});
  CHECK(std::isnan(F::max_pool2d(nan_in, {2, 2}).item<float>()));  // NaN propagates, as PyTorch
}

TEST_CASE("avg_pool2d matches a reference with and without count_include_pad; gradcheck", "[nn][pool]") {
  Generator gen(23);
  Tensor x = randn({2, 2, 5, 6}, {.dtype = kFloat64}, &gen);
  for (bool include : {true, false}) {
    Tensor out = F::avg_pool2d(x, {3, 3}, Pair{2, 2}, {1, 1}, false, include);
    REQUIRE(out.sizes() == Shape{2, 2, 3, 3});
    std::vector<double> xv = doubles(x), expected;
    for (int64_t pl = 0; pl < 4; ++pl)
      for (int64_t y = 0; y < 3; ++y)
        for (int64_t xx = 0; xx < 3; ++xx) {
          double s = 0;
          int64_t count = 0;
          for (int64_t i = 0; i < 3; ++i)
            for (int64_t j = 0; j < 3; ++j) {
              const int64_t iy = y * 2 - 1 + i, ix = xx * 2 - 1 + j;
              if (iy >= 0 && iy < 5 && ix >= 0 && ix < 6) s += xv[(pl * 5 + iy) * 6 + ix], ++count;
            }
          expected.push_back(s / (include ? 9.0 : static_cast<double>(count)));
        }
    check_close(out, expected, 1e-12);
    Tensor xg = x.detach().requires_grad_();
    CHECK(autograd::gradcheck(
        [include](const TensorList& in) { return F::avg_pool2d(in[0], {3, 3}, Pair{2, 2}, {1, 1}, true, include); },
        {xg}));
  }
}

TEST_CASE("adaptive_avg_pool2d uses PyTorch's overlapping windows; global pooling is the mean", "[nn][pool]") {
  Generator gen(24);
  Tensor x = randn({2, 3, 7, 5}, {.dtype = kFloat64}, &gen);
  check_close(F::adaptive_avg_pool2d(x, {1, 1}), doubles(x.mean({2, 3}, true)), 1e-12);
  // 7 -> 3: windows [0,3) [2,5) [4,7); 5 -> 2: [0,3) [2,5).
  Tensor out = F::adaptive_avg_pool2d(x, {3, 2});
  std::vector<double> xv = doubles(x), expected;
  const int64_t hs[3][2] = {{0, 3}, {2, 5}, {4, 7}}, ws[2][2] = {{0, 3}, {2, 5}};
  for (int64_t pl = 0; pl < 6; ++pl)
    for (auto& h : hs)
      for (auto& w : ws) {
        double s = 0;
        for (int64_t i = h[0]; i < h[1]; ++i)
          for (int64_t j = w[0]; j < w[1]; ++j) s += xv[(pl * 7 + i) * 5 + j];
        expected.push_back(s / static_cast<double>((h[1] - h[0]) * (w[1] - w[0])));
      }
  check_close(out, expected, 1e-12);
  Tensor xg = x.detach().requires_grad_();
  CHECK(autograd::gradcheck([](const TensorList& in) { return F::adaptive_avg_pool2d(in[0], {3, 2}); }, {xg}));
  nn::AdaptiveAvgPool2d gap(1);
  CHECK(gap.forward(x).sizes() == Shape{2, 3, 1, 1});
}

TEST_CASE("pooling rejects bad kernel, stride and padding", "[nn][pool][errors]") {
  Tensor x = randn({1, 1, 4, 4});
  CHECK_THROWS_WITH(F::max_pool2d(x, {3, 3}, Pair{1, 1}, {2, 2}), Catch::Contains("at most half of kernel_size"));
  CHECK_THROWS_WITH(F::max_pool2d(x, {0, 2}), Catch::Contains("kernel_size must be >= 1"));
  CHECK_THROWS_WITH(F::avg_pool2d(x, {5, 5}), Catch::Contains("too small"));
  CHECK_THROWS_WITH(F::adaptive_avg_pool2d(x, {0, 1}), Catch::Contains("output_size must be >= 1"));
  CHECK_THROWS_WITH(F::max_pool2d(randint(0, 3, {1, 1, 4, 4}), {2, 2}), Catch::Contains("floating-point"));
}

// ------------------------------------------------------------------ batch norm
TEST_CASE("batch_norm in training normalizes with batch statistics and updates running ones",
          "[nn][batchnorm]") {
  Generator gen(31);
  Tensor x = randn({4, 3, 5, 2}, {.dtype = kFloat64}, &gen) * 2.0 + 1.5;
  Tensor w = randn({3}, {.dtype = kFloat64}, &gen), b = randn({3}, {.dtype = kFloat64}, &gen);
  Tensor rm = randn({3}, {.dtype = kFloat64}, &gen), rv = rand({3}, {.dtype = kFloat64}, &gen) + 0.5;
  std::vector<double> rm0 = doubles(rm), rv0 = doubles(rv), xv = doubles(x), wv = doubles(w), bv = doubles(b);
  Tensor y = F::batch_norm(x, rm, rv, w, b, /*training=*/true, 0.1, 1e-5);
  std::vector<double> expected(xv.size());
  for (int64_t c = 0; c < 3; ++c) {
    double mean = 0, sq = 0;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t s = 0; s < 10; ++s) mean += xv[(n * 3 + c) * 10 + s];
    mean /= 40;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t s = 0; s < 10; ++s) sq += std::pow(xv[(n * 3 + c) * 10 + s] - mean, 2);
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t s = 0; s < 10; ++s) {
        const int64_t i = (n * 3 + c) * 10 + s;
        expected[i] = (xv[i] - mean) / std::sqrt(sq / 40 + 1e-5) * wv[c] + bv[c];
      }
    CHECK(doubles(rm)[c] == Approx(0.9 * rm0[c] + 0.1 * mean).epsilon(1e-12));
    CHECK(doubles(rv)[c] == Approx(0.9 * rv0[c] + 0.1 * sq / 39).epsilon(1e-12));  // unbiased
  }
  check_close(y, expected, 1e-12);
  // Eval: the running statistics, nothing updated.
  std::vector<double> rm1 = doubles(rm), rv1 = doubles(rv);
  Tensor ye = F::batch_norm(x, rm, rv, w, b, /*training=*/false, 0.1, 1e-5);
  for (size_t i = 0; i < xv.size(); ++i) {
    const int64_t c = (static_cast<int64_t>(i) / 10) % 3;
    expected[i] = (xv[i] - rm1[c]) / std::sqrt(rv1[c] + 1e-5) * wv[c] + bv[c];
  }
  check_close(ye, expected, 1e-12);
  CHECK(doubles(rm) == rm1);
}

TEST_CASE("batch_norm gradients pass gradcheck in training and eval", "[nn][batchnorm][gradcheck]") {
  Generator gen(32);
  Tensor x = randn({3, 2, 2, 3}, {.dtype = kFloat64, .requires_grad = true}, &gen);
  Tensor w = randn({2}, {.dtype = kFloat64, .requires_grad = true}, &gen);
  Tensor b = randn({2}, {.dtype = kFloat64, .requires_grad = true}, &gen);
  Tensor rm = randn({2}, {.dtype = kFloat64}, &gen), rv = rand({2}, {.dtype = kFloat64}, &gen) + 0.5;
  // Training: batch statistics (no running buffers, so every finite-difference call sees the same
  // function); the input gradient includes the statistics' dependence on x.
  CHECK(autograd::gradcheck(
      [](const TensorList& in) { return F::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true); }, {x, w, b}));
  // Eval: fixed running statistics.
  CHECK(autograd::gradcheck([&](const TensorList& in) { return F::batch_norm(in[0], rm, rv, in[1], in[2], false); },
                            {x, w, b}));
  Tensor x1 = randn({5, 4}, {.dtype = kFloat64, .requires_grad = true}, &gen);  // BatchNorm1d's 2-D input
  CHECK(autograd::gradcheck(
      [](const TensorList& in) { return F::batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); }, {x1}));
}

TEST_CASE("BatchNorm2d layer: train/eval semantics, buffers, momentum None, state_dict keys", "[nn][batchnorm]") {
  Generator gen(33);
  nn::BatchNorm2d bn(3);
  CHECK(bn.weight.sizes() == Shape{3});
  std::vector<std::string> keys;
  for (auto& [name, t] : bn.state_dict()) keys.push_back(name);
  CHECK(keys == std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"});
  Tensor x = randn({8, 3, 4, 4}, {}, &gen) * 3.0 + 2.0;
  Tensor y = bn.forward(x);
  // Training output: per-channel mean 0, biased variance 1 (weight 1, bias 0 at init).
  std::vector<double> means = doubles(y.mean({0, 2, 3})), vars = doubles(var(y, {0, 2, 3}, false));
  for (int c = 0; c < 3; ++c) {
    CHECK(std::abs(means[c]) < 1e-5);
    CHECK(vars[c] == Approx(1.0).epsilon(1e-3));
  }
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  check_close(bn.running_mean, doubles(x.mean({0, 2, 3}) * 0.1), 1e-5);
  bn.eval();
  Tensor ye = bn.forward(x);
  check_close(ye, doubles((x - bn.running_mean.reshape({1, 3, 1, 1})) /
                          (bn.running_var.reshape({1, 3, 1, 1}) + 1e-5).sqrt()),
              1e-5);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  // momentum = None: the running statistics are the cumulative average of the batch statistics.
  nn::BatchNorm1d cumulative(2, 1e-5, std::nullopt);
  Tensor a = randn({6, 2}, {}, &gen), b = randn({6, 2}, {}, &gen) + 4.0;
  cumulative.forward(a);
  cumulative.forward(b);
  check_close(cumulative.running_mean, doubles((a.mean({0}) + b.mean({0})) * 0.5), 1e-5);
  CHECK_THROWS_WITH(bn.forward(randn({2, 4, 3, 3})), Catch::Contains("expected input with 3 channels"));
  CHECK_THROWS_WITH(bn.forward(randn({2, 3, 3})), Catch::Contains("4-D [N, C, H, W]"));
  bn.train();
  CHECK_THROWS_WITH(nn::BatchNorm1d(3).forward(randn({1, 3})), Catch::Contains("more than 1 value per channel"));
}

TEST_CASE("a conv-BN-ReLU-pool network trains: its loss falls", "[nn][conv][batchnorm]") {
  manual_seed(5);
  nn::Sequential net;
  net.push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(1, 4, 3).padding(1)));
  net.push_back(std::make_shared<nn::BatchNorm2d>(4));
  net.push_back(std::make_shared<nn::ReLU>());
  net.push_back(std::make_shared<nn::MaxPool2d>(2));
  net.push_back(std::make_shared<nn::Flatten>());
  net.push_back(std::make_shared<nn::Linear>(4 * 4 * 4, 3));
  Tensor x = randn({12, 1, 8, 8});
  Tensor target = randint(0, 3, {12});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    net.zero_grad();
    Tensor loss = F::cross_entropy(net.forward(x), target);
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : net.parameters()) p.sub_(p.grad() * 0.1);
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  CHECK(last < 0.2 * first);
}

}  // namespace
}  // namespace chorus
