// chorus's own Winograd F(2x2, 3x3) convolutions (kernels/cpu/winograd.cpp, [Own Winograd
// convolutions]) against the float64 convolution (chorus's im2col + Eigen path, a separate
// implementation), forward and both gradients, called directly so that they run on every CPU (the
// route to them, taken where oneDNN has no Winograd kernels, is checked by conv_test). Each element
// is held to the bound of the direct float32 sum of its terms: n * 2^-24 * S, with S the same
// computation on |x|, |grad_out|, |weight| in float64 and n the number of terms; the Winograd sums
// stay inside it (measured on Zen 5: at most 0.21 of it, the printed ratios), though their round-off is
// not that of the direct sum. Also: the same bits at 1 and 2 threads, and which shapes the kernels
// take.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/cpu/conv.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

// [No header] (kernels/cpu/gemm.cpp): declared where used.
namespace chorus::kernels::cpu::winograd {
bool supports(int64_t c, int64_t k, int64_t h, int64_t w);
void forward(const float* x, const float* weight, const float* bias, float* y, int64_t n, int64_t c, int64_t k,
             int64_t h, int64_t w);
void data_grad(const float* dy, const float* weight, float* dx, int64_t n, int64_t c, int64_t k, int64_t h,
               int64_t w);
void weight_grad(const float* x, const float* dy, float* dw, int64_t n, int64_t c, int64_t k, int64_t h, int64_t w);
}  // namespace chorus::kernels::cpu::winograd

namespace kc = chorus::kernels::cpu;
namespace wg = chorus::kernels::cpu::winograd;
using namespace chorus;

namespace {

struct Case {
  int64_t n, c, k, h, w;
  bool bias;
  const char* what;
};

kernels::Window2d window(const Case& s) {
  return {.in_h = s.h, .in_w = s.w, .out_h = s.h, .out_w = s.w, .kernel_h = 3, .kernel_w = 3, .pad_h = 1, .pad_w = 1};
}

std::vector<double> values(const Tensor& t) {
  Tensor d = t.to(kFloat64).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// The worst ratio over the elements of |got - want| to terms * 2^-24 * abs_sum.
double worst_ratio(const Tensor& got, const Tensor& want, const Tensor& abs_sum, int64_t terms) {
  const std::vector<double> g = values(got), r = values(want), s = values(abs_sum);
  REQUIRE(g.size() == r.size());
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double bound = static_cast<double>(terms) * std::ldexp(1.0, -24) * s[i] + 1e-30;
    worst = std::max(worst, std::abs(g[i] - r[i]) / bound);
  }
  return worst;
}

// The float64 reference: forward, and the gradients of input and weight (im2col + Eigen).
Tensor reference_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Case& s) {
  Tensor out = make_tensor({s.n, s.k, s.h, s.w}, kFloat64, kCPU);
  kc::conv2d(out, x, weight, bias, window(s), 1);
  return out;
}
void reference_backward(const Tensor& go, const Tensor& x, const Tensor& weight, const Case& s, Tensor& gx, Tensor& gw) {
  gx = make_tensor(x.sizes(), kFloat64, kCPU);
  gw = make_tensor(weight.sizes(), kFloat64, kCPU);
  kc::conv2d_backward(gx, gw, Tensor(), go, x, weight, window(s), 1);
}

struct Results {
  Tensor y, dx, dw;
};

Results run(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& go, const Case& s) {
  Results r{make_tensor({s.n, s.k, s.h, s.w}, kFloat32, kCPU), make_tensor(x.sizes(), kFloat32, kCPU),
            make_tensor(weight.sizes(), kFloat32, kCPU)};
  wg::forward(x.data_ptr<float>(), weight.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
              r.y.data_ptr<float>(), s.n, s.c, s.k, s.h, s.w);
  wg::data_grad(go.data_ptr<float>(), weight.data_ptr<float>(), r.dx.data_ptr<float>(), s.n, s.c, s.k, s.h, s.w);
  wg::weight_grad(x.data_ptr<float>(), go.data_ptr<float>(), r.dw.data_ptr<float>(), s.n, s.c, s.k, s.h, s.w);
  return r;
}

}  // namespace

TEST_CASE("Winograd F(2x2, 3x3) convolutions match float64 within the direct sum's rounding bound", "[cpu][conv]") {
  const Case cases[] = {
      {2, 16, 32, 8, 8, true, "8x8 (4 tiles a row: rows paired), with bias"},
      {3, 16, 16, 2, 8, false, "2x8, batch 3 (3 tile rows: pairs across images, the last row alone)"},
      {1, 32, 16, 6, 8, true, "6x8 (3 tile rows: the last alone), with bias"},
      {3, 32, 16, 6, 24, false, "6x24 (3 tile rows; 12 tiles a row: a group and a half)"},
      {1, 16, 16, 2, 16, true, "2x16 (one tile row: every input row but one is padding), with bias"},
      {2, 48, 32, 10, 40, false, "10x40 (20 tiles a row), 48 input channels"},
      {8, 32, 32, 32, 32, true, "batch 8 of 32x32 (several blocks of tile rows), with bias"},
  };
  Generator gen(41);
  for (const Case& s : cases) {
    const Tensor x = randn({s.n, s.c, s.h, s.w}, {}, &gen);
    const Tensor weight = randn({s.k, s.c, 3, 3}, {}, &gen);
    const Tensor bias = s.bias ? randn({s.k}, {}, &gen) : Tensor();
    const Tensor go = randn({s.n, s.k, s.h, s.w}, {}, &gen);
    const Tensor xr = x.to(kFloat64), wr = weight.to(kFloat64), br = s.bias ? bias.to(kFloat64) : Tensor();
    const Tensor gr = go.to(kFloat64);
    const Results got = run(x, weight, bias, go, s);
    Tensor dx, dw, dx_abs, dw_abs;
    reference_backward(gr, xr, wr, s, dx, dw);
    reference_backward(gr.abs(), xr.abs(), wr.abs(), s, dx_abs, dw_abs);
    const double rf = worst_ratio(got.y, reference_forward(xr, wr, br, s),
                                  reference_forward(xr.abs(), wr.abs(), s.bias ? br.abs() : Tensor(), s),
                                  s.c * 9 + (s.bias ? 1 : 0));
    const double rx = worst_ratio(got.dx, dx, dx_abs, s.k * 9);
    const double rw = worst_ratio(got.dw, dw, dw_abs, s.n * s.h * s.w);
    std::printf("%s: forward %.3g, data gradient %.3g, weight gradient %.3g of the bound\n", s.what, rf, rx, rw);
    INFO(s.what << ": forward " << rf << ", data gradient " << rx << ", weight gradient " << rw);
    CHECK(rf <= 1.0);
    CHECK(rx <= 1.0);
    CHECK(rw <= 1.0);
  }
}

TEST_CASE("Winograd convolutions give the same bits at 1 and 2 threads", "[cpu][conv]") {
  // Batch 8 of 32x32 at 32 channels: 128 tile rows in 4 blocks of 32; batch 16 of 8x8 at 128
  // channels: 64 paired tile rows in 2 blocks. 2 threads split the forward's blocks and the weight
  // gradient's two groups of blocks.
  const Case cases[] = {{8, 32, 32, 32, 32, true, "batch 8 of 32x32"}, {16, 128, 128, 8, 8, true, "batch 16 of 8x8"}};
  Generator gen(42);
  const int before = get_num_threads();
  for (const Case& s : cases) {
    INFO(s.what);
    const Tensor x = randn({s.n, s.c, s.h, s.w}, {}, &gen), weight = randn({s.k, s.c, 3, 3}, {}, &gen);
    const Tensor bias = randn({s.k}, {}, &gen), go = randn({s.n, s.k, s.h, s.w}, {}, &gen);
    set_num_threads(1);
    const Results one = run(x, weight, bias, go, s);
    set_num_threads(2);
    const Results two = run(x, weight, bias, go, s);
    CHECK(equal(one.y, two.y));
    CHECK(equal(one.dx, two.dx));
    CHECK(equal(one.dw, two.dw));
  }
  set_num_threads(before);
}

TEST_CASE("Winograd convolutions take channel counts in multiples of 16, even heights and widths in multiples of 8",
          "[cpu][conv]") {
  CHECK(wg::supports(16, 16, 2, 8));
  CHECK(wg::supports(64, 128, 56, 56));
  CHECK_FALSE(wg::supports(8, 16, 8, 8));    // 8 input channels
  CHECK_FALSE(wg::supports(16, 24, 8, 8));   // 24 output channels
  CHECK_FALSE(wg::supports(16, 16, 7, 8));   // odd height
  CHECK_FALSE(wg::supports(16, 16, 8, 12));  // width 12
  CHECK_FALSE(wg::supports(16, 16, 8, 4));   // width 4 (half a group would write past the row)
  CHECK_FALSE(wg::supports(16, 16, 0, 8));
}
