// [Shared scratchpads] (kernels/cpu/onednn_conv.cpp): every oneDNN convolution's scratchpad comes
// from one process-wide pool that keeps a single block, as large as the largest scratchpad any
// convolution asked for, instead of a cached block of every size (ResNet-18's training step peaked
// 30 MB higher with Winograd's four scratchpad sizes held; docs/benchmarks.md, session 53). The
// sizes are oneDNN's own, asked of it here for the primitives chorus makes (its implementation() says
// which algorithm a shape runs), so the expected pool size does not come from the pool. And a block
// is never shared by two convolutions at once: two threads running different shapes together get
// the same bits as one thread running them in turn.
#include <catch2/catch.hpp>

#include <dnnl.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/onednn_conv.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

// [No header] The pool's contents between calls (onednn_conv.cpp).
namespace chorus::kernels::cpu::onednn {
size_t scratch_pool_free_bytes();
size_t scratch_pool_free_blocks();
}  // namespace chorus::kernels::cpu::onednn

namespace kc = chorus::kernels::cpu;
using namespace chorus;

namespace {

// A 3x3 (or 7x7 stride 2) convolution of a batch of 16, padded to keep (halve) the image.
struct ConvShape {
  int64_t c, oc, h, k, s;
  const char* what;
};

kernels::Window2d window(const ConvShape& sh) {
  const int64_t pad = sh.k / 2, out = (sh.h + 2 * pad - sh.k) / sh.s + 1;
  return {.in_h = sh.h, .in_w = sh.h, .out_h = out, .out_w = out, .kernel_h = sh.k, .kernel_w = sh.k,
          .stride_h = sh.s, .stride_w = sh.s, .pad_h = pad, .pad_w = pad, .dilation_h = 1, .dilation_w = 1};
}

// The largest scratchpad of the three primitives oneDNN makes for this shape with this algorithm
// (no bias, as ResNet's convolutions; tags left to oneDNN, as chorus leaves them).
size_t largest_scratchpad(const ConvShape& sh, bool winograd) {
  using dnnl::memory;
  const kernels::Window2d w = window(sh);
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto any = [](memory::dims d) { return memory::desc(d, memory::data_type::f32, memory::format_tag::any); };
  const memory::dims src{16, sh.c, sh.h, sh.h}, wei{sh.oc, sh.c, sh.k, sh.k}, dst{16, sh.oc, w.out_h, w.out_w};
  const memory::dims strides{sh.s, sh.s}, pad{w.pad_h, w.pad_w};
  const auto algorithm = winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algorithm, any(src), any(wei), any(dst),
                                      strides, pad, pad),
      attr, eng);
  const dnnl::convolution_backward_data::primitive_desc data(
      dnnl::convolution_backward_data::desc(algorithm, any(src), any(wei), any(dst), strides, pad, pad), attr, eng,
      fwd);
  const dnnl::convolution_backward_weights::primitive_desc weights(
      dnnl::convolution_backward_weights::desc(algorithm, any(src), any(wei), any(dst), strides, pad, pad), attr,
      eng, fwd);
  return std::max({fwd.scratchpad_desc().get_size(), data.scratchpad_desc().get_size(),
                   weights.scratchpad_desc().get_size()});
}

struct Result {
  Tensor out, grad_x, grad_w;
};

Result run(const ConvShape& sh, const Tensor& x, const Tensor& weight, const Tensor& grad_out) {
  const kernels::Window2d w = window(sh);
  Result r{make_tensor(grad_out.sizes(), kFloat32, kCPU), make_tensor(x.sizes(), kFloat32, kCPU),
           make_tensor(weight.sizes(), kFloat32, kCPU)};
  kc::conv2d(r.out, x, weight, Tensor(), w, 1);
  kc::conv2d_backward(r.grad_x, r.grad_w, Tensor(), grad_out, x, weight, w, 1);
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::equal(a.data_ptr<float>(), a.data_ptr<float>() + a.numel(), b.data_ptr<float>());
}

// ResNet-18's Winograd shapes at 64x64 inputs (AVX-512; direct elsewhere) and its direct stem.
const ConvShape kShapes[] = {
    {64, 64, 16, 3, 1, "64 channels at 16x16 (layer 1)"},
    {128, 128, 8, 3, 1, "128 channels at 8x8 (layer 2)"},
    {3, 64, 64, 7, 2, "the 7x7 stride-2 stem"},
};

struct Inputs {
  Tensor x, weight, grad_out;
};

Inputs inputs(const ConvShape& sh, Generator& gen) {
  const kernels::Window2d w = window(sh);
  return {randn({16, sh.c, sh.h, sh.h}, {}, &gen), randn({sh.oc, sh.c, sh.k, sh.k}, {}, &gen),
          randn({16, sh.oc, w.out_h, w.out_w}, {}, &gen)};
}

}  // namespace

TEST_CASE("Convolutions share one scratchpad block, as large as the largest scratchpad oneDNN asked for",
          "[cpu][conv]") {
  const int threads_before = get_num_threads();
  set_num_threads(1);
  Generator gen(5);
  size_t largest = 0;
  int winograd = 0;
  for (const ConvShape& sh : kShapes) {
    const Inputs in = inputs(sh, gen);
    REQUIRE(kc::onednn::handles(in.x, in.weight, window(sh)));
    const std::string impl = kc::onednn::implementation(in.x, in.weight, window(sh), 1);
    const bool wino = impl.find("wino") != std::string::npos;
    winograd += wino;
    largest = std::max(largest, largest_scratchpad(sh, wino));
    run(sh, in.x, in.weight, in.grad_out);
    INFO(sh.what << " (" << impl << "): oneDNN's largest scratchpad so far " << largest << " bytes");
    // One block, the largest size rounded up to the pool's 64 KiB granule; the smaller ones went.
    CHECK(kc::onednn::scratch_pool_free_blocks() == 1);
    CHECK(kc::onednn::scratch_pool_free_bytes() == (largest + 65535) / 65536 * 65536);
  }
  // The smaller shapes again: the block is reused, not joined by one of their size.
  for (const ConvShape& sh : kShapes) {
    const Inputs in = inputs(sh, gen);
    run(sh, in.x, in.weight, in.grad_out);
  }
  CHECK(kc::onednn::scratch_pool_free_blocks() == 1);
  CHECK(kc::onednn::scratch_pool_free_bytes() == (largest + 65535) / 65536 * 65536);
  if (winograd == 0) {
    std::printf("CHORUS-SKIP: oneDNN has no Winograd kernels on this CPU (%s), so the shapes whose scratchpads were "
                "7-15 MB ran direct; the pool was checked with the direct scratchpads only\n",
                kc::onednn::capability().c_str());
  }
  set_num_threads(threads_before);
}

TEST_CASE("Two threads running convolutions at once get the same bits as one thread running them in turn",
          "[cpu][conv]") {
  const int threads_before = get_num_threads();
  set_num_threads(1);
  Generator gen(6);
  const ConvShape& a = kShapes[0];
  const ConvShape& b = kShapes[1];
  const Inputs ia = inputs(a, gen), ib = inputs(b, gen);
  const Result want_a = run(a, ia.x, ia.weight, ia.grad_out), want_b = run(b, ib.x, ib.weight, ib.grad_out);
  int mismatches_a = 0, mismatches_b = 0;
  auto loop = [](const ConvShape& sh, const Inputs& in, const Result& want, int& mismatches) {
    for (int i = 0; i < 12; ++i) {
      const Result got = run(sh, in.x, in.weight, in.grad_out);
      mismatches += !same_bits(got.out, want.out) + !same_bits(got.grad_x, want.grad_x) +
                    !same_bits(got.grad_w, want.grad_w);
    }
  };
  std::thread ta(loop, std::cref(a), std::cref(ia), std::cref(want_a), std::ref(mismatches_a));
  std::thread tb(loop, std::cref(b), std::cref(ib), std::cref(want_b), std::ref(mismatches_b));
  ta.join();
  tb.join();
  CHECK(mismatches_a == 0);
  CHECK(mismatches_b == 0);
  // At most one block for each convolution that ran at once.
  CHECK(kc::onednn::scratch_pool_free_blocks() >= 1);
  CHECK(kc::onednn::scratch_pool_free_blocks() <= 2);
  set_num_threads(threads_before);
}
