#include "nn/linear.h"

#include <cmath>

#include "nn/functional/basic.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias) : Module("Linear"), in_features(in), out_features(out) {
  if (in <= 0 || out <= 0) fail("Linear: in_features ({}) and out_features ({}) must be positive", in, out);
  weight = register_parameter("weight", empty({out, in}));
  if (with_bias) bias = register_parameter("bias", empty({out}));
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) { return functional::linear(input, weight, bias); }

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features, bias.defined());
}

Tensor Flatten::forward(const Tensor& input) { return flatten(input, start_dim, end_dim); }

}  // namespace chorus::nn
