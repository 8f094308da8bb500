// Max pooling's backward without indices ([Max-pool arg-max], kernels/shared/pool_math.h) routes every
// output's gradient to the element the forward's indices name, bit for bit: on random inputs full of
// ties (small integers), NaNs and -inf, with padding, dilation and ceil_mode, in float32 and float64,
// on the cpu and on sim:0 (which runs the cpu kernels). The pooling entries also take channels-last
// tensors: the same numbers as NCHW, written in the caller's layout. And nn::functional::max_pool2d,
// which keeps x and its output instead of indices, gives a bfloat16 input the float32 gradient.
// On rows wide enough for the vectorized path, the forward (values and indices) and both backwards
// equal a plain reference written here.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/dispatch.h"
#include "nn/functional.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"
#include "tests/kernels/cpu/capabilities.h"

namespace chorus {
namespace {

using kernels::Window2d;

const std::vector<Device> kDevices = {Device::cpu(), Device::sim(0)};

struct Geometry {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  bool ceil;
};

// PyTorch's pooling output extent (as nn/functional/conv.cpp).
int64_t extent(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
  int64_t out = span / s + 1;
  if (ceil && (out - 1) * s >= in + p) --out;
  return out;
}

Window2d window(int64_t h, int64_t w, const Geometry& g) {
  Window2d win;
  win.in_h = h;
  win.in_w = w;
  win.kernel_h = g.kh;
  win.kernel_w = g.kw;
  win.stride_h = g.sh;
  win.stride_w = g.sw;
  win.pad_h = g.ph;
  win.pad_w = g.pw;
  win.dilation_h = g.dh;
  win.dilation_w = g.dw;
  win.out_h = extent(h, g.kh, g.ph, g.sh, g.dh, g.ceil);
  win.out_w = extent(w, g.kw, g.pw, g.sw, g.dw, g.ceil);
  return win;
}

const std::vector<Geometry> kGeometries = {
    {2, 2, 2, 2, 0, 0, 1, 1, false}, {3, 3, 2, 2, 1, 1, 1, 1, false}, {3, 2, 2, 3, 1, 1, 1, 1, true},
    {2, 2, 1, 1, 0, 1, 2, 2, false}, {3, 3, 1, 1, 1, 1, 2, 1, true},  {2, 2, 2, 2, 0, 0, 1, 1, true},
};

// Small integers (ties in most windows), about 6% NaN and 6% -inf, in float64.
std::vector<double> tie_heavy(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> v(0, 3), special(0, 15);
  std::vector<double> out(n);
  for (double& x : out) {
    const int s = special(rng);
    x = s == 0   ? std::numeric_limits<double>::quiet_NaN()
        : s == 1 ? -std::numeric_limits<double>::infinity()
        : s == 2 ? -0.0  // ties with 0: the first in row-major order is the one taken
                 : v(rng);
  }
  return out;
}

std::vector<double> values(const Tensor& t) {
  Tensor c = t.cpu().to(kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// Equal element for element, NaN equal to NaN.
void check_same(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  REQUIRE(x.size() == y.size());
  int64_t differ = 0;
  // Equal and of the same sign (a -0 where +0 was due is a different element taken), or both NaN.
  for (size_t i = 0; i < x.size(); ++i) {
    differ += !((std::isnan(x[i]) && std::isnan(y[i])) || (x[i] == y[i] && std::signbit(x[i]) == std::signbit(y[i])));
  }
  CHECK(differ == 0);
}

// The case a failure names: device, dtype and the window's geometry.
std::string describe(Device device, DType dtype, const Geometry& g) {
  std::ostringstream os;
  os << device.str() << " " << dtype_name(dtype) << " kernel " << g.kh << "x" << g.kw << " stride " << g.sh << "x"
     << g.sw << " pad " << g.ph << "x" << g.pw << " dilation " << g.dh << "x" << g.dw << " ceil " << g.ceil;
  return os.str();
}

// The body of the reference test below, in the vector variant in use.
void check_max_pool_against_reference() {
  std::mt19937 rng(35);
  const std::vector<Geometry> geometries = {
      {3, 3, 2, 2, 1, 1, 1, 1, false}, {2, 2, 2, 2, 0, 0, 1, 1, false}, {3, 3, 1, 1, 1, 1, 1, 1, false},
      {5, 5, 3, 3, 2, 2, 1, 1, true},  {3, 3, 2, 2, 1, 1, 2, 2, false}, {1, 4, 1, 3, 0, 1, 1, 1, true},
      {3, 3, 2, 2, 1, 1, 1, 3, true},
  };
  for (Device device : kDevices) {
    for (DType dtype : {kFloat32, kFloat64}) {
      for (const Geometry& g : geometries) {
        const int64_t n = 2, c = 2, h = 11, w = 45;
        const Window2d win = window(h, w, g);
        INFO(describe(device, dtype, g));
        const std::vector<double> xs = tie_heavy(n * c * h * w, rng);
        std::vector<double> gv(static_cast<size_t>(n * c * win.out_h * win.out_w));
        std::uniform_int_distribution<int> gd(1, 9);
        for (double& v : gv) v = gd(rng);
        // The reference, plane by plane.
        std::vector<double> want_out(gv.size()), want_gx(xs.size(), 0.0);
        std::vector<int64_t> want_idx(gv.size());
        for (int64_t p = 0; p < n * c; ++p) {
          for (int64_t oh = 0; oh < win.out_h; ++oh) {
            for (int64_t ow = 0; ow < win.out_w; ++ow) {
              double best = -std::numeric_limits<double>::infinity();
              int64_t best_i = -1, first = -1;
              for (int64_t i = 0; i < g.kh; ++i) {
                for (int64_t j = 0; j < g.kw; ++j) {
                  const int64_t ih = oh * g.sh - g.ph + i * g.dh, iw = ow * g.sw - g.pw + j * g.dw;
                  if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                  const int64_t at = ih * w + iw;
                  const double v = xs[p * h * w + at];
                  if (first < 0) first = at;
                  if (std::isnan(best)) continue;
                  if (std::isnan(v) || v > best) {
                    best = v;
                    best_i = at;
                  }
                }
              }
              REQUIRE(first >= 0);  // every window holds an element (PyTorch's extents)
              const int64_t o = (p * win.out_h + oh) * win.out_w + ow;
              want_out[o] = best;
              want_idx[o] = best_i >= 0 ? best_i : first;
              want_gx[p * h * w + want_idx[o]] += gv[o];
            }
          }
        }
        const Shape out_shape{n, c, win.out_h, win.out_w};
        const Tensor x = tensor(xs).reshape({n, c, h, w}).to(dtype).to(device);
        Tensor out = make_tensor(out_shape, dtype, device), idx = make_tensor(out_shape, kInt64, device);
        kernels::max_pool2d(out, idx, x, win);
        Tensor out2 = make_tensor(out_shape, dtype, device);
        kernels::max_pool2d(out2, Tensor(), x, win);
        const Tensor want = tensor(want_out).reshape(out_shape);
        check_same(out, want);
        check_same(out2, want);
        const Tensor idx_cpu = idx.cpu().contiguous();
        const int64_t* got_idx = idx_cpu.data_ptr<int64_t>();
        int64_t wrong_idx = 0;
        for (size_t i = 0; i < want_idx.size(); ++i) wrong_idx += got_idx[i] != want_idx[i];
        CHECK(wrong_idx == 0);
        const Tensor go = tensor(gv).reshape(out_shape).to(dtype).to(device);
        Tensor by_indices = make_tensor(x.sizes(), dtype, device), recomputed = make_tensor(x.sizes(), dtype, device);
        kernels::max_pool2d_backward(by_indices, go, idx, Tensor(), Tensor(), win);
        kernels::max_pool2d_backward(recomputed, go, Tensor(), x, out, win);
        const Tensor want_grad = tensor(want_gx).reshape({n, c, h, w});
        check_same(by_indices, want_grad);
        check_same(recomputed, want_grad);
      }
    }
  }
}

}  // namespace

TEST_CASE("max_pool2d_backward without indices routes the gradient where the indices do", "[kernels][pool]") {
  std::mt19937 rng(31);
  for (Device device : kDevices) {
    for (DType dtype : {kFloat32, kFloat64}) {
      for (const Geometry& g : kGeometries) {
        const int64_t n = 2, c = 3, h = 9, w = 8;
        const Window2d win = window(h, w, g);
        INFO(describe(device, dtype, g));
        const Tensor x = tensor(tie_heavy(n * c * h * w, rng)).reshape({n, c, h, w}).to(dtype).to(device);
        const Shape out_shape{n, c, win.out_h, win.out_w};
        Tensor out = make_tensor(out_shape, dtype, device), idx = make_tensor(out_shape, kInt64, device);
        kernels::max_pool2d(out, idx, x, win);
        // Without indices: the same outputs.
        Tensor out2 = make_tensor(out_shape, dtype, device);
        kernels::max_pool2d(out2, Tensor(), x, win);
        check_same(out2, out);
        // A gradient of small integers: the sums are exact, so any misrouting shows.
        std::vector<double> gv(out.numel());
        std::uniform_int_distribution<int> gd(1, 9);
        for (double& v : gv) v = gd(rng);
        const Tensor go = tensor(gv).reshape(out_shape).to(dtype).to(device);
        Tensor by_indices = make_tensor(x.sizes(), dtype, device), recomputed = make_tensor(x.sizes(), dtype, device);
        kernels::max_pool2d_backward(by_indices, go, idx, Tensor(), Tensor(), win);
        kernels::max_pool2d_backward(recomputed, go, Tensor(), x, out, win);
        check_same(recomputed, by_indices);
        // The gradient's total is grad_out's: every output routed somewhere inside its plane.
        CHECK(values(sum(recomputed))[0] == values(sum(go))[0]);

        // Channels-last operands: the same numbers, in channels-last tensors.
        const Tensor x_cl = x.contiguous(MemoryFormat::ChannelsLast);
        Tensor out_cl = make_tensor(out_shape, dtype, device, MemoryFormat::ChannelsLast);
        kernels::max_pool2d(out_cl, Tensor(), x_cl, win);
        CHECK(out_cl.is_contiguous(MemoryFormat::ChannelsLast));
        check_same(out_cl, out);
        Tensor gx_cl = make_tensor(x.sizes(), dtype, device, MemoryFormat::ChannelsLast);
        kernels::max_pool2d_backward(gx_cl, go.contiguous(MemoryFormat::ChannelsLast), Tensor(), x_cl, out_cl, win);
        CHECK(gx_cl.is_contiguous(MemoryFormat::ChannelsLast));
        check_same(gx_cl, by_indices);
      }
    }
  }
}

// [Vectorized max pool] (kernels/cpu/pool.cpp): rows wide enough that most outputs take the vector
// path, against a reference written here: each window's first maximum in row-major order, the
// first NaN where there is one, and the backward's gradient summed at those elements.
TEST_CASE("max_pool2d matches a plain reference on wide rows, ties, NaN and -inf included", "[kernels][pool]") {
  // In each vector variant this CPU runs (AVX2; AVX-512 where present): simd_for is built for both.
  testing::CapabilityGuard guard;
  for (kernels::cpu::CpuCapability cap : testing::available_capabilities()) {
    kernels::cpu::set_cpu_capability(cap);
    INFO("loops: " << (cap == kernels::cpu::CpuCapability::kAvx512 ? "avx512" : "avx2"));
    check_max_pool_against_reference();
  }
}

TEST_CASE("avg and adaptive-avg pooling kernels take channels-last tensors", "[kernels][pool]") {
  Generator gen(32);
  for (Device device : kDevices) {
    const Tensor x = randn({2, 5, 9, 7}, {.dtype = kFloat64}, &gen).to(device);
    const Tensor x_cl = x.contiguous(MemoryFormat::ChannelsLast);
    for (bool include : {true, false}) {
      const Window2d win = window(9, 7, {3, 3, 2, 2, 1, 1, 1, 1, true});
      const Shape out_shape{2, 5, win.out_h, win.out_w};
      Tensor out = make_tensor(out_shape, kFloat64, device);
      Tensor out_cl = make_tensor(out_shape, kFloat64, device, MemoryFormat::ChannelsLast);
      kernels::avg_pool2d(out, x, win, include);
      kernels::avg_pool2d(out_cl, x_cl, win, include);
      check_same(out_cl, out);
      const Tensor go = randn(out_shape, {.dtype = kFloat64}, &gen).to(device);
      Tensor gx = make_tensor(x.sizes(), kFloat64, device);
      Tensor gx_cl = make_tensor(x.sizes(), kFloat64, device, MemoryFormat::ChannelsLast);
      kernels::avg_pool2d_backward(gx, go, win, include);
      kernels::avg_pool2d_backward(gx_cl, go.contiguous(MemoryFormat::ChannelsLast), win, include);
      CHECK(gx_cl.is_contiguous(MemoryFormat::ChannelsLast));
      check_same(gx_cl, gx);
    }
    Tensor out = make_tensor({2, 5, 4, 3}, kFloat64, device);
    Tensor out_cl = make_tensor({2, 5, 4, 3}, kFloat64, device, MemoryFormat::ChannelsLast);
    kernels::adaptive_avg_pool2d(out, x, 9, 7, 4, 3);
    kernels::adaptive_avg_pool2d(out_cl, x_cl, 9, 7, 4, 3);
    check_same(out_cl, out);
    const Tensor go = randn({2, 5, 4, 3}, {.dtype = kFloat64}, &gen).to(device);
    Tensor gx = make_tensor(x.sizes(), kFloat64, device);
    Tensor gx_cl = make_tensor(x.sizes(), kFloat64, device, MemoryFormat::ChannelsLast);
    kernels::adaptive_avg_pool2d_backward(gx, go, 9, 7, 4, 3);
    kernels::adaptive_avg_pool2d_backward(gx_cl, go.contiguous(MemoryFormat::ChannelsLast), 9, 7, 4, 3);
    check_same(gx_cl, gx);
  }
}

TEST_CASE("max_pool2d keeps only x for backward: a bfloat16 input gets the float32 gradient",
          "[nn][pool]") {
  namespace F = nn::functional;
  std::mt19937 rng(33);
  // bfloat16 values (small integers and NaN are exact in it), so both inputs hold the same numbers.
  const Tensor base = tensor(tie_heavy(2 * 4 * 10 * 10, rng)).reshape({2, 4, 10, 10});
  for (bool channels_last : {false, true}) {
    Tensor xb = base.to(kBFloat16), xf = base.to(kFloat32);
    if (channels_last) {
      xb = xb.contiguous(MemoryFormat::ChannelsLast);
      xf = xf.contiguous(MemoryFormat::ChannelsLast);
    }
    xb.requires_grad_();
    xf.requires_grad_();
    const Tensor yb = F::max_pool2d(xb, {3, 3}, F::Pair{2, 2}, {1, 1});
    const Tensor yf = F::max_pool2d(xf, {3, 3}, F::Pair{2, 2}, {1, 1});
    CHECK(yb.dtype() == kBFloat16);
    CHECK(yb.is_contiguous(channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous));
    check_same(yb, yf);
    const Tensor g = tensor(std::vector<double>(yf.numel(), 1.0)).reshape(yf.sizes());
    sum(mul(yb.to(kFloat32), g.to(kFloat32))).backward();
    sum(mul(yf, g.to(kFloat32))).backward();
    check_same(xb.grad(), xf.grad());
  }
}

// [Max pool saves x only] (nn/functional/conv.cpp): the output is not saved, so it may be modified in
// place before backward (as in PyTorch, which saves indices); the gradient is that of the pooling.
TEST_CASE("max_pool2d's output may be modified in place before backward", "[nn][pool]") {
  namespace F = nn::functional;
  Generator gen(34);
  for (Device device : {Device::cpu(), Device::sim(0)}) {
    INFO(device.str());
    const Tensor base = randn({2, 3, 9, 9}, {}, &gen);
    Tensor x = base.to(device).requires_grad_(), x_ref = base.to(device).requires_grad_();
    Tensor y = F::max_pool2d(x, {3, 3}, F::Pair{2, 2}, {1, 1});
    y.relu_();  // in place on the pooled output
    sum(y).backward();
    Tensor y_ref = relu(F::max_pool2d(x_ref, {3, 3}, F::Pair{2, 2}, {1, 1}));
    sum(y_ref).backward();
    CHECK(equal(x.grad().cpu(), x_ref.grad().cpu()));
    CHECK(sum(x.grad()).item<float>() > 0);  // some windows' maxima are positive
  }
}

}  // namespace chorus
