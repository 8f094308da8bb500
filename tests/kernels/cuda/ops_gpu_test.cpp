// The CUDA kernel table against the CPU kernels: every op on cuda:0 and on the CPU, on the same random
// inputs (made on the CPU, then moved), compared after .cpu(): float32 within 1e-5 relative, TF32
// matmul within 1e-3, exact where the arithmetic is (copies, casts, integer ops, uniform/randint
// draws). Also strided and broadcast operands, a > 2^31-element tensor, copies between host, device
// and streams, gradients of composite expressions, and 20 training steps of an MLP (SGD and Adam).
// Tagged "gpu": needs a CUDA device, and fails (not skips) without one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cublas.h"
#include "kernels/cuda/cudnn_plan.h"
#include "kernels/cuda/device.h"
#include "nn/functional.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus {
namespace {

namespace F = nn::functional;
const Device kGpu = Device::cuda(0);

// TF32 off for the scope (exact float32 GEMMs), restoring the previous setting.
struct NoTf32 {
  bool previous = cuda::allow_tf32();
  NoTf32() { cuda::set_allow_tf32(false); }
  ~NoTf32() { cuda::set_allow_tf32(previous); }
};

void require_gpu() {
  cuda::require_device("ops_gpu_test");  // throws "no CUDA device" without one: the test fails
}

// max |gpu - cpu| / max(max |finite cpu|, 1e-30) over all elements, in float64; equal values
// (infinities of one sign included) differ by 0; NaN where either has NaN in different places, or an
// infinity the other lacks (then every comparison below fails).
double rel_diff(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(cpu.device().is_cpu());
  REQUIRE(gpu.sizes() == cpu.sizes());
  REQUIRE(gpu.dtype() == cpu.dtype());
  const Tensor a = gpu.cpu().to(kFloat64), b = cpu.to(kFloat64);
  if (a.numel() == 0) return 0;
  const Tensor nan_a = ne(a, a), nan_b = ne(b, b);
  if (!equal(nan_a, nan_b)) return std::nan("");
  const Tensor alike = logical_or(nan_a, eq(a, b));
  const double diff = where(alike, zeros_like(a), a - b).abs().max().item<double>();
  const double scale = where(isfinite(b), b, zeros_like(b)).abs().max().item<double>();
  return diff / std::max(scale, 1e-30);
}

bool same(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.device() == kGpu);
  return gpu.dtype() == cpu.dtype() && equal(gpu.cpu(), cpu);
}

Tensor randn_cpu(const Shape& shape, uint64_t seed, DType dtype = kFloat32) {
  Generator g(seed);
  return randn(shape, {.dtype = dtype}, &g);
}

const std::vector<DType> kAllDtypes = {kBool, kUInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};

}  // namespace

TEST_CASE("cuda:0 is there and has the kernel table", "[cuda][gpu]") {
  require_gpu();
  CHECK(device_count(DeviceType::CUDA) >= 1);
  Tensor x = full({3}, 2.0, {.device = kGpu});
  CHECK(x.device() == kGpu);
  CHECK(same(x, full({3}, 2.0)));
  // Mixed devices are refused by the op layer, not run.
  CHECK_THROWS(add(x, full({3}, 1.0)));
}

TEST_CASE("copies: H2D, D2H, D2D, strided, broadcast, between streams", "[cuda][gpu]") {
  require_gpu();
  const Tensor x = randn_cpu({37, 53}, 3);
  const Tensor g = x.to(kGpu);  // H2D
  CHECK(g.device() == kGpu);
  CHECK(equal(g.cpu(), x));           // D2H
  CHECK(same(g.clone(), x));          // D2D, contiguous: cudaMemcpyAsync
  CHECK(same(t(g).contiguous(), t(x).contiguous()));                             // transposed source
  CHECK(same(slice(g, 1, 3, 50, 4).contiguous(), slice(x, 1, 3, 50, 4).contiguous()));  // stepped slice
  CHECK(same(expand(slice(g, 0, 0, 1), {5, 53}).contiguous(), expand(slice(x, 0, 0, 1), {5, 53}).contiguous()));
  // copy_ into a strided destination, from a broadcast source.
  Tensor dst_g = zeros({53, 37}, {.device = kGpu}), dst_c = zeros({53, 37});
  Tensor tg = t(dst_g), tc = t(dst_c);
  tg.copy_(slice(g, 1, 0, 53));
  tc.copy_(slice(x, 1, 0, 53));
  CHECK(same(dst_g, dst_c));
  Tensor row_g = zeros({4, 53}, {.device = kGpu});
  row_g.copy_(select(g, 0, 7));
  CHECK(same(row_g, expand(unsqueeze(select(x, 0, 7), 0), {4, 53}).contiguous()));

  // Between streams: a producer on a pool stream, the default stream ordered after it by an event.
  const Stream side = stream_from_pool(kGpu);
  const Stream main_stream = current_stream(kGpu);
  CHECK(main_stream != side);
  Event ready;  // g was written on the main stream: the side stream waits for it
  ready.record(main_stream);
  side.wait(ready);
  Tensor produced;
  Event done;
  {
    StreamGuard guard(side);
    produced = mul(g, 3.0);
    done.record(side);
  }
  main_stream.wait(done);
  Tensor consumed = add(produced, 1.0);  // on the current (default) stream
  CHECK(rel_diff(consumed, add(mul(x, 3.0), 1.0)) <= 1e-6);
}

TEST_CASE("casts among all dtypes equal the CPU's, bit for bit", "[cuda][gpu]") {
  require_gpu();
  Generator gen(4);
  // Values in [0, 200) with fractions: every cast path is exercised. (No negative values: a negative
  // float cast to uint8 is undefined behaviour in C++, and x86 and the GPU do differ there.)
  const Tensor base = mul(rand({7, 11}, {}, &gen), 200.0);
  for (DType from : kAllDtypes) {
    const Tensor src = base.to(from);
    const Tensor src_g = src.to(kGpu);
    for (DType to : kAllDtypes) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      CHECK(same(src_g.to(to), src.to(to)));                     // contiguous
      CHECK(same(t(src_g).to(to), t(src).to(to)));               // transposed (strided)
    }
  }
  // Negative and out-of-range floats to uint8 go through int64 on both devices (PyTorch's rule;
  // before, the GPU's saturating conversion gave 0 for -1.5 where the CPU gave 255).
  const Tensor wide = tensor(std::vector<double>{-1.0, -1.5, -200.7, 300.0, 255.9, 0.5, -0.5});
  for (DType from : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    INFO(dtype_name(from) << " -> uint8, negative and past 255");
    CHECK(same(wide.to(from).to(kGpu).to(kUInt8), wide.to(from).to(kUInt8)));
  }
}

TEST_CASE("fill and arange", "[cuda][gpu]") {
  require_gpu();
  for (DType d : kAllDtypes) {
    INFO(dtype_name(d));
    CHECK(same(full({3, 5}, 1.0, {.dtype = d, .device = kGpu}), full({3, 5}, 1.0, {.dtype = d})));
  }
  CHECK(same(arange(0.5, 100.0, 0.37, TensorOptions{.dtype = kFloat64, .device = kGpu}),
             arange(0.5, 100.0, 0.37, TensorOptions{.dtype = kFloat64})));
  CHECK(same(arange(1000, TensorOptions{.dtype = kInt64, .device = kGpu}), arange(1000, TensorOptions{.dtype = kInt64})));
  Tensor z = randn_cpu({6, 8}, 5).to(kGpu);
  Tensor zt = t(z);
  zt.fill_(2.5);  // strided fill
  CHECK(same(z, full({6, 8}, 2.5)));
}

TEST_CASE("unary, pow, clamp on strided inputs within 1e-5", "[cuda][gpu]") {
  require_gpu();
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"neg", [](const Tensor& a) { return neg(a); }},
      {"abs", [](const Tensor& a) { return abs(a); }},
      {"exp", [](const Tensor& a) { return exp(a); }},
      {"log", [](const Tensor& a) { return log(add(abs(a), 0.1)); }},
      {"log1p", [](const Tensor& a) { return log1p(abs(a)); }},
      {"sqrt", [](const Tensor& a) { return sqrt(abs(a)); }},
      {"rsqrt", [](const Tensor& a) { return rsqrt(add(abs(a), 0.1)); }},
      {"tanh", [](const Tensor& a) { return tanh(a); }},
      {"sigmoid", [](const Tensor& a) { return sigmoid(a); }},
      {"relu", [](const Tensor& a) { return relu(a); }},
      {"gelu", [](const Tensor& a) { return gelu(a); }},
      {"gelu_tanh", [](const Tensor& a) { return gelu(a, "tanh"); }},
      {"sin", [](const Tensor& a) { return sin(a); }},
      {"cos", [](const Tensor& a) { return cos(a); }},
      {"expm1", [](const Tensor& a) { return expm1(a); }},
      {"erf", [](const Tensor& a) { return erf(a); }},
      {"erfinv", [](const Tensor& a) { return erfinv(mul(tanh(a), 0.99)); }},
      {"log2", [](const Tensor& a) { return log2(add(abs(a), 0.1)); }},
      {"log10", [](const Tensor& a) { return log10(add(abs(a), 0.1)); }},
      {"floor", [](const Tensor& a) { return floor(mul(a, 3.0)); }},
      {"ceil", [](const Tensor& a) { return ceil(mul(a, 3.0)); }},
      {"round", [](const Tensor& a) { return round(mul(a, 3.0)); }},
      {"trunc", [](const Tensor& a) { return trunc(mul(a, 3.0)); }},
      {"sign", [](const Tensor& a) { return sign(a); }},
      {"pow 3", [](const Tensor& a) { return pow(a, 3); }},
      {"pow 2", [](const Tensor& a) { return pow(a, 2); }},
      {"pow 1.5", [](const Tensor& a) { return pow(abs(a), 1.5); }},
      {"clamp", [](const Tensor& a) { return clamp(a, -0.5, 0.7); }},
      {"clamp min", [](const Tensor& a) { return clamp(a, 0.1, std::nullopt); }},
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor x = t(randn_cpu({65, 129}, 6, dtype));  // transposed: strided
    const Tensor xg = x.to(kGpu);
    for (const auto& [name, op] : ops) {
      INFO(name << " " << dtype_name(dtype));
      CHECK(rel_diff(op(xg), op(x)) <= (dtype == kFloat32 ? 1e-5 : 1e-12));
    }
  }
  // Integers: exact.
  Generator gen(7);
  const Tensor xi = randint(-50, 50, {31, 17}, {.dtype = kInt64}, &gen);
  CHECK(same(abs(xi.to(kGpu)), abs(xi)));
  CHECK(same(pow(xi.to(kGpu), 3), pow(xi, 3)));
  CHECK(same(clamp(xi.to(kGpu), -10, 20), clamp(xi, -10, 20)));
  CHECK(same(logical_not(xi.to(kGpu)), logical_not(xi)));
  // bfloat16 through the op layer's float32 compute: within bf16 rounding.
  const Tensor xb = randn_cpu({40, 40}, 8).to(kBFloat16);
  CHECK(rel_diff(tanh(xb.to(kGpu)), tanh(xb)) <= 1e-2);
  CHECK(rel_diff(exp(xb.to(kGpu)), exp(xb)) <= 1e-2);
}

TEST_CASE("binary ops, comparisons, where with broadcast and strided operands", "[cuda][gpu]") {
  require_gpu();
  const Tensor a = randn_cpu({4, 1, 33}, 9), b = slice(randn_cpu({7, 66}, 10), 1, 0, 66, 2);  // b: [7, 33] strided
  const Tensor ag = a.to(kGpu), bg = b.to(kGpu);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"add", [](const Tensor& x, const Tensor& y) { return add(x, y); }},
      {"add alpha", [](const Tensor& x, const Tensor& y) { return add(x, y, 2.5); }},
      {"sub alpha", [](const Tensor& x, const Tensor& y) { return sub(x, y, -0.75); }},
      {"mul", [](const Tensor& x, const Tensor& y) { return mul(x, y); }},
      {"div", [](const Tensor& x, const Tensor& y) { return div(x, add(abs(y), 0.5)); }},
      {"maximum", [](const Tensor& x, const Tensor& y) { return maximum(x, y); }},
      {"minimum", [](const Tensor& x, const Tensor& y) { return minimum(x, y); }},
      {"pow", [](const Tensor& x, const Tensor& y) { return pow(abs(x), y); }},
  };
  for (const auto& [name, op] : ops) {
    INFO(name);
    CHECK(rel_diff(op(ag, bg), op(a, b)) <= 1e-5);
  }
  CHECK(same(lt(ag, bg), lt(a, b)));
  CHECK(same(ge(ag, bg), ge(a, b)));
  CHECK(same(eq(ag, ag), eq(a, a)));
  CHECK(same(ne(ag, bg), ne(a, b)));
  CHECK(same(logical_xor(gt(ag, 0.0), gt(bg, 0.0)), logical_xor(gt(a, 0.0), gt(b, 0.0))));
  CHECK(same(logical_and(gt(ag, 0.0), gt(bg, 0.0)), logical_and(gt(a, 0.0), gt(b, 0.0))));
  CHECK(same(where(gt(ag, bg), ag, bg), where(gt(a, b), a, b)));
  CHECK(same(where(gt(ag, 0.0), ag, 0.0), where(gt(a, 0.0), a, 0.0)));
  // Integer arithmetic: exact.
  Generator gen(11);
  const Tensor i1 = randint(-100, 100, {5, 9}, {.dtype = kInt32}, &gen), i2 = randint(1, 9, {9}, {.dtype = kInt32}, &gen);
  CHECK(same(mul(i1.to(kGpu), i2.to(kGpu)), mul(i1, i2)));
  CHECK(same(sub(i1.to(kGpu), i2.to(kGpu), 3), sub(i1, i2, 3)));
  CHECK(same(pow(i1.to(kGpu), i2.to(kGpu)), pow(i1, i2)));
  // In-place on a strided view.
  Tensor c = randn_cpu({8, 8}, 12), cg = c.to(kGpu);
  Tensor ct = t(c), cgt = t(cg);
  add_(ct, b.narrow(0, 0, 1).narrow(1, 0, 8));
  add_(cgt, bg.narrow(0, 0, 1).narrow(1, 0, 8));
  CHECK(rel_diff(cg, c) <= 1e-6);
}

TEST_CASE("reductions, arg-reductions, softmax", "[cuda][gpu]") {
  require_gpu();
  const Tensor x = permute(randn_cpu({6, 70, 9}, 13), {1, 0, 2});  // [70, 6, 9], not contiguous
  const Tensor xg = x.to(kGpu);
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1}}) {
    INFO("dims size " << dims.size() << (dims.empty() ? "" : " first " + std::to_string(dims[0])));
    CHECK(rel_diff(sum(xg, dims), sum(x, dims)) <= 1e-5);
    CHECK(rel_diff(sum(xg, dims, true), sum(x, dims, true)) <= 1e-5);
    CHECK(rel_diff(mean(xg, dims), mean(x, dims)) <= 1e-5);
    CHECK(same(amax(xg, dims), amax(x, dims)));
    CHECK(same(amin(xg, dims), amin(x, dims)));
  }
  CHECK(rel_diff(prod(add(xg, 2.0), 1), prod(add(x, 2.0), 1)) <= 1e-5);
  CHECK(rel_diff(var(xg, {0}), var(x, {0})) <= 1e-5);
  // A long row (one block) and a long column.
  const Tensor big = randn_cpu({3, 100000}, 14);
  CHECK(rel_diff(sum(big.to(kGpu), {1}), sum(big, {1})) <= 1e-5);
  CHECK(rel_diff(sum(t(big).to(kGpu), {0}), sum(t(big), {0})) <= 1e-5);
  // Integers and bool: exact, int64 sums.
  Generator gen(15);
  const Tensor xi = randint(-1000, 1000, {40, 50}, {.dtype = kInt32}, &gen);
  CHECK(same(sum(xi.to(kGpu), {0}), sum(xi, {0})));
  CHECK(same(amax(xi.to(kGpu), {1}), amax(xi, {1})));
  CHECK(same(sum(gt(xi, 0).to(kGpu)), sum(gt(xi, 0))));
  // max/min with indices, argmax with ties (first index wins).
  for (int64_t d : {0, 1, 2}) {
    INFO("dim " << d);
    auto [vg, ig] = max(xg, d);
    auto [vc, ic] = max(x, d);
    CHECK(same(vg, vc));
    CHECK(same(ig, ic));
    CHECK(same(argmin(xg, d), argmin(x, d)));
  }
  const Tensor ties = tensor<float>({1, 3, 3, 0, 3, 2}, Shape{2, 3});
  CHECK(same(argmax(ties.to(kGpu), 1), argmax(ties, 1)));
  CHECK(same(argmax(ties.to(kGpu)), argmax(ties)));
  for (int64_t d : {0, 1, 2}) {
    INFO("softmax dim " << d);
    CHECK(rel_diff(softmax(xg, d), softmax(x, d)) <= 1e-5);
    CHECK(rel_diff(log_softmax(xg, d), log_softmax(x, d)) <= 1e-5);
  }
  const Tensor wide = mul(randn_cpu({5, 3000}, 16), 20.0);
  CHECK(rel_diff(log_softmax(wide.to(kGpu), 1), log_softmax(wide, 1)) <= 1e-5);
  CHECK(rel_diff(logsumexp(wide.to(kGpu), {1}), logsumexp(wide, {1})) <= 1e-5);
}

TEST_CASE("more than 2^31 elements: fill, sum, argmax, copy", "[cuda][gpu][large]") {
  require_gpu();
  const int64_t n = (int64_t{1} << 31) + 5;  // 2 GiB of uint8
  Tensor x = zeros({n}, {.dtype = kUInt8, .device = kGpu});
  Tensor tail = narrow(x, 0, n - 3, 3);
  tail.fill_(2);
  CHECK(sum(x).item<int64_t>() == 6);
  CHECK(argmax(x).item<int64_t>() == n - 3);
  x.fill_(1);
  CHECK(sum(x).item<int64_t>() == n);
  Tensor y = add(x, x);  // elementwise over 2^31 + 5: split launches
  CHECK(sum(y).item<int64_t>() == 2 * n);
  CHECK(amin(y).item<int64_t>() == 2);
}

TEST_CASE("random numbers equal the CPU's for the same seed", "[cuda][gpu]") {
  require_gpu();
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    INFO(dtype_name(dtype));
    Generator a(1234), b(1234);
    const Tensor cpu = rand({1001, 7}, {.dtype = dtype}, &a);
    const Tensor gpu = rand({1001, 7}, {.dtype = dtype, .device = kGpu}, &b);
    CHECK(same(gpu, cpu));  // bit for bit
    // The generators advanced alike: the next draws agree too.
    CHECK(same(rand({33}, {.dtype = dtype, .device = kGpu}, &b), rand({33}, {.dtype = dtype}, &a)));
  }
  // nn::init::uniform_ (a float64 rand, then mul and add ops, then a cast into the target).
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO("uniform_(-0.3, 1.7) " << dtype_name(dtype));
    Generator a(4321), b(4321);
    Tensor cpu = empty({777}, {.dtype = dtype}), gpu = empty({777}, {.dtype = dtype, .device = kGpu});
    nn::init::uniform_(cpu, -0.3, 1.7, &a);
    nn::init::uniform_(gpu, -0.3, 1.7, &b);
    CHECK(same(gpu, cpu));
    // Into a strided view (assigned through a strided copy): the same numbers in the same places.
    Tensor cpu2 = zeros({20, 30}, {.dtype = dtype}), gpu2 = zeros({20, 30}, {.dtype = dtype, .device = kGpu});
    Tensor cv = t(cpu2), gv = t(gpu2);
    nn::init::uniform_(cv, -1.0, 1.0, &a);
    nn::init::uniform_(gv, -1.0, 1.0, &b);
    CHECK(same(gpu2, cpu2));
  }
  for (DType dtype : {kInt64, kInt32, kUInt8}) {
    INFO(dtype_name(dtype));
    Generator a(99), b(99);
    CHECK(same(randint(-5, 250, {513}, {.dtype = dtype == kUInt8 ? kInt64 : dtype, .device = kGpu}, &b),
               randint(-5, 250, {513}, {.dtype = dtype == kUInt8 ? kInt64 : dtype}, &a)));
  }
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO("randn " << dtype_name(dtype));
    Generator a(77), b(77);
    const Tensor cpu = randn({4099}, {.dtype = dtype}, &a);
    const Tensor gpu = randn({4099}, {.dtype = dtype, .device = kGpu}, &b);
    // Box-Muller calls log/sqrt/cos/sin, whose CUDA versions may differ from glibc's by an ulp or two:
    // the same draws (same Philox words), equal to within a few ulps.
    CHECK(rel_diff(gpu, cpu) <= (dtype == kFloat32 ? 1e-6 : 1e-14));
    const double exact = mean(eq(gpu.cpu(), cpu).to(kFloat64)).item<double>();
    WARN("randn " << dtype_name(dtype) << ": " << exact * 100 << "% of the draws bit-identical to the CPU");
    CHECK(exact > 0.5);
  }
}

TEST_CASE("matmul through cuBLAS: TF32, float32, float64, transposed and batched", "[cuda][gpu]") {
  require_gpu();
  const Tensor a = randn_cpu({67, 129}, 17), b = randn_cpu({129, 45}, 18);
  const Tensor ag = a.to(kGpu), bg = b.to(kGpu);
  {
    cuda::set_allow_tf32(true);
    CHECK(rel_diff(mm(ag, bg), mm(a, b)) <= 1e-3);
  }
  {
    NoTf32 exact;
    CHECK(rel_diff(mm(ag, bg), mm(a, b)) <= 1e-5);
    CHECK(rel_diff(mm(t(bg), t(ag)), mm(t(b), t(a))) <= 1e-5);               // transposed operands
    CHECK(rel_diff(mm(slice(ag, 1, 0, 129, 2), slice(bg, 0, 0, 129, 2)),      // strided: copied first
                   mm(slice(a, 1, 0, 129, 2), slice(b, 0, 0, 129, 2))) <= 1e-5);
    const Tensor bias = randn_cpu({45}, 19);
    CHECK(rel_diff(addmm(bias.to(kGpu), ag, bg, 0.5, 2.0), addmm(bias, a, b, 0.5, 2.0)) <= 1e-5);
    const Tensor ba = randn_cpu({5, 12, 31}, 20), bb = randn_cpu({5, 31, 8}, 21);
    CHECK(rel_diff(bmm(ba.to(kGpu), bb.to(kGpu)), bmm(ba, bb)) <= 1e-5);
    CHECK(rel_diff(bmm(transpose(bb, 1, 2).to(kGpu), transpose(ba, 1, 2).to(kGpu)),
                   bmm(transpose(bb, 1, 2), transpose(ba, 1, 2))) <= 1e-5);
    const Tensor shared_b = randn_cpu({31, 8}, 22);  // broadcast over the batch
    CHECK(rel_diff(matmul(ba.to(kGpu), shared_b.to(kGpu)), matmul(ba, shared_b)) <= 1e-5);
    CHECK(rel_diff(matmul(randn_cpu({31}, 23).to(kGpu), shared_b.to(kGpu)), matmul(randn_cpu({31}, 23), shared_b)) <= 1e-5);
  }
  // k == 0: C = beta * bias (zeros for mm).
  const Tensor e1 = zeros({3, 0}), e2 = zeros({0, 4}), eb = randn_cpu({3, 4}, 24);
  CHECK(same(mm(e1.to(kGpu), e2.to(kGpu)), mm(e1, e2)));
  CHECK(rel_diff(addmm(eb.to(kGpu), e1.to(kGpu), e2.to(kGpu), 0.5, 2.0), addmm(eb, e1, e2, 0.5, 2.0)) <= 1e-6);
  const Tensor ad = a.to(kFloat64), bd = b.to(kFloat64);
  CHECK(rel_diff(mm(ad.to(kGpu), bd.to(kGpu)), mm(ad, bd)) <= 1e-12);
  cuda::set_allow_tf32(true);
}

TEST_CASE("index_select, gather, scatter, scatter_add, masked_fill", "[cuda][gpu]") {
  require_gpu();
  const Tensor x = randn_cpu({9, 13}, 24), xg = x.to(kGpu);
  const Tensor idx = tensor<int64_t>({3, 0, 8, 3, 5});
  CHECK(same(index_select(xg, 0, idx.to(kGpu)), index_select(x, 0, idx)));
  CHECK(same(index_select(t(xg), 1, idx.to(kGpu)), index_select(t(x), 1, idx)));
  Generator gen(25);
  const Tensor gi = randint(0, 13, {9, 6}, {.dtype = kInt64}, &gen);
  CHECK(same(gather(xg, 1, gi.to(kGpu)), gather(x, 1, gi)));
  const Tensor src = randn_cpu({9, 6}, 26);
  const Tensor si = randint(0, 13, {9, 6}, {.dtype = kInt64}, &gen);
  // scatter_add with repeated indices: every contribution adds (atomicAdd), up to summation order.
  CHECK(rel_diff(scatter_add(xg, 1, si.to(kGpu), src.to(kGpu)), scatter_add(x, 1, si, src)) <= 1e-5);
  // scatter with distinct indices per row (a permutation): deterministic.
  const Tensor perm = tensor<int64_t>({4, 1, 0, 3, 2, 5});
  const Tensor pi = expand(unsqueeze(perm, 0), {9, 6}).contiguous();
  CHECK(same(scatter(xg, 1, pi.to(kGpu), src.to(kGpu)), scatter(x, 1, pi, src)));
  CHECK(same(scatter(xg, 1, pi.to(kGpu), 1.5), scatter(x, 1, pi, 1.5)));
  CHECK(same(masked_fill(xg, gt(xg, 0.5), -1.0), masked_fill(x, gt(x, 0.5), -1.0)));
  const Tensor ii = randint(0, 50, {17}, {.dtype = kInt64}, &gen);
  CHECK(same(scatter_add(zeros({50}, {.dtype = kInt64, .device = kGpu}), 0, ii.to(kGpu), ones({17}, {.dtype = kInt64, .device = kGpu})),
             scatter_add(zeros({50}, {.dtype = kInt64}), 0, ii, ones({17}, {.dtype = kInt64}))));
}

TEST_CASE("layer_norm and cross_entropy forward and backward", "[cuda][gpu]") {
  require_gpu();
  const Tensor x = mul(randn_cpu({12, 300}, 27), 3.0), w = randn_cpu({300}, 28), b = randn_cpu({300}, 29);
  auto run = [&](Device dev) {
    Tensor xd = x.to(dev).detach().requires_grad_(), wd = w.to(dev).detach().requires_grad_(), bd = b.to(dev).detach().requires_grad_();
    Tensor y = F::layer_norm(xd, {300}, wd, bd, 1e-5);
    sum(mul(y, y)).backward();
    return std::vector<Tensor>{y.detach().cpu(), xd.grad().cpu(), wd.grad().cpu(), bd.grad().cpu()};
  };
  const auto g = run(kGpu), c = run(kCPU);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("layer_norm output/grad " << i);
    CHECK(rel_diff(g[i].to(kGpu), c[i]) <= 1e-5);
  }
  const Tensor logits = randn_cpu({33, 10}, 30);
  Generator gen(31);
  Tensor target = randint(0, 10, {33}, {.dtype = kInt64}, &gen);
  target.narrow(0, 3, 2).fill_(-100);  // ignored rows
  for (double smoothing : {0.0, 0.1}) {
    INFO("label_smoothing " << smoothing);
    auto ce = [&](Device dev) {
      Tensor l = logits.to(dev).detach().requires_grad_();
      Tensor loss = F::cross_entropy(l, target.to(dev), {.label_smoothing = smoothing});
      loss.backward();
      return std::pair{loss.detach().cpu(), l.grad().cpu()};
    };
    const auto [lg, gg] = ce(kGpu);
    const auto [lc, gc] = ce(kCPU);
    CHECK(rel_diff(lg.to(kGpu), lc) <= 1e-5);
    CHECK(rel_diff(gg.to(kGpu), gc) <= 1e-5);
  }
}

// The row kernels' boundaries (kernels/shared/row_plan.h): one lane per row (1), scalar and vector
// warp rows (31, 32, 33), the largest register row (1024 float32 / 512 float64) and one past it
// (block kernel, cached in shared memory), rows too long to cache (10000 for the backward's two
// arrays), rows with -inf (one all -inf: NaN on both sides), a row start one element off 16-byte
// alignment, float64; forward and backward of softmax, log_softmax and layer_norm.
TEST_CASE("softmax, log_softmax and layer_norm row kernels at their boundaries", "[cuda][gpu]") {
  require_gpu();
  uint64_t seed = 500;
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    // 6144 and 12288: a cached row at the 48 KiB that static and dynamic shared memory share by
    // default (kRowStaticSharedBytes, kernels/shared/row_plan.h; before, float32 12288 forward and
    // 6144 backward, float64 6144 forward, asked for more and the launch failed).
    for (int64_t cols : {1, 31, 32, 33, 127, 512, 513, 1023, 1024, 1025, 4096, 6144, 10000, 12288}) {
      for (bool misaligned : {false, true}) {
        const int64_t rows = cols >= 4096 ? 9 : 37;
        INFO(dtype_name(dt) << " rows " << rows << " cols " << cols << (misaligned ? " misaligned" : ""));
        // The same values on both devices; on cuda a view one element into a larger buffer, so the
        // kernel's row starts are off 16-byte alignment (contiguous: the kernel gets it as it is).
        Tensor base = mul(randn_cpu({rows * cols + 1}, ++seed, dt), 3.0);
        if (cols > 2) {  // some -inf entries; row 2 entirely -inf
          base.narrow(0, 5, 1).fill_(-INFINITY);
          base.narrow(0, 2 * cols + (misaligned ? 1 : 0), cols).fill_(-INFINITY);
          // Row 3: a NaN first (the block kernel's online statistics once reset the sum when a
          // finite value followed, leaving the rest of the row finite); row 4: a NaN after a prefix
          // of -inf. Both rows are all NaN on the CPU.
          const int64_t row3 = 3 * cols + (misaligned ? 1 : 0), row4 = 4 * cols + (misaligned ? 1 : 0);
          base.narrow(0, row3, 1).fill_(NAN);
          const int64_t prefix = std::min<int64_t>(cols - 2, 40);
          base.narrow(0, row4, prefix).fill_(-INFINITY);
          base.narrow(0, row4 + prefix, 1).fill_(NAN);
        }
        const int64_t at = misaligned ? 1 : 0;
        const Tensor x = base.narrow(0, at, rows * cols).reshape({rows, cols});
        const Tensor xg = base.to(kGpu).narrow(0, at, rows * cols).reshape({rows, cols});
        const Tensor r = randn_cpu({rows, cols}, ++seed, dt);
        for (bool log : {false, true}) {
          INFO((log ? "log_softmax" : "softmax"));
          auto run = [&](const Tensor& in) {
            Tensor xd = in.detach().requires_grad_();
            Tensor y = log ? log_softmax(xd, 1) : softmax(xd, 1);
            Tensor rr = in.device().is_cpu() ? r : r.to(kGpu);
            sum(mul(where(isfinite(y), y, zeros_like(y)), rr)).backward();
            return std::pair{y.detach(), xd.grad()};
          };
          const auto [yg, gg] = run(xg);
          const auto [yc, gc] = run(x);
          CHECK(rel_diff(yg, yc) <= tol);
          CHECK(rel_diff(gg, gc) <= tol);
        }
        // layer_norm on finite values (with weight and bias, and without), 10 added so the mean is
        // not small against the spread.
        const Tensor xf = add(where(isfinite(x), x, zeros_like(x)), 10.0);
        const Tensor xfg = add(where(isfinite(xg), xg, zeros_like(xg)), 10.0);
        const Tensor w = randn_cpu({cols}, ++seed, dt), b = randn_cpu({cols}, ++seed, dt);
        for (bool affine : {true, false}) {
          INFO("layer_norm" << (affine ? " with weight and bias" : ""));
          auto run = [&](const Tensor& in, Device dev) {
            Tensor xd = in.detach().requires_grad_();
            Tensor wd = affine ? w.to(dev).detach().requires_grad_() : Tensor();
            Tensor bd = affine ? b.to(dev).detach().requires_grad_() : Tensor();
            Tensor y = F::layer_norm(xd, {cols}, wd, bd, 1e-5);
            sum(mul(y, dev.is_cpu() ? r : r.to(kGpu))).backward();
            std::vector<Tensor> outs{y.detach(), xd.grad()};
            if (affine) {
              outs.push_back(wd.grad());
              outs.push_back(bd.grad());
            }
            return outs;
          };
          const auto g = run(xfg, kGpu), c = run(xf, kCPU);
          for (size_t i = 0; i < g.size(); ++i) {
            INFO("output/grad " << i);
            CHECK(rel_diff(g[i], c[i]) <= tol);
          }
        }
      }
    }
  }
  // Many rows: the warp kernel's grid-stride loop, and layer_norm's weight/bias gradients summed
  // in several row chunks.
  const Tensor x = randn_cpu({20000, 64}, 600), w = randn_cpu({64}, 601), b = randn_cpu({64}, 602);
  const Tensor r = randn_cpu({20000, 64}, 603);
  auto run = [&](Device dev) {
    Tensor xd = x.to(dev).detach().requires_grad_(), wd = w.to(dev).detach().requires_grad_(),
           bd = b.to(dev).detach().requires_grad_();
    Tensor y = F::layer_norm(xd, {64}, wd, bd, 1e-5);
    Tensor s = softmax(y, 1);
    sum(mul(s, r.to(dev))).backward();
    return std::vector<Tensor>{s.detach(), xd.grad(), wd.grad(), bd.grad()};
  };
  const auto g = run(kGpu), c = run(kCPU);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("20000 x 64 output/grad " << i);
    CHECK(rel_diff(g[i], c[i]) <= 1e-5);
  }
}

TEST_CASE("max, avg and adaptive pooling, forward and backward", "[cuda][gpu]") {
  require_gpu();
  const Tensor x = randn_cpu({3, 4, 11, 13}, 35);
  using Pool = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, Pool>> pools = {
      {"max 2", [](const Tensor& a) { return F::max_pool2d(a, {2, 2}); }},
      {"max 3 s2 p1 d2", [](const Tensor& a) { return F::max_pool2d(a, {3, 3}, F::Pair{2, 2}, {1, 1}, {2, 2}); }},
      {"max ceil", [](const Tensor& a) { return F::max_pool2d(a, {3, 2}, std::nullopt, {0, 0}, {1, 1}, true); }},
      {"avg 3 s2 p1", [](const Tensor& a) { return F::avg_pool2d(a, {3, 3}, F::Pair{2, 2}, {1, 1}); }},
      {"avg no pad count", [](const Tensor& a) { return F::avg_pool2d(a, {3, 3}, F::Pair{2, 2}, {1, 1}, true, false); }},
      {"adaptive 4x5", [](const Tensor& a) { return F::adaptive_avg_pool2d(a, {4, 5}); }},
      {"adaptive 1x1", [](const Tensor& a) { return F::adaptive_avg_pool2d(a, {1, 1}); }},
  };
  const Tensor weights = randn_cpu({3, 4, 11, 13}, 36);  // a weighted sum makes the gradient non-uniform
  for (const auto& [name, pool] : pools) {
    INFO(name);
    auto run = [&](Device dev) {
      Tensor xd = x.to(dev).detach().requires_grad_();
      Tensor y = pool(xd);
      sum(mul(y, narrow(narrow(weights.to(dev), 2, 0, y.size(2)), 3, 0, y.size(3)))).backward();
      return std::pair{y.detach().cpu(), xd.grad().cpu()};
    };
    const auto [yg, gg] = run(kGpu);
    const auto [yc, gc] = run(kCPU);
    CHECK(rel_diff(yg.to(kGpu), yc) <= 1e-6);
    CHECK(rel_diff(gg.to(kGpu), gc) <= 1e-5);
  }
}

TEST_CASE("conv2d and batch_norm, forward and backward", "[cuda][gpu]") {
  require_gpu();
  struct Case {
    std::string name;
    Shape x, w;
    F::Pair stride, padding, dilation;
    int64_t groups;
  };
  const std::vector<Case> cases = {
      {"3x3 pad 1", {2, 3, 9, 10}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"stride 2, dilation 2", {2, 4, 13, 11}, {6, 4, 3, 2}, {2, 2}, {2, 1}, {2, 2}, 1},
      {"groups 2", {3, 4, 8, 8}, {6, 2, 3, 3}, {1, 2}, {1, 0}, {1, 1}, 2},
      {"1x1", {2, 8, 5, 5}, {4, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const Tensor x = randn_cpu(c.x, 37), w = randn_cpu(c.w, 38), b = randn_cpu({c.w[0]}, 39);
    auto run = [&](Device dev) {
      Tensor xd = x.to(dev).detach().requires_grad_(), wd = w.to(dev).detach().requires_grad_(), bd = b.to(dev).detach().requires_grad_();
      Tensor y = F::conv2d(xd, wd, bd, c.stride, c.padding, c.dilation, c.groups);
      sum(mul(y, y)).backward();
      return std::vector<Tensor>{y.detach().cpu(), xd.grad().cpu(), wd.grad().cpu(), bd.grad().cpu()};
    };
    const auto g = run(kGpu), cc = run(kCPU);
    for (size_t i = 0; i < g.size(); ++i) {
      INFO("output/grad " << i);
      CHECK(rel_diff(g[i].to(kGpu), cc[i]) <= 1e-5);
    }
  }
  // batch_norm in training mode (batch statistics, running statistics updated) and eval mode.
  for (bool training : {true, false}) {
    INFO((training ? "train" : "eval"));
    auto run = [&](Device dev) {
      auto bn = std::make_shared<nn::BatchNorm2d>(5);
      bn->to(dev);
      if (training) bn->train();
      else bn->eval();
      Tensor xd = add(mul(randn_cpu({4, 5, 6, 7}, 40), 3.0), 1.0).to(dev).detach().requires_grad_();
      Tensor y = bn->forward(xd);
      sum(mul(y, randn_cpu({4, 5, 6, 7}, 41).to(dev))).backward();
      std::vector<Tensor> r{y.detach().cpu(), xd.grad().cpu()};
      for (const auto& [name, t] : bn->state_dict()) r.push_back(t.cpu());
      for (const Tensor& p : bn->parameters()) r.push_back(p.grad().cpu());
      return r;
    };
    const auto g = run(kGpu), c = run(kCPU);
    REQUIRE(g.size() == c.size());
    for (size_t i = 0; i < g.size(); ++i) {
      INFO("tensor " << i);
      CHECK(rel_diff(g[i].to(kGpu), c[i]) <= 1e-5);
    }
  }
}

TEST_CASE("gradients of composite expressions equal the CPU's", "[cuda][gpu]") {
  require_gpu();
  NoTf32 exact;
  const Tensor x0 = randn_cpu({8, 16}, 32), w0 = randn_cpu({16, 5}, 33), v0 = randn_cpu({5}, 34);
  using Expr = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Expr>> exprs = {
      {"tanh(x@w)*sigmoid(v)", [](const Tensor& x, const Tensor& w, const Tensor& v) {
         return sum(mul(tanh(matmul(x, w)), sigmoid(v)));
       }},
      {"log_softmax(relu(x@w)+v)", [](const Tensor& x, const Tensor& w, const Tensor& v) {
         return sum(mul(log_softmax(add(relu(matmul(x, w)), v), 1), 0.3));
       }},
      {"gelu, max, mean over a transpose", [](const Tensor& x, const Tensor& w, const Tensor& v) {
         Tensor h = gelu(matmul(x, w));
         return add(mean(amax(t(h), {1})), sum(mul(pow(v, 2), exp(mul(v, -0.5)))));
       }},
      {"softmax, where, div", [](const Tensor& x, const Tensor& w, const Tensor& v) {
         Tensor s = softmax(matmul(x, w), 0);
         return sum(div(where(gt(s, 0.1), s, mul(s, 2.0)), add(abs(v), 1.0)));
       }},
  };
  for (const auto& [name, f] : exprs) {
    INFO(name);
    auto grads = [&](Device dev) {
      Tensor x = x0.to(dev).detach().requires_grad_(), w = w0.to(dev).detach().requires_grad_(), v = v0.to(dev).detach().requires_grad_();
      f(x, w, v).backward();
      return std::vector<Tensor>{x.grad().cpu(), w.grad().cpu(), v.grad().cpu()};
    };
    const auto g = grads(kGpu), c = grads(kCPU);
    for (size_t i = 0; i < g.size(); ++i) {
      INFO("grad " << i);
      CHECK(rel_diff(g[i].to(kGpu), c[i]) <= 1e-5);
    }
  }
}

TEST_CASE("float16 and bfloat16 matmul and conv2d on cuda:0 stay in their dtype and agree with the CPU's", "[cuda][gpu]") {
  require_gpu();
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    // cuBLAS and cuDNN accumulate in float32 and round once, as the CPU's widened products do: the
    // results differ by a rounding of the output (an ulp: 2^-8 relative in bfloat16, 2^-11 in float16).
    const double tol = dt == kBFloat16 ? 2e-2 : 5e-3;
    const Tensor a = randn_cpu({67, 130}, 51, dt), b = randn_cpu({130, 45}, 52, dt), bias = randn_cpu({45}, 53, dt);
    const Tensor prod = mm(a.to(kGpu), b.to(kGpu));
    CHECK(prod.dtype() == dt);
    CHECK(rel_diff(prod, mm(a, b)) <= tol);
    CHECK(rel_diff(mm(a.to(kGpu), t(randn_cpu({45, 130}, 60, dt)).to(kGpu)), mm(a, t(randn_cpu({45, 130}, 60, dt)))) <= tol);
    CHECK(rel_diff(addmm(bias.to(kGpu), a.to(kGpu), b.to(kGpu), 0.5, 2.0), addmm(bias, a, b, 0.5, 2.0)) <= tol);
    const Tensor p = randn_cpu({5, 33, 64}, 54, dt), q = randn_cpu({5, 64, 17}, 55, dt);
    CHECK(rel_diff(bmm(p.to(kGpu), q.to(kGpu)), bmm(p, q)) <= tol);

    // conv2d forward and backward (input, weight and bias gradients), through cuDNN and through the
    // direct kernels (cuDNN off: they compute half precision in float32).
    const Tensor x = randn_cpu({4, 6, 13, 11}, 56, dt), w = randn_cpu({8, 6, 3, 3}, 57, dt), cb = randn_cpu({8}, 58, dt);
    const Tensor gy = randn_cpu({4, 8, 7, 6}, 59, dt);  // the output's shape at stride 2, padding 1
    auto run = [&](Device dev) {
      Tensor xd = x.to(dev).detach().requires_grad_(), wd = w.to(dev).detach().requires_grad_(),
             bd = cb.to(dev).detach().requires_grad_();
      Tensor y = F::conv2d(xd, wd, bd, F::Pair{2, 2}, F::Pair{1, 1});
      sum(mul(y, gy.to(dev))).backward();
      return std::vector<Tensor>{y.detach().cpu(), xd.grad().cpu(), wd.grad().cpu(), bd.grad().cpu()};
    };
    const auto c = run(kCPU);
    for (bool cudnn : {true, false}) {
      INFO("cuDNN " << (cudnn ? "on" : "off"));
      cuda::set_cudnn_enabled(cudnn);
      const auto g = run(kGpu);
      cuda::set_cudnn_enabled(true);
      for (size_t i = 0; i < g.size(); ++i) {
        INFO("output/gradient " << i);
        CHECK(g[i].dtype() == dt);
        CHECK(rel_diff(g[i].to(kGpu), c[i]) <= tol);
      }
    }
  }
}

namespace {
struct TrainRun {
  std::vector<double> losses;
  std::vector<Tensor> params;  // on the CPU
};

TrainRun train_mlp(Device device, bool adam) {
  manual_seed(41);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(20, 64));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(64, 7));
  net->to(device);
  std::unique_ptr<optim::Optimizer> opt;
  if (adam) opt = std::make_unique<optim::Adam>(net->parameters(), optim::AdamOptions{.lr = 3e-3, .weight_decay = 1e-4});
  else opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  Generator data(42);
  TrainRun run;
  // One fixed batch: the net fits it, so the loss falls (fresh random labels each step would not).
  const Tensor x = randn({32, 20}, {}, &data);
  const Tensor y = randint(0, 7, {32}, {.dtype = kInt64}, &data);
  for (int step = 0; step < 20; ++step) {
    opt->zero_grad();
    Tensor loss = F::cross_entropy(net->forward(x.to(device)), y.to(device));
    loss.backward();
    opt->step();
    run.losses.push_back(loss.item<double>());
  }
  for (const Tensor& p : net->parameters()) run.params.push_back(p.detach().cpu());
  return run;
}
}  // namespace

TrainRun train_cnn(Device device) {
  manual_seed(12);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(2, 6, 3).padding(1)));
  net->push_back(std::make_shared<nn::BatchNorm2d>(6));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::MaxPool2d>(2));
  net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(6, 8, 3).stride(2).padding(1)));
  net->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(8, 4));
  net->to(device);
  net->train();
  optim::SGD opt(net->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  Generator data(5);
  TrainRun run;
  for (int step = 0; step < 20; ++step) {
    Tensor x = randn({6, 2, 8, 8}, {}, &data);
    Tensor y = randint(0, 4, {6}, {.dtype = kInt64}, &data);
    opt.zero_grad();
    Tensor loss = F::cross_entropy(net->forward(x.to(device)), y.to(device));
    loss.backward();
    opt.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& [name, t] : net->state_dict()) run.params.push_back(t.cpu());
  return run;
}

TEST_CASE("float16 and bfloat16 elementwise ops and batch_norm on cuda:0 run on 16-bit storage and agree with the CPU's",
          "[cuda][gpu]") {
  require_gpu();
  for (DType dt : {kFloat16, kBFloat16}) {
    INFO(dtype_name(dt));
    // Both sides widen each element to float, compute, and round once ([Half storage]): the float
    // math differs by a few float ulps at most, so the outputs by at most one 16-bit rounding.
    const double tol = dt == kBFloat16 ? 2e-2 : 5e-3;
    const Tensor a = randn_cpu({37, 29}, 81, dt), b = randn_cpu({29}, 82, dt), pos = abs(randn_cpu({37, 29}, 83, dt));
    const Tensor ag = a.to(kGpu), bg = b.to(kGpu), pg = pos.to(kGpu);
    using Op = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;
    const std::vector<std::pair<const char*, Op>> ops = {
        {"add alpha", [](const Tensor& x, const Tensor& y, const Tensor&) { return add(x, y, 0.3); }},
        {"sub", [](const Tensor& x, const Tensor& y, const Tensor&) { return sub(x, y); }},
        {"mul", [](const Tensor& x, const Tensor& y, const Tensor&) { return mul(x, y); }},
        {"div", [](const Tensor& x, const Tensor&, const Tensor& p) { return div(x, add(p, 0.5)); }},
        {"mul scalar", [](const Tensor& x, const Tensor&, const Tensor&) { return mul(x, 0.1); }},
        {"maximum", [](const Tensor& x, const Tensor& y, const Tensor&) { return maximum(x, y); }},
        {"relu", [](const Tensor& x, const Tensor&, const Tensor&) { return relu(x); }},
        {"gelu", [](const Tensor& x, const Tensor&, const Tensor&) { return gelu(x, "none"); }},
        {"gelu tanh", [](const Tensor& x, const Tensor&, const Tensor&) { return gelu(x, "tanh"); }},
        {"sigmoid", [](const Tensor& x, const Tensor&, const Tensor&) { return sigmoid(x); }},
        {"tanh", [](const Tensor& x, const Tensor&, const Tensor&) { return tanh(x); }},
        {"exp", [](const Tensor& x, const Tensor&, const Tensor&) { return exp(x); }},
        {"log", [](const Tensor&, const Tensor&, const Tensor& p) { return log(add(p, 0.1)); }},
        {"pow", [](const Tensor&, const Tensor&, const Tensor& p) { return pow(p, 1.7); }},
        {"clamp", [](const Tensor& x, const Tensor&, const Tensor&) { return clamp(x, Scalar(-0.3), Scalar(0.7)); }},
        {"where", [](const Tensor& x, const Tensor& y, const Tensor&) { return where(gt(x, y), x, y); }},
        {"transposed", [](const Tensor& x, const Tensor&, const Tensor&) { return add(t(x), 1.0); }},
    };
    for (const auto& [name, op] : ops) {
      INFO(name);
      const Tensor g = op(ag, bg, pg);
      CHECK(g.dtype() == dt);
      CHECK(rel_diff(g, op(a, b, pos)) <= tol);
    }
    CHECK(same(lt(ag, bg), lt(a, b)));
    // The fused backward helpers, through the gradients of relu, gelu, sigmoid and tanh.
    auto grads = [&](Device dev) {
      Tensor x = a.to(dev).detach().requires_grad_();
      sum(mul(add(add(relu(x), gelu(x, "none")), add(sigmoid(x), tanh(x))), b.to(dev)).to(kFloat32)).backward();
      return x.grad();
    };
    const Tensor gg = grads(kGpu);
    CHECK(gg.dtype() == dt);
    CHECK(rel_diff(gg, grads(kCPU)) <= tol);

    // batch_norm: a 16-bit input with float32 weight, bias and running statistics.
    const Tensor x = randn_cpu({4, 6, 9, 7}, 84, dt), w = randn_cpu({6}, 85), bias = randn_cpu({6}, 86);
    const Tensor gy = randn_cpu({4, 6, 9, 7}, 87, dt);
    auto bn = [&](Device dev) {
      Tensor xd = x.to(dev).detach().requires_grad_(), wd = w.to(dev).detach().requires_grad_(),
             bd = bias.to(dev).detach().requires_grad_();
      Tensor rm = zeros({6}, {.device = dev}), rv = ones({6}, {.device = dev});
      Tensor y = F::batch_norm(xd, rm, rv, wd, bd, true, 0.1, 1e-5);
      sum(mul(y, gy.to(dev)).to(kFloat32)).backward();
      return std::vector<Tensor>{y.detach(), xd.grad(), wd.grad(), bd.grad(), rm, rv};
    };
    const auto c = bn(kCPU), g = bn(kGpu);
    const char* names[] = {"output", "x.grad", "weight.grad", "bias.grad", "running_mean", "running_var"};
    for (size_t i = 0; i < g.size(); ++i) {
      INFO(names[i]);
      CHECK(g[i].dtype() == (i < 2 ? dt : kFloat32));
      // Sums over 252 values in double on both sides; the float32 results differ by roundings only.
      CHECK(rel_diff(g[i], c[i]) <= (i < 2 ? tol : 1e-4));
    }
  }
}

// The row kernels on 16-bit rows: softmax, log_softmax, layer_norm (float32 weight, bias and
// statistics) and cross_entropy (float32 losses), forward and backward, against the CPU's on the same
// values. Column counts reach the warp kernel with vectors (64, 1024) and without (333), and the
// block kernel (5000); the float32 weight is a view 16 bytes into its storage, so its 8-element
// vectors beside a bfloat16 row are 16- but not 32-byte aligned (row_kernels::load_params). Also sum,
// amax and amin on 16-bit storage.
TEST_CASE("float16 and bfloat16 softmax, layer_norm and cross_entropy on cuda:0 run on 16-bit rows and agree with the CPU's",
          "[cuda][gpu]") {
  require_gpu();
  for (DType dt : {kFloat16, kBFloat16}) {
    const double tol = dt == kBFloat16 ? 2e-2 : 5e-3;
    // 1500 and 2047: rows of at most 4 KiB loaded one element at a time (no multiple of 8), which
    // once asked the warp kernel for 64 vectors per lane (no such instantiation: the op threw);
    // 12288: layer_norm's backward rows not cached (the shared-memory limit).
    for (int64_t cols : {int64_t(64), int64_t(333), int64_t(1024), int64_t(1500), int64_t(2047), int64_t(5000),
                         int64_t(12288)}) {
      INFO(dtype_name(dt) << " cols " << cols);
      const int64_t rows = 67;
      const Tensor x = randn_cpu({rows, cols}, 91, dt), gy = randn_cpu({rows, cols}, 92, dt);
      const Tensor wbase = randn_cpu({cols + 4}, 93), b = randn_cpu({cols}, 94);
      const Tensor target = randint(0, cols, {rows}, {.dtype = kInt64});
      auto run = [&](Device dev) {
        Tensor xd = x.to(dev).detach().requires_grad_();
        Tensor wd = wbase.to(dev).narrow(0, 4, cols).detach().requires_grad_(), bd = b.to(dev).detach().requires_grad_();
        Tensor ln = F::layer_norm(xd, {cols}, wd, bd, 1e-5);
        Tensor sm = softmax(ln, 1), lsm = log_softmax(xd, 0);
        Tensor ce = F::cross_entropy(ln, target.to(dev), {.label_smoothing = 0.1});
        Tensor g = gy.to(dev);
        // (ce added after the sum: added to each of the rows x cols terms, its 16-bit gradient would
        // be rows x cols, past float16's largest value from 1024 columns on)
        add(sum(add(mul(sm, g), mul(lsm, g)).to(kFloat32)), ce.to(kFloat32)).backward();
        return std::vector<Tensor>{ln.detach(), sm.detach(), lsm.detach(), ce.detach(), xd.grad(), wd.grad(), bd.grad()};
      };
      const auto c = run(kCPU), g = run(kGpu);
      const char* names[] = {"layer_norm", "softmax", "log_softmax", "cross_entropy", "x.grad", "weight.grad",
                             "bias.grad"};
      for (size_t i = 0; i < g.size(); ++i) {
        INFO(names[i]);
        CHECK(g[i].dtype() == (i < 5 ? dt : kFloat32));
        CHECK(rel_diff(g[i], c[i]) <= tol);
      }
      // Reductions on 16-bit storage (float sums in double, rounded once, as the CPU's): rows,
      // columns, a full reduction split over blocks.
      const Tensor xg = x.to(kGpu);
      CHECK(same(sum(xg, {1}), sum(x, {1})));
      CHECK(same(sum(xg, {0}), sum(x, {0})));
      CHECK(same(amax(xg, {1}), amax(x, {1})));
      CHECK(same(amin(xg, {0}), amin(x, {0})));
      const Tensor big = randn_cpu({1 << 20}, 95, dt);
      CHECK(same(sum(big.to(kGpu)), sum(big)));
    }
  }
}

TEST_CASE("an MLP trained 20 steps on cuda:0 equals the CPU run within 1e-4", "[cuda][gpu][nn]") {
  require_gpu();
  NoTf32 exact;
  for (bool adam : {false, true}) {
    INFO((adam ? "Adam" : "SGD with momentum"));
    const TrainRun cpu = train_mlp(kCPU, adam), gpu = train_mlp(kGpu, adam);
    REQUIRE(gpu.losses.size() == cpu.losses.size());
    CHECK(cpu.losses.back() < cpu.losses.front());  // it trains at all
    for (size_t i = 0; i < cpu.losses.size(); ++i) {
      INFO("step " << i);
      CHECK(std::abs(gpu.losses[i] - cpu.losses[i]) <= 1e-4 * std::abs(cpu.losses[i]));
    }
    REQUIRE(gpu.params.size() == cpu.params.size());
    for (size_t i = 0; i < cpu.params.size(); ++i) {
      INFO("parameter " << i);
      CHECK(rel_diff(gpu.params[i].to(kGpu), cpu.params[i]) <= 1e-4);
    }
  }
}

TEST_CASE("a CNN with BatchNorm and pooling trained 20 steps on cuda:0 equals the CPU run within 1e-4",
          "[cuda][gpu][nn]") {
  require_gpu();
  NoTf32 exact;
  const TrainRun cpu = train_cnn(kCPU), gpu = train_cnn(kGpu);
  REQUIRE(gpu.losses.size() == cpu.losses.size());
  CHECK(cpu.losses.back() < cpu.losses.front());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    INFO("step " << i);
    CHECK(std::abs(gpu.losses[i] - cpu.losses[i]) <= 1e-4 * std::abs(cpu.losses[i]));
  }
  REQUIRE(gpu.params.size() == cpu.params.size());
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    INFO("state tensor " << i);
    if (cpu.params[i].is_floating_point()) CHECK(rel_diff(gpu.params[i].to(kGpu), cpu.params[i]) <= 1e-4);
    else CHECK(same(gpu.params[i].to(kGpu), cpu.params[i]));
  }
}

}  // namespace chorus
