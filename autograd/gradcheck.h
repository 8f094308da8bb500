// gradcheck: compares the gradients autograd computes for f against central finite differences,
// element by element of the full Jacobian, in float64. Every differentiable op is checked with it.
#pragma once

#include <functional>

#include "tensor/tensor.h"

namespace chorus::autograd {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-3;
};

// `f` maps the inputs to one output tensor of any shape. Inputs that require grad are checked
// (they should be float64). Returns true, or throws chorus::Error naming the input, the Jacobian
// entry, and both values at the worst mismatch.
bool gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
               const GradcheckOptions& options = {});

}  // namespace chorus::autograd
