// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_.
#pragma once

#include <limits>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::optim {

// Scales every .grad by max_norm / (total_norm + 1e-6) when the total norm (over all gradients
// together; norm_type may be infinity) exceeds max_norm. Returns the total norm before clipping.
// A non-finite norm with error_if_nonfinite -> chorus::Error.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
// Clamps every .grad into [-clip_value, clip_value].
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace chorus::optim
