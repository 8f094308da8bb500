#include "nn/activation.h"

#include "nn/functional/basic.h"
#include "tensor/ops.h"

namespace chorus::nn {

namespace F = functional;

GELU::GELU(std::string approx) : Module("GELU"), approximate(std::move(approx)) {
  if (approximate != "none" && approximate != "tanh") {
    fail("GELU: approximate must be 'none' or 'tanh', got '{}'", approximate);
  }
}

Tensor ReLU::forward(const Tensor& input) { return F::relu(input); }
Tensor GELU::forward(const Tensor& input) { return F::gelu(input, approximate); }
Tensor Tanh::forward(const Tensor& input) { return F::tanh(input); }
Tensor Sigmoid::forward(const Tensor& input) { return F::sigmoid(input); }
Tensor SiLU::forward(const Tensor& input) { return F::silu(input); }
Tensor Softmax::forward(const Tensor& input) { return F::softmax(input, dim); }
Tensor LogSoftmax::forward(const Tensor& input) { return F::log_softmax(input, dim); }
Tensor LeakyReLU::forward(const Tensor& input) { return F::leaky_relu(input, negative_slope); }
Tensor ELU::forward(const Tensor& input) { return F::elu(input, alpha); }
Tensor Softplus::forward(const Tensor& input) { return F::softplus(input, beta, threshold); }
Tensor Hardswish::forward(const Tensor& input) { return F::hardswish(input); }
Tensor Mish::forward(const Tensor& input) { return F::mish(input); }

PReLU::PReLU(int64_t num_parameters, double init) : Module("PReLU") {
  if (num_parameters < 1) fail("PReLU: num_parameters is {}; expected at least 1", num_parameters);
  weight = register_parameter("weight", full({num_parameters}, init));
}
Tensor PReLU::forward(const Tensor& input) { return F::prelu(input, weight); }

}  // namespace chorus::nn
