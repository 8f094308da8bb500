// Activation layers: thin modules over the functional forms, so they can sit in a Sequential.
#pragma once

#include <string>

#include "nn/module.h"

namespace chorus::nn {

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& input) override;
  std::string approximate;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& input) override;
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : Module("LeakyReLU"), negative_slope(negative_slope) {}
  Tensor forward(const Tensor& input) override;
  double negative_slope;
};

class ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : Module("ELU"), alpha(alpha) {}
  Tensor forward(const Tensor& input) override;
  double alpha;
};

class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0) : Module("Softplus"), beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& input) override;
  double beta, threshold;
};

class Hardswish : public Module {
 public:
  Hardswish() : Module("Hardswish") {}
  Tensor forward(const Tensor& input) override;
};

class Mish : public Module {
 public:
  Mish() : Module("Mish") {}
  Tensor forward(const Tensor& input) override;
};

// A learnt negative slope: one for all channels (num_parameters = 1) or one per channel.
class PReLU : public Module {
 public:
  explicit PReLU(int64_t num_parameters = 1, double init = 0.25);
  Tensor forward(const Tensor& input) override;
  Tensor weight;
};

class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : Module("Softmax"), dim(dim) {}
  Tensor forward(const Tensor& input) override;
  int64_t dim;
};

class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : Module("LogSoftmax"), dim(dim) {}
  Tensor forward(const Tensor& input) override;
  int64_t dim;
};

}  // namespace chorus::nn
