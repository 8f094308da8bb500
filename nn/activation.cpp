#include "nn/activation.h"

#include "nn/functional/basic.h"

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

}  // namespace chorus::nn
