// float32 CPU convolutions (and, in gemm.cpp, float32 GEMM: dnnl_sgemm) through oneDNN (the library libtorch uses on CPUs), behind chorus's conv
// kernel interface (conv.h). oneDNN picks its kernels at run time for the CPU it finds (AVX-512,
// AVX2, ...), with blocked memory formats: inputs and weights are reordered into the formats the
// chosen kernel wants and results back to NCHW on each call (weights change every step, so they
// cannot be kept blocked between calls). Primitive descriptors and primitives are made once per
// shape and cached. Why oneDNN rather than chorus's im2col + GEMM: docs/benchmarks.md (conv_bench).
//
// CHORUS_CPU_CAPABILITY=avx512|avx2|default caps the instruction set oneDNN's kernels may use (its
// run-time dispatch picks the best the CPU has otherwise); the test suite runs the GEMM and
// convolution tests under each capability the machine has (tools/test.sh). chorus's own loops pick
// their variant from the same setting (capability.h).
// CHORUS_ONEDNN=0 turns both off (im2col + Eigen GEMM for every dtype), for A/B measurements.
// 3x3 stride-1 convolutions with channels in multiples of 16 and at least 8x8 outputs per image use
// oneDNN's Winograd kernels where the CPU has them (AVX-512): [Winograd convolutions] in
// onednn_conv.cpp; CHORUS_ONEDNN_WINOGRAD=0 or set_winograd(false) keeps every shape direct.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernel_types.h"
#include "tensor/tensor.h"

namespace chorus::kernels::cpu::onednn {

// Applies CHORUS_CPU_CAPABILITY (once; every oneDNN call goes through it first). A value other
// than avx512, avx2 or default is a chorus::Error.
void configure();
// The instruction set oneDNN's kernels use here, e.g. "avx512_core_bf16" or "avx2".
std::string capability();

// Turns the oneDNN paths on or off at run time (benchmarks compare both in one run).
void set_enabled(bool on);
bool enabled();

// Whether 3x3 stride-1 convolutions may use Winograd kernels ([Winograd convolutions]; default on,
// CHORUS_ONEDNN_WINOGRAD=0 starts it off). Applies to shapes first run after the call.
void set_winograd(bool on);
bool winograd();

// set_winograd(on) for a scope; the setting before it comes back at its end (tests).
class WinogradScope {
 public:
  explicit WinogradScope(bool on) : before_(winograd()) { set_winograd(on); }
  ~WinogradScope() { set_winograd(before_); }
  WinogradScope(const WinogradScope&) = delete;
  WinogradScope& operator=(const WinogradScope&) = delete;

 private:
  bool before_;
};

// The oneDNN implementation this convolution's forward runs (its impl_info_str, e.g.
// "jit:avx512_core" or "jit_wino_4x3:avx512_core"), or "" where handles() is false. For tests.
std::string implementation(const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups);

// Whether the oneDNN path takes this convolution (float32, contiguous NCHW, enabled, and not one
// with only a handful of output positions in the whole batch).
bool handles(const Tensor& x, const Tensor& weight, const Window2d& w);

// Whether conv2d_backward computes this convolution's weight gradient as one product over the whole
// batch rather than through oneDNN ([Small-image weight gradients], onednn_conv.cpp): false where
// handles() is false. Makes the shape's primitives if they are not made yet. For tests.
bool weight_grad_by_gemm(const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups);

// Whether this convolution runs as chorus's whole-batch products over its input's columns, forward
// and both gradients ([Small-image convolutions], onednn_conv.cpp: at most 4 output positions per
// image): false where handles() is false. For tests.
bool by_gemm(const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups);

// As conv2d / conv2d_backward in conv.h.
void conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Window2d& w,
            int64_t groups);
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_out,
                     const Tensor& x, const Tensor& weight, const Window2d& w, int64_t groups);

}  // namespace chorus::kernels::cpu::onednn
