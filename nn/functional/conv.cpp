// conv2d and pooling: argument checks with PyTorch's messages in spirit (what was given, what was
// expected), the CPU kernels of kernels/cpu/conv.h, and their backward nodes.
#include "nn/functional/conv.h"

#include "autograd/node.h"
#include "autograd/ops/common.h"
#include "kernels/dispatch.h"
#include "nn/functional/pad.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

using autograd::SavedTensor;
using kernels::Window2d;

namespace {

std::string pair_str(Pair p) { return fmt::format("({}, {})", p[0], p[1]); }

void check_positive(const char* op, const char* what, Pair p, int64_t min_value) {
  if (p[0] < min_value || p[1] < min_value) {
    fail("{}: {} must be >= {} in both dims, got {}", op, what, min_value, pair_str(p));
  }
}

// A 3-D input [C, H, W] is one unbatched sample, as in PyTorch; it runs as a batch of one.
Tensor batched_input(const Tensor& input, const char* op, bool& unbatched) {
  ops::check_defined(input, op, "input");
  ops::check_kernels(input, op);
  if (input.dim() != 3 && input.dim() != 4) {
    fail("{}: expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got shape {}", op, shape_str(input.sizes()));
  }
  if (!input.is_floating_point()) {
    fail("{}: expected a floating-point input, got {}", op, dtype_name(input.dtype()));
  }
  unbatched = input.dim() == 3;
  return unbatched ? input.unsqueeze(0) : input;
}

Tensor unbatch(const Tensor& out, bool unbatched) { return unbatched ? out.squeeze(0) : out; }

// Output extent of a window op, as PyTorch's pooling_output_shape / conv formula.
int64_t out_extent(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (span < 0 ? -1 : span / stride) + 1;
  // With ceil_mode the last window must start inside the input or its left padding.
  if (ceil_mode && out > 0 && (out - 1) * stride >= in + pad) --out;
  return out;
}

// The kernel, stride, padding and dilation of a window, per dim.
void set_geometry(Window2d& w, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  w.kernel_h = kernel[0];
  w.kernel_w = kernel[1];
  w.stride_h = stride[0];
  w.stride_w = stride[1];
  w.pad_h = padding[0];
  w.pad_w = padding[1];
  w.dilation_h = dilation[0];
  w.dilation_w = dilation[1];
}

Window2d make_window(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation,
                     bool ceil_mode) {
  Window2d w;
  w.in_h = x.size(2);
  w.in_w = x.size(3);
  set_geometry(w, kernel, stride, padding, dilation);
  w.out_h = out_extent(w.in_h, w.kernel_h, w.pad_h, w.stride_h, w.dilation_h, ceil_mode);
  w.out_w = out_extent(w.in_w, w.kernel_w, w.pad_w, w.stride_w, w.dilation_w, ceil_mode);
  if (w.out_h <= 0 || w.out_w <= 0) {
    fail("{}: input of spatial size ({}, {}) is too small for kernel {} with padding {}, dilation {} (output "
         "would be ({}, {}))",
         op, w.in_h, w.in_w, pair_str(kernel), pair_str(padding), pair_str(dilation), w.out_h, w.out_w);
  }
  return w;
}

void check_pool_args(const char* op, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  check_positive(op, "kernel_size", kernel, 1);
  check_positive(op, "stride", stride, 1);
  check_positive(op, "dilation", dilation, 1);
  check_positive(op, "padding", padding, 0);
  if (padding[0] * 2 > kernel[0] || padding[1] * 2 > kernel[1]) {
    fail("{}: padding {} must be at most half of kernel_size {}", op, pair_str(padding), pair_str(kernel));
  }
}

Tensor compute_view(const Tensor& t, DType cd) { return ops::cast(alias_without_history(t), cd).contiguous(); }

// [Pooling operands] The pooling kernels take their tensors dense in NCHW or channels-last (the CPU
// kernels compute through NCHW copies, the CUDA ones hand channels-last tensors to cuDNN as NHWC), so
// the op layer keeps the input's layout and gives a channels-last input a channels-last output and
// gradient, as PyTorch does; and it keeps float16/bfloat16 where the device's kernels take them
// (product_dtype: CUDA, whose kernels run cuDNN on 16-bit data or widen for their own kernels).
MemoryFormat pool_format(const Tensor& input) {
  return input.suggest_memory_format() == MemoryFormat::ChannelsLast ? MemoryFormat::ChannelsLast
                                                                     : MemoryFormat::Contiguous;
}

Tensor pool_operand(const Tensor& t, DType cd, MemoryFormat format) {
  return ops::cast(alias_without_history(t), cd).contiguous(format);
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding, Pair dilation,
              int64_t groups) {
  if (auto low = autocast::lower_precision({&input, &weight, &bias})) {
    return conv2d(autocast::cast(input, *low), autocast::cast(weight, *low), autocast::cast(bias, *low), stride, padding,
                  dilation, groups);
  }
  bool unbatched = false;
  const Tensor in4 = batched_input(input, "conv2d", unbatched);
  ops::check_defined(weight, "conv2d", "weight");
  ops::check_same_device(input, weight, "conv2d");
  if (weight.dim() != 4) {
    fail("conv2d: expected a 4-D weight [C_out, C_in/groups, kH, kW], got shape {}", shape_str(weight.sizes()));
  }
  if (groups < 1) fail("conv2d: groups must be positive, got {}", groups);
  check_positive("conv2d", "stride", stride, 1);
  check_positive("conv2d", "dilation", dilation, 1);
  check_positive("conv2d", "padding", padding, 0);
  const int64_t c_in = in4.size(1), c_out = weight.size(0);
  if (c_in % groups != 0 || c_out % groups != 0) {
    fail("conv2d: input channels {} and output channels {} must both be divisible by groups {}", c_in, c_out,
         groups);
  }
  if (weight.size(1) * groups != c_in) {
    fail("conv2d: input of shape {} has {} channels, but weight of shape {} with groups={} expects {} channels",
         shape_str(input.sizes()), c_in, shape_str(weight.sizes()), groups, weight.size(1) * groups);
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != c_out)) {
    fail("conv2d: bias must have shape [{}], got {}", c_out, shape_str(bias.sizes()));
  }
  if (input.dtype() != weight.dtype() || (bias.defined() && bias.dtype() != input.dtype())) {
    fail("conv2d: input ({}), weight ({}) and bias must have the same dtype", dtype_name(input.dtype()),
         dtype_name(weight.dtype()));
  }
  const Window2d w = make_window("conv2d", in4, {weight.size(2), weight.size(3)}, stride, padding, dilation, false);
  const DType cd = ops::product_dtype(input);
  const bool native_half = cd != compute_dtype(input.dtype());  // float16 / bfloat16 on CUDA
  // Channels-last when the input or the weight is (as PyTorch's cuDNN and oneDNN convolutions): the
  // kernels then get NHWC input and output and a KRSC (channels-last) weight.
  const MemoryFormat format = in4.suggest_memory_format() == MemoryFormat::ChannelsLast ||
                                      weight.suggest_memory_format() == MemoryFormat::ChannelsLast
                                  ? MemoryFormat::ChannelsLast
                                  : MemoryFormat::Contiguous;
  Tensor x = ops::cast(alias_without_history(in4), cd).contiguous(format);
  Tensor wt = ops::cast(alias_without_history(weight), cd).contiguous(format);
  Tensor b = bias.defined() ? compute_view(bias, cd) : Tensor();
  Tensor out = make_tensor({x.size(0), c_out, w.out_h, w.out_w}, cd, input.device(), format);
  kernels::conv2d(out, x, wt, b, w, groups);
  out = ops::cast(out, input.dtype());
  if (autograd::any_requires_grad({&in4, &weight, &bias})) {
    const bool need_x = in4.requires_grad(), need_w = weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    // [Saved as stored] A 16-bit input the kernels compute in float32 (the CPU, sim) is saved as
    // given, not as its float32 copy, and widened again for the backward: the float32 copies of
    // every convolution's input and weight made bfloat16 autocast hold more memory than float32.
    const bool widened = cd != input.dtype();
    SavedTensor sx(widened ? in4 : x), sw(widened ? weight : wt);
    autograd::record("ConvolutionBackward", {in4, weight, bias}, {out}, [=](const TensorList& g) -> TensorList {
      Tensor xv = sx.unpack("conv2d"), wv = sw.unpack("conv2d");
      if (widened) {
        xv = ops::cast(alias_without_history(xv), cd).contiguous(format);
        wv = ops::cast(alias_without_history(wv), cd).contiguous(format);
      }
      Tensor gv = ops::cast(g[0], xv.dtype()).contiguous(format);
      Tensor gx = need_x ? make_tensor(xv.sizes(), xv.dtype(), xv.device(), format) : Tensor();
      Tensor gw = need_w ? make_tensor(wv.sizes(), xv.dtype(), xv.device(), format) : Tensor();
      // A half-precision bias gradient is a float32 sum over batch and positions, rounded once.
      Tensor gb = need_b && !native_half ? make_tensor({wv.size(0)}, xv.dtype(), xv.device()) : Tensor();
      kernels::conv2d_backward(gx, gw, gb, gv, xv, wv, w, groups);
      if (need_b && native_half) gb = ops::cast(chorus::sum(ops::cast(gv, kFloat32), {0, 2, 3}), xv.dtype());
      return {gx, gw, gb};
    });
  }
  return unbatch(out, unbatched);
}

// [Transposed convolution] conv_transpose2d(x, W) is the gradient of y = conv2d(z, W) with respect
// to z, evaluated at grad_y = x: the conv whose input is the transposed output and whose output is
// x. So the forward is conv2d_backward's input-gradient path, and its backward is two conv paths:
// grad_x is a plain conv2d of grad_out with W (the adjoint of the adjoint), grad_W is conv2d's
// weight gradient with the roles swapped (conv input = grad_out, conv output gradient = x).
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding,
                        Pair output_padding, int64_t groups, Pair dilation) {
  if (auto low = autocast::lower_precision({&input, &weight, &bias})) {
    return conv_transpose2d(autocast::cast(input, *low), autocast::cast(weight, *low), autocast::cast(bias, *low),
                            stride, padding, output_padding, groups, dilation);
  }
  const char* op = "conv_transpose2d";
  bool unbatched = false;
  const Tensor in4 = batched_input(input, op, unbatched);
  ops::check_defined(weight, op, "weight");
  ops::check_same_device(input, weight, op);
  if (weight.dim() != 4) {
    fail("conv_transpose2d: expected a 4-D weight [C_in, C_out/groups, kH, kW], got shape {}",
         shape_str(weight.sizes()));
  }
  if (groups < 1) fail("conv_transpose2d: groups must be positive, got {}", groups);
  check_positive(op, "stride", stride, 1);
  check_positive(op, "dilation", dilation, 1);
  check_positive(op, "padding", padding, 0);
  check_positive(op, "output_padding", output_padding, 0);
  for (int d = 0; d < 2; ++d) {
    if (output_padding[d] >= stride[d] && output_padding[d] >= dilation[d]) {
      fail("conv_transpose2d: output_padding {} must be smaller than either stride {} or dilation {}",
           pair_str(output_padding), pair_str(stride), pair_str(dilation));
    }
  }
  const int64_t c_in = in4.size(1);
  if (weight.size(0) != c_in) {
    fail("conv_transpose2d: input of shape {} has {} channels, but weight of shape {} expects {} (weight is "
         "[C_in, C_out/groups, kH, kW])",
         shape_str(input.sizes()), c_in, shape_str(weight.sizes()), weight.size(0));
  }
  if (c_in % groups != 0) {
    fail("conv_transpose2d: input channels {} must be divisible by groups {}", c_in, groups);
  }
  const int64_t c_out = weight.size(1) * groups;
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != c_out)) {
    fail("conv_transpose2d: bias must have shape [{}], got {}", c_out, shape_str(bias.sizes()));
  }
  if (input.dtype() != weight.dtype() || (bias.defined() && bias.dtype() != input.dtype())) {
    fail("conv_transpose2d: input ({}), weight ({}) and bias must have the same dtype", dtype_name(input.dtype()),
         dtype_name(weight.dtype()));
  }
  Window2d w;  // of the conv this is the gradient of: its input is our output, its output our input
  w.out_h = in4.size(2);
  w.out_w = in4.size(3);
  set_geometry(w, {weight.size(2), weight.size(3)}, stride, padding, dilation);
  w.in_h = (w.out_h - 1) * w.stride_h - 2 * w.pad_h + w.dilation_h * (w.kernel_h - 1) + output_padding[0] + 1;
  w.in_w = (w.out_w - 1) * w.stride_w - 2 * w.pad_w + w.dilation_w * (w.kernel_w - 1) + output_padding[1] + 1;
  if (w.in_h <= 0 || w.in_w <= 0) {
    fail("conv_transpose2d: input of spatial size ({}, {}) with kernel ({}, {}), stride {}, padding {}, dilation {} "
         "and output_padding {} gives an empty output ({}, {})",
         w.out_h, w.out_w, w.kernel_h, w.kernel_w, pair_str(stride), pair_str(padding), pair_str(dilation),
         pair_str(output_padding), w.in_h, w.in_w);
  }
  // With output_padding >= stride (allowed when smaller than dilation) the conv over our output
  // would have more positions than our input, so the kernels cannot take it as is: compute the
  // unpadded full output instead and crop/zero-extend it to size (the extra rows get no input).
  if (output_padding[0] >= stride[0] || output_padding[1] >= stride[1]) {
    Tensor full = conv_transpose2d(in4, weight, Tensor(), stride, {0, 0}, {0, 0}, groups, dilation);
    Tensor out = pad(full, {-padding[1], output_padding[1] - padding[1], -padding[0], output_padding[0] - padding[0]});
    if (bias.defined()) out = add(out, bias.view({1, c_out, 1, 1}));
    return unbatch(out, unbatched);
  }
  const DType cd = compute_dtype(input.dtype());
  Tensor x = compute_view(in4, cd);
  Tensor wt = compute_view(weight, cd);
  Tensor out = make_tensor({x.size(0), c_out, w.in_h, w.in_w}, cd, input.device());
  // The conv's input is only read for its weight gradient; `out` stands in for its shape.
  kernels::conv2d_backward(out, Tensor(), Tensor(), x, out, wt, w, groups);
  if (bias.defined()) out.add_(compute_view(bias, cd).view({1, c_out, 1, 1}));
  out = ops::cast(out, input.dtype());
  if (autograd::any_requires_grad({&in4, &weight, &bias})) {
    const bool need_x = in4.requires_grad(), need_w = weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    const bool widened = cd != input.dtype();  // [Saved as stored] in conv2d
    SavedTensor sx(widened ? in4 : x), sw(widened ? weight : wt);
    autograd::record("ConvolutionBackward", {in4, weight, bias}, {out}, [=](const TensorList& g) -> TensorList {
      Tensor xv = sx.unpack(op), wv = sw.unpack(op);
      if (widened) {
        xv = compute_view(xv, cd);
        wv = compute_view(wv, cd);
      }
      Tensor gv = ops::cast(g[0], xv.dtype()).contiguous();
      Tensor gx, gw, gb;
      if (need_x) {
        gx = make_tensor(xv.sizes(), xv.dtype(), xv.device());
        kernels::conv2d(gx, gv, wv, Tensor(), w, groups);
      }
      if (need_w) {
        gw = make_tensor(wv.sizes(), xv.dtype(), xv.device());
        kernels::conv2d_backward(Tensor(), gw, Tensor(), xv, gv, wv, w, groups);
      }
      if (need_b) gb = sum(gv, {0, 2, 3});
      return {gx, gw, gb};
    });
  }
  return unbatch(out, unbatched);
}

Tensor max_pool2d(const Tensor& input, Pair kernel_size, std::optional<Pair> stride, Pair padding, Pair dilation,
                  bool ceil_mode) {
  const char* op = "max_pool2d";
  bool unbatched = false;
  const Tensor in4 = batched_input(input, op, unbatched);
  const Pair st = stride.value_or(kernel_size);
  check_pool_args(op, kernel_size, st, padding, dilation);
  const Window2d w = make_window(op, in4, kernel_size, st, padding, dilation, ceil_mode);
  // With dilation a window's taps can all fall in the padding (padding is checked against the
  // undilated kernel, as PyTorch's): such a window has no element, and its gradient had nowhere to
  // go (the backward wrote it one past its row: into the next plane, or past the buffer). PyTorch
  // outputs -inf there (pytorch/pytorch#114216); refused here, naming the window.
  auto check_taps = [&](int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t k, int64_t dil, const char* axis) {
    for (int64_t o = 0; o < out; ++o) {
      bool any = false;
      for (int64_t i = 0; i < k && !any; ++i) any = o * stride - pad + i * dil >= 0 && o * stride - pad + i * dil < in;
      if (!any) {
        fail("{}: the window of output {} {} covers only padding (input {} {}, kernel {}, stride {}, padding {}, "
             "dilation {}); expected every window to reach the input",
             op, axis, o, axis == std::string("row") ? "height" : "width", in, k, stride, pad, dil);
      }
    }
  };
  check_taps(w.out_h, w.in_h, w.stride_h, w.pad_h, w.kernel_h, w.dilation_h, "row");
  check_taps(w.out_w, w.in_w, w.stride_w, w.pad_w, w.kernel_w, w.dilation_w, "column");
  const DType cd = ops::product_dtype(in4);
  const MemoryFormat format = pool_format(in4);
  Tensor x = pool_operand(in4, cd, format);
  Tensor out = make_tensor({x.size(0), x.size(1), w.out_h, w.out_w}, cd, input.device(), format);
  kernels::max_pool2d(out, Tensor(), x, w);
  out = ops::cast(out, input.dtype());
  if (autograd::any_requires_grad({&in4})) {
    const Shape in_shape = in4.sizes();
    // [Max pool saves x only] No int64 indices (8 bytes per output, 4x a bfloat16 output) and no
    // output: the backward pools the saved input again (a memory-bound pass, freed at once) and finds
    // each output's element from the input and that output, as cuDNN's backward needs
    // (kernels/cuda/cudnn_pool_plan.h). The input is usually alive anyway (ReLU saves its output),
    // and, as in PyTorch, the result may be modified in place before backward.
    SavedTensor sx(in4);
    const Shape out_shape = out.sizes();
    autograd::record("MaxPool2DBackward", {in4}, {out}, [=](const TensorList& g) -> TensorList {
      Tensor xv = pool_operand(sx.unpack(op), cd, format);
      Tensor ov = make_tensor(out_shape, cd, xv.device(), format);
      kernels::max_pool2d(ov, Tensor(), xv, w);
      Tensor gv = ops::cast(g[0], cd).contiguous(format);
      Tensor gx = make_tensor(in_shape, cd, gv.device(), format);
      kernels::max_pool2d_backward(gx, gv, Tensor(), xv, ov, w);
      return {gx};
    });
  }
  return unbatch(out, unbatched);
}

Tensor avg_pool2d(const Tensor& input, Pair kernel_size, std::optional<Pair> stride, Pair padding, bool ceil_mode,
                  bool count_include_pad) {
  bool unbatched = false;
  const Tensor in4 = batched_input(input, "avg_pool2d", unbatched);
  const Pair st = stride.value_or(kernel_size);
  check_pool_args("avg_pool2d", kernel_size, st, padding, {1, 1});
  const Window2d w = make_window("avg_pool2d", in4, kernel_size, st, padding, {1, 1}, ceil_mode);
  const DType cd = ops::product_dtype(in4);
  const MemoryFormat format = pool_format(in4);
  Tensor x = pool_operand(in4, cd, format);
  Tensor out = make_tensor({x.size(0), x.size(1), w.out_h, w.out_w}, cd, input.device(), format);
  kernels::avg_pool2d(out, x, w, count_include_pad);
  out = ops::cast(out, input.dtype());
  if (autograd::any_requires_grad({&in4})) {
    const Shape in_shape = in4.sizes();
    autograd::record("AvgPool2DBackward", {in4}, {out}, [=](const TensorList& g) -> TensorList {
      Tensor gv = ops::cast(g[0], cd).contiguous(format);
      Tensor gx = make_tensor(in_shape, cd, gv.device(), format);
      kernels::avg_pool2d_backward(gx, gv, w, count_include_pad);
      return {gx};
    });
  }
  return unbatch(out, unbatched);
}

Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size) {
  bool unbatched = false;
  const Tensor in4 = batched_input(input, "adaptive_avg_pool2d", unbatched);
  check_positive("adaptive_avg_pool2d", "output_size", output_size, 1);
  const int64_t in_h = in4.size(2), in_w = in4.size(3), out_h = output_size[0], out_w = output_size[1];
  if (in_h == 0 || in_w == 0) {
    fail("adaptive_avg_pool2d: input of shape {} has an empty spatial dim", shape_str(input.sizes()));
  }
  const DType cd = ops::product_dtype(in4);
  const MemoryFormat format = pool_format(in4);
  Tensor x = pool_operand(in4, cd, format);
  Tensor out = make_tensor({x.size(0), x.size(1), out_h, out_w}, cd, input.device(), format);
  kernels::adaptive_avg_pool2d(out, x, in_h, in_w, out_h, out_w);
  out = ops::cast(out, input.dtype());
  if (autograd::any_requires_grad({&in4})) {
    const Shape in_shape = in4.sizes();
    autograd::record("AdaptiveAvgPool2DBackward", {in4}, {out}, [=](const TensorList& g) -> TensorList {
      Tensor gv = ops::cast(g[0], cd).contiguous(format);
      Tensor gx = make_tensor(in_shape, cd, gv.device(), format);
      kernels::adaptive_avg_pool2d_backward(gx, gv, in_h, in_w, out_h, out_w);
      return {gx};
    });
  }
  return unbatch(out, unbatched);
}

}  // namespace chorus::nn::functional
