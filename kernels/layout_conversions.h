// The layout-conversion counter: every copy the kernel seam runs (kernels::copy, on any device) whose
// source and destination are dense in different memory formats, NCHW into channels-last or back, is
// counted with its shape, dtype, device and the phase that asked for it (a backward node's name, or
// "forward"). A channels-last model that trains at NCHW speed or worse is usually paying for such
// copies; this names them on the CPU or sim before a GPU is at hand. A tensor dense in both layouts
// ([N, C, 1, 1], [N, 1, H, W] ...) never counts. The kernels' own internal copies (the CPU's NCHW
// helpers, kernels/cpu/nchw_copies.h) do not pass the seam and are not counted: on CUDA cuDNN takes
// NHWC itself, so the seam's count is what a device step would pay too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::layout_conversions {

// One kind of conversion and how often it ran since the last reset().
struct Kind {
  std::string phase;  // "forward", or the backward node that asked ("ConvolutionBackward", ...)
  std::string from;   // "contiguous" or "channels_last"
  std::string to;
  Shape sizes;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  int64_t count = 0;
};

struct Stats {
  int64_t count = 0;  // conversions
  int64_t bytes = 0;  // bytes written by them
  std::vector<Kind> kinds;  // in order of first occurrence
  // One line per kind: "3 x ConvolutionBackward: float32 [8, 64, 56, 56] on sim:0 channels_last -> contiguous".
  std::string str() const;
};

Stats stats();
void reset();

// The label conversions made on this thread get while it lives (the autograd engine names the node
// whose backward runs); nested scopes restore the outer label.
class PhaseScope {
 public:
  explicit PhaseScope(const std::string& phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  const std::string* previous_;
};

namespace detail {
// Called by kernels::copy before every copy: counts it when it changes the memory format.
void note_copy(const Tensor& dst, const Tensor& src);
}  // namespace detail

}  // namespace chorus::layout_conversions
