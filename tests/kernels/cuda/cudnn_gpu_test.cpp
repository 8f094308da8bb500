// conv2d on CUDA through cuDNN against the CPU convolution, on random inputs: forward and the three
// backward products for grouped, strided, padded and dilated windows in float32 (TF32 off) and
// float64; channels-last (NHWC) tensors straight through the kernel; deterministic mode giving
// bit-identical gradients run to run; the algorithm cache filled once per shape and direction; a
// zero workspace limit still finding an algorithm; cuDNN off falling back to the direct kernels.
// batch_norm (cudnn_bn.cpp) through nn::functional::batch_norm against the CPU: training (output,
// running statistics, input and parameter gradients) and eval, NCHW, channels-last and [N, C] inputs,
// float32/float64 and float16/bfloat16 data with float32 parameters, no affine parameters, cuDNN on
// and off (chorus's own kernels, including the channels-last rows path).
// Pooling (cudnn_pool.cpp) through nn::functional against the CPU: max, avg with and without padding
// counted, uniform and non-uniform adaptive avg, and cases the plan sends to chorus's own kernels
// (ceil_mode past the input, dilation), forward and input gradient, NCHW and channels-last, float32
// and bfloat16, cuDNN on and off; NaN propagation of max pooling; deterministic max backward.
// Tagged "gpu": needs a CUDA device, and fails (not skips) without one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "kernels/cuda/cudnn_plan.h"
#include "kernels/cuda/device.h"
#include "kernels/dispatch.h"
#include "nn/functional.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus {
namespace {

namespace F = nn::functional;
namespace cp = kernels::cudnn_plan;
const Device kGpu = Device::cuda(0);

struct Settings {  // restores the cuDNN settings a test changes
  bool tf32 = cuda::cudnn_allow_tf32(), det = cuda::cudnn_deterministic(), on = cuda::cudnn_enabled();
  int64_t ws = cuda::cudnn_workspace_limit();
  ~Settings() {
    cuda::set_cudnn_allow_tf32(tf32);
    cuda::set_cudnn_deterministic(det);
    cuda::set_cudnn_enabled(on);
    cuda::set_cudnn_workspace_limit(ws);
  }
};

double rel_diff(const Tensor& gpu, const Tensor& cpu) {
  const Tensor a = gpu.cpu().to(kFloat64), b = cpu.to(kFloat64);
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

struct Case {
  int64_t n, cin, cout, h, w, k, stride, pad, dilation, groups;
};

// Forward and gradients of conv2d (through the op layer) on `device`; a channels-last input makes the
// convolution channels-last (and a 1x1 weight is both layouts at once: its strides differ from the
// channels-last gradient's only in dimensions of size 1).
std::vector<Tensor> run(const Case& c, DType dtype, Device device, uint64_t seed, bool channels_last = false) {
  manual_seed(seed);
  Tensor x = randn({c.n, c.cin, c.h, c.w}, {.dtype = dtype}).to(device);
  if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  Tensor w = randn({c.cout, c.cin / c.groups, c.k, c.k}, {.dtype = dtype}).to(device).requires_grad_();
  Tensor b = randn({c.cout}, {.dtype = dtype}).to(device).requires_grad_();
  Tensor y = F::conv2d(x, w, b, {c.stride, c.stride}, {c.pad, c.pad}, {c.dilation, c.dilation}, c.groups);
  Tensor g = randn(y.sizes(), {.dtype = dtype}).to(device);
  sum(mul(y, g)).backward();
  return {y, x.grad(), w.grad(), b.grad()};
}

const std::vector<Case> kCases = {
    {2, 3, 8, 16, 16, 3, 1, 1, 1, 1},   {4, 16, 32, 14, 14, 3, 2, 1, 1, 1}, {2, 8, 8, 9, 11, 3, 1, 2, 2, 1},
    {3, 12, 12, 10, 10, 3, 1, 1, 1, 4}, {2, 32, 32, 7, 7, 3, 1, 1, 1, 32}, {8, 64, 64, 8, 8, 1, 1, 0, 1, 1},
    {2, 4, 6, 15, 15, 5, 3, 2, 1, 2},
};

struct BnCase {
  Shape shape;
  bool channels_last, affine;
};

// batch_norm forward and backward through the op layer on `device`: {y, running_mean, running_var,
// dx, dweight, dbias} (the last two undefined without affine parameters), and y's layout.
std::vector<Tensor> run_bn(const BnCase& c, DType dtype, bool training, Device device, uint64_t seed) {
  manual_seed(seed);
  const int64_t ch = c.shape[1];
  const DType pd = dtype == kFloat16 || dtype == kBFloat16 ? kFloat32 : dtype;
  // An offset and a scale per tensor, so that the mean and variance matter.
  Tensor x = (randn(c.shape) * 1.5 + 0.75).to(dtype).to(device);
  if (c.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  Tensor w, b;
  if (c.affine) {
    w = (randn({ch}) * 0.5 + 1.0).to(pd).to(device).requires_grad_();
    b = randn({ch}).to(pd).to(device).requires_grad_();
  }
  Tensor rm = (randn({ch}) * 0.1).to(pd).to(device), rv = (rand({ch}) + 0.5).to(pd).to(device);
  Tensor y = F::batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
  Tensor g = randn(c.shape).to(dtype).to(device);
  sum(mul(y.to(kFloat32), g.to(kFloat32))).backward();
  return {y, rm, rv, x.grad(), c.affine ? w.grad() : Tensor(), c.affine ? b.grad() : Tensor()};
}

const std::vector<BnCase> kBnCases = {
    {{4, 8, 7, 9}, false, true},     // NCHW, per-channel kernels / cuDNN NCHW
    {{4, 16, 5, 6}, true, true},     // channels-last: rows of 16 channels, s == 1
    {{8, 40, 24, 24}, true, true},   // channels-last, many rows (several bands), c not a multiple of 32
    {{64, 12}, false, true},         // BatchNorm1d's [N, C]: also s == 1
    {{6, 10, 4, 4}, true, false},    // no weight and bias (ones/zeros for cuDNN)
    {{3, 5, 11, 2}, false, false},
};

struct PoolCase {
  const char* name;
  Shape shape;
  std::function<Tensor(const Tensor&)> fn;
};

const std::vector<PoolCase> kPoolCases = {
    {"max 3x3 s2 p1", {4, 16, 15, 14}, [](const Tensor& x) { return F::max_pool2d(x, {3, 3}, F::Pair{2, 2}, {1, 1}); }},
    {"max 2x2", {2, 8, 12, 10}, [](const Tensor& x) { return F::max_pool2d(x, {2, 2}); }},
    {"max 3x2 s(2,1) p(1,0)", {2, 5, 9, 11},
     [](const Tensor& x) { return F::max_pool2d(x, {3, 2}, F::Pair{2, 1}, {1, 0}); }},
    {"max ceil_mode past the input (own kernel)", {2, 6, 8, 8},
     [](const Tensor& x) { return F::max_pool2d(x, {3, 3}, F::Pair{2, 2}, {0, 0}, {1, 1}, true); }},
    {"max dilation 2 (own kernel)", {2, 6, 11, 11},
     [](const Tensor& x) { return F::max_pool2d(x, {3, 3}, F::Pair{1, 1}, {1, 1}, {2, 2}); }},
    {"avg 3x3 s2 p1 count_include_pad", {3, 8, 13, 12},
     [](const Tensor& x) { return F::avg_pool2d(x, {3, 3}, F::Pair{2, 2}, {1, 1}, false, true); }},
    {"avg 3x3 s2 p1 exclude pad", {3, 8, 13, 12},
     [](const Tensor& x) { return F::avg_pool2d(x, {3, 3}, F::Pair{2, 2}, {1, 1}, false, false); }},
    {"avg ceil_mode past the input (own kernel)", {2, 4, 8, 9},
     [](const Tensor& x) { return F::avg_pool2d(x, {3, 3}, F::Pair{2, 2}, {1, 1}, true, true); }},
    {"adaptive 12x12 -> 3x4 (uniform)", {2, 16, 12, 12}, [](const Tensor& x) { return F::adaptive_avg_pool2d(x, {3, 4}); }},
    {"adaptive 7x7 -> 1x1 (global)", {4, 32, 7, 7}, [](const Tensor& x) { return F::adaptive_avg_pool2d(x, {1, 1}); }},
    {"adaptive 10x9 -> 4x3 (non-uniform, own kernel)", {2, 6, 10, 9},
     [](const Tensor& x) { return F::adaptive_avg_pool2d(x, {4, 3}); }},
};

// An input whose planes hold distinct values (no ties for max pooling to break differently), exact in
// bfloat16: a shuffled range of integers per plane, scaled by 1/8, centred on zero.
Tensor distinct_input(const Shape& shape, uint64_t seed) {
  const int64_t plane = shape[2] * shape[3], planes = shape[0] * shape[1];
  std::mt19937 rng(seed);
  std::vector<double> v(planes * plane);
  for (int64_t p = 0; p < planes; ++p) {
    std::iota(v.begin() + p * plane, v.begin() + (p + 1) * plane, -static_cast<double>(plane / 2));
    std::shuffle(v.begin() + p * plane, v.begin() + (p + 1) * plane, rng);
  }
  for (double& x : v) x /= 8.0;
  return tensor(v).reshape(shape);
}

// Pooling forward and input gradient through the op layer on `device`: {y, dx}.
std::vector<Tensor> run_pool(const PoolCase& c, DType dtype, bool channels_last, Device device, uint64_t seed) {
  Tensor x = distinct_input(c.shape, seed).to(dtype).to(device);
  if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  const Tensor y = c.fn(x);
  manual_seed(seed + 1);
  const Tensor g = randn(y.sizes()).to(device);
  sum(mul(y.to(kFloat32), g)).backward();
  return {y, x.grad()};
}

}  // namespace

TEST_CASE("CUDA pooling (cuDNN and chorus's kernels) equals the CPU's", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  for (bool on : {true, false}) {
    cuda::set_cudnn_enabled(on);
    for (DType dtype : {kFloat32, kBFloat16}) {
      // bfloat16: the CPU averages in float32 and rounds once; cuDNN (float accumulation) may round
      // the other way; the gradients are float32 sums of bfloat16 shares.
      const double tol = dtype == kFloat32 ? 1e-5 : 1e-2;
      for (bool channels_last : {false, true}) {
        for (const PoolCase& c : kPoolCases) {
          INFO("cuDNN " << (on ? "on " : "off ") << dtype_name(dtype) << (channels_last ? " channels-last " : " NCHW ")
                        << c.name << " " << shape_str(c.shape));
          const auto gpu = run_pool(c, dtype, channels_last, kGpu, 41);
          const auto cpu = run_pool(c, dtype, channels_last, Device::cpu(), 41);
          CHECK(gpu[0].dtype() == dtype);
          CHECK(rel_diff(gpu[0], cpu[0]) < tol);
          CHECK(rel_diff(gpu[1], cpu[1]) < tol);
          if (channels_last) {
            CHECK(gpu[0].is_contiguous(MemoryFormat::ChannelsLast));
            CHECK(gpu[1].is_contiguous(MemoryFormat::ChannelsLast));
          }
        }
      }
    }
  }
}

TEST_CASE("cuDNN max pooling propagates NaN as the CPU does; deterministic backward repeats", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  cuda::set_cudnn_enabled(true);
  Tensor x = distinct_input({2, 4, 9, 9}, 51);
  double* p = x.data_ptr<double>();
  for (int64_t i = 0; i < x.numel(); i += 37) p[i] = std::nan("");
  for (bool channels_last : {false, true}) {
    const Tensor xin = channels_last ? x.contiguous(MemoryFormat::ChannelsLast) : x;
    const Tensor cpu = F::max_pool2d(xin, {3, 3}, F::Pair{2, 2}, {1, 1});
    const Tensor gpu = F::max_pool2d(xin.to(kGpu), {3, 3}, F::Pair{2, 2}, {1, 1}).cpu();
    const Tensor c = cpu.contiguous(), g = gpu.contiguous();
    const double *pc = c.data_ptr<double>(), *pg = g.data_ptr<double>();
    int64_t differ = 0;
    for (int64_t i = 0; i < c.numel(); ++i) differ += !((std::isnan(pc[i]) && std::isnan(pg[i])) || pc[i] == pg[i]);
    CHECK(differ == 0);
  }
  // Overlapping windows (stride 1): deterministic mode gives bit-identical gradients run to run.
  cuda::set_cudnn_deterministic(true);
  auto grad = [] {
    Tensor xg = distinct_input({4, 8, 16, 16}, 52).to(kFloat32).to(kGpu).requires_grad_();
    manual_seed(53);
    sum(mul(F::max_pool2d(xg, {3, 3}, F::Pair{1, 1}, {1, 1}), randn({4, 8, 16, 16}).to(kGpu))).backward();
    return xg.grad().cpu();
  };
  CHECK(equal(grad(), grad()));
}

TEST_CASE("CUDA batch_norm (cuDNN and chorus's kernels) equals the CPU's", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  for (bool on : {true, false}) {
    cuda::set_cudnn_enabled(on);
    for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
      // Values as stored: 16-bit outputs differ by a rounding of the 16-bit type; parameters and
      // statistics are float32 sums of the same 16-bit inputs.
      const double tol_out = dtype == kFloat32 ? 1e-5 : dtype == kFloat64 ? 1e-10 : dtype == kFloat16 ? 4e-3 : 2e-2;
      const double tol_param = dtype == kFloat32 ? 1e-5 : dtype == kFloat64 ? 1e-10 : 2e-3;
      for (bool training : {true, false}) {
        for (const BnCase& c : kBnCases) {
          INFO("cuDNN " << (on ? "on" : "off") << " " << dtype_name(dtype) << (training ? " training " : " eval ")
                        << shape_str(c.shape) << (c.channels_last ? " channels-last" : "")
                        << (c.affine ? "" : " no affine"));
          const auto gpu = run_bn(c, dtype, training, kGpu, 21), cpu = run_bn(c, dtype, training, Device::cpu(), 21);
          const char* names[] = {"y", "running_mean", "running_var", "dx", "dweight", "dbias"};
          for (int i = 0; i < 6; ++i) {
            INFO(names[i]);
            REQUIRE(gpu[i].defined() == cpu[i].defined());
            if (!gpu[i].defined()) continue;
            CHECK(gpu[i].dtype() == cpu[i].dtype());
            CHECK(rel_diff(gpu[i], cpu[i]) < (i == 0 || i == 3 ? tol_out : tol_param));
          }
          // The layout is kept: a channels-last input gives a channels-last output and gradient.
          if (c.channels_last) {
            CHECK(gpu[0].is_contiguous(MemoryFormat::ChannelsLast));
            CHECK(gpu[3].is_contiguous(MemoryFormat::ChannelsLast));
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA batch_norm with eps = 0, cuDNN 9's minimum, equals the CPU", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  cuda::set_cudnn_enabled(true);
  // eps = 0 is cuDNN 9's minimum (CUDNN_BN_MIN_EPSILON): cuDNN runs it; a batch with non-zero variance
  // stays finite and equals the CPU.
  manual_seed(5);
  const Tensor x = randn({4, 6, 5, 5}) + 2.0;
  const Tensor rm = zeros({6}), rv = ones({6});
  const Tensor cpu = F::batch_norm(x, rm.clone(), rv.clone(), Tensor(), Tensor(), true, 0.1, 0.0);
  const Tensor gpu = F::batch_norm(x.to(kGpu), rm.to(kGpu), rv.to(kGpu), Tensor(), Tensor(), true, 0.1, 0.0);
  CHECK(rel_diff(gpu, cpu) < 1e-5);
}

TEST_CASE("cuDNN conv2d forward and backward equal the CPU's", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  cuda::set_cudnn_allow_tf32(false);
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Case& c : kCases) {
      for (bool cl : {false, true}) {
        INFO(dtype_name(dtype) << (cl ? " channels-last" : " NCHW") << " n " << c.n << " cin " << c.cin << " cout " << c.cout << " " << c.h << "x" << c.w
                               << " k " << c.k << " stride " << c.stride << " pad " << c.pad << " dilation "
                               << c.dilation << " groups " << c.groups);
        const auto gpu = run(c, dtype, kGpu, 11, cl), cpu = run(c, dtype, Device::cpu(), 11, cl);
        const double tol = dtype == kFloat32 ? 1e-5 : 1e-12;
        for (int i = 0; i < 4; ++i) {
          INFO("output " << i << " (y, dx, dw, db)");
          CHECK(rel_diff(gpu[i], cpu[i]) < tol);
        }
      }
    }
  }
}

TEST_CASE("cuDNN conv2d takes channels-last tensors as they are", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  cuda::set_cudnn_allow_tf32(false);
  manual_seed(3);
  const Tensor x = randn({4, 16, 12, 12}), w = randn({24, 16, 3, 3}), b = randn({24});
  const Tensor expected = F::conv2d(x, w, b, {1, 1}, {1, 1});
  // NHWC memory, NCHW sizes (as PyTorch's channels_last): permute a dense NHWC tensor.
  auto nhwc = [](const Tensor& t) { return t.permute({0, 2, 3, 1}).contiguous().to(kGpu).permute({0, 3, 1, 2}); };
  const Tensor xg = nhwc(x), wg = nhwc(w), bg = b.to(kGpu);
  REQUIRE(cp::is_channels_last(xg.sizes(), xg.strides()));
  const Tensor yg = nhwc(zeros(expected.sizes()));
  kernels::Window2d win;
  win.in_h = win.in_w = 12;
  win.out_h = win.out_w = 12;
  win.kernel_h = win.kernel_w = 3;
  win.pad_h = win.pad_w = 1;
  kernels::conv2d(yg, xg, wg, bg, win, 1);
  CHECK(cp::is_channels_last(yg.sizes(), yg.strides()));
  CHECK(rel_diff(yg.contiguous(), expected) < 1e-5);
}

// float32 with TF32 (the default) keeps float32's range: inputs past float16's largest value
// (65504) and output gradients below its smallest (6e-8) come through. Until 2026-12-04 the
// descriptor allowed CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, under which cuDNN may convert float32
// data to float16 (inf and 0 there). TF32 keeps 10 mantissa bits: 2e-2 relative against the CPU.
TEST_CASE("cuDNN conv2d in float32 with TF32 keeps float32's range", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  cuda::set_cudnn_allow_tf32(true);
  for (bool cl : {false, true}) {
    INFO((cl ? "channels-last" : "NCHW"));
    auto run_scaled = [&](Device device) {
      manual_seed(21);
      Tensor x = mul(randn({8, 64, 14, 14}), 1e5).to(device);
      if (cl) x = x.contiguous(MemoryFormat::ChannelsLast);
      x.requires_grad_();
      Tensor w = randn({64, 64, 3, 3}).to(device);
      if (cl) w = w.contiguous(MemoryFormat::ChannelsLast);
      w.requires_grad_();
      Tensor y = F::conv2d(x, w, Tensor(), {1, 1}, {1, 1});
      Tensor g = mul(randn(y.sizes()), 1e-9).to(device);
      sum(mul(y, g)).backward();
      return std::vector<Tensor>{y, x.grad(), w.grad()};
    };
    const auto gpu = run_scaled(kGpu), cpu = run_scaled(Device::cpu());
    for (int i = 0; i < 3; ++i) {
      INFO("output " << i << " (y, dx, dw)");
      CHECK(all(isfinite(gpu[i].cpu())).item<bool>());
      CHECK(rel_diff(gpu[i], cpu[i]) < 2e-2);
    }
  }
}

TEST_CASE("cuDNN: deterministic mode, the algorithm cache, workspace limits, the fallback", "[cuda][cudnn][gpu]") {
  cuda::require_device("cudnn_gpu_test");
  Settings keep;
  const Case c{8, 32, 32, 16, 16, 3, 1, 1, 1, 1};
  cuda::set_cudnn_deterministic(true);
  const auto a = run(c, kFloat32, kGpu, 5), b = run(c, kFloat32, kGpu, 5);
  for (int i = 0; i < 4; ++i) CHECK(equal(a[i].cpu(), b[i].cpu()));
  // One search per (shape, direction): a new shape adds forward, backward-data and backward-filter.
  const size_t before = cp::AlgoCache::global().size();
  const Case fresh{3, 5, 7, 13, 13, 3, 1, 1, 1, 1};
  (void)run(fresh, kFloat32, kGpu, 1);
  CHECK(cp::AlgoCache::global().size() == before + 3);
  (void)run(fresh, kFloat32, kGpu, 2);
  CHECK(cp::AlgoCache::global().size() == before + 3);
  // No workspace at all: cuDNN still has algorithms that need none.
  cuda::set_cudnn_deterministic(false);
  cuda::set_cudnn_workspace_limit(0);
  const Case small{2, 6, 6, 9, 9, 3, 1, 1, 1, 1};
  const auto none = run(small, kFloat64, kGpu, 4), cpu = run(small, kFloat64, Device::cpu(), 4);
  for (int i = 0; i < 4; ++i) CHECK(rel_diff(none[i], cpu[i]) < 1e-12);
  // A shape searched under the 1 GiB limit, run again with none: the cached choice is used only if
  // it needs no workspace (else searched again), and the values stay right.
  cuda::set_cudnn_workspace_limit(int64_t{1} << 30);
  (void)run(c, kFloat32, kGpu, 6);
  cuda::set_cudnn_workspace_limit(0);
  const auto again = run(c, kFloat32, kGpu, 6), again_cpu = run(c, kFloat32, Device::cpu(), 6);
  for (int i = 0; i < 4; ++i) CHECK(rel_diff(again[i], again_cpu[i]) < 2e-2);  // TF32
  for (const auto& [key, choice] : cp::AlgoCache::global().entries())
    if (key.x_dims == std::array<int, 4>{8, 32, 16, 16} && !key.deterministic) CHECK(choice.workspace == 0);
  // cuDNN off: the direct kernels give the same results.
  cuda::set_cudnn_enabled(false);
  const auto direct = run(small, kFloat64, kGpu, 4);
  for (int i = 0; i < 4; ++i) CHECK(rel_diff(direct[i], cpu[i]) < 1e-12);
}

}  // namespace chorus
