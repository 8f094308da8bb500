// Automatic mixed precision, as torch.autocast. Inside an AutocastGuard for a device type, ops on
// that device's tensors pick their precision:
//   lower precision (the guard's dtype: bfloat16 by default on the CPU, float16 on cuda and sim):
//     mm, bmm, addmm, matmul, linear, conv2d;
//   float32: softmax, log_softmax, layer_norm, group_norm, cross_entropy, nll_loss,
//     mse_loss, binary_cross_entropy_with_logits, sum, mean;
//   everything else runs in its inputs' dtype (a float32 and a bfloat16 operand promote to float32).
//   batch_norm and sync_batch_norm are not listed, as in PyTorch's CUDA and CPU policies: a
//   bfloat16/float16 input is normalized as stored with the float32 weight, bias and running
//   statistics (statistics and parameter gradients in float32, the output and input gradient in the
//   input's dtype), which keeps the activations of a convolution network in 16 bits.
// Only float32 (and float16/bfloat16) tensors are cast; float64 and integer tensors never are.
// Weights stay float32 ("master weights"): the casts are recorded by autograd, so a float32 leaf
// gets a float32 gradient. The lower-precision copy of a leaf that requires grad (a weight) is made
// once per outermost guard and reused (as PyTorch's autocast cache; a weight updated in place since is
// cast again). The backward pass runs with autocast off (each gradient in the dtype its forward
// op ran in), so call backward() inside or outside the guard alike.
//
//   {
//     chorus::autocast::AutocastGuard amp(chorus::DeviceType::CPU, chorus::kBFloat16);
//     Tensor loss = nn::functional::cross_entropy(model->forward(x), y);  // float32 loss
//   }
//   loss.backward();  // float32 gradients in the float32 parameters
#pragma once

#include <initializer_list>
#include <optional>

#include "tensor/tensor.h"

namespace chorus::autocast {

// bfloat16 on the CPU, float16 on cuda and sim (PyTorch's defaults).
DType default_dtype(DeviceType device);
bool is_enabled(DeviceType device);
// The lower-precision dtype autocast uses on `device` (whether or not it is enabled).
DType get_dtype(DeviceType device);
// Drops the cached lower-precision copies of weights (the outermost guard does this on exit).
void clear_cache();

class AutocastGuard {
 public:
  // dtype: float16 or bfloat16 (chorus::Error otherwise); enabled = false turns autocast off for
  // `device` inside the guard (a region of an autocast scope that must run in float32).
  explicit AutocastGuard(DeviceType device, std::optional<DType> dtype = std::nullopt, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_;
  bool previous_enabled_;
  DType previous_dtype_;
};

// Turns autocast off for every device type in its scope (the autograd engine holds one while it
// computes gradients); restores the previous state after.
class DisableGuard {
 public:
  DisableGuard();
  ~DisableGuard();
  DisableGuard(const DisableGuard&) = delete;
  DisableGuard& operator=(const DisableGuard&) = delete;

 private:
  unsigned previous_mask_;
};

// ---- for ops (and for user code writing an op, as PyTorch's custom_fwd) ----

// True when autocast is on for any device type on this thread (the ops' fast check).
bool any_enabled();
// The dtype a lower-precision op should run in, when autocast is on for the device of the first
// defined tensor and some defined floating tensor among them is not already in that dtype and is
// not float64; nullopt otherwise (the op then runs as it would without autocast).
std::optional<DType> lower_precision(std::initializer_list<const Tensor*> tensors);
// kFloat32 when autocast is on for the first defined tensor's device and some of them is float16 or
// bfloat16; nullopt otherwise.
std::optional<DType> full_precision(std::initializer_list<const Tensor*> tensors);
// `t` in `dtype` when it is a float32/float16/bfloat16 tensor (others unchanged; undefined stays
// undefined), differentiably; weights' lower-precision copies come from the cache.
Tensor cast(const Tensor& t, DType dtype);

}  // namespace chorus::autocast
