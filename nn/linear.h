// Linear, Identity and Flatten: the layers that reshape or map features without spatial structure.
#pragma once

#include "nn/module.h"

namespace chorus::nn {

// y = x W^T + b, W [out_features, in_features]; PyTorch's init: W ~ kaiming_uniform(a = sqrt(5)),
// i.e. U(-1/sqrt(in), 1/sqrt(in)), and b ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  void reset_parameters();

  int64_t in_features, out_features;
  Tensor weight, bias;  // bias undefined when constructed with bias = false

 protected:
  std::string extra_repr() const override;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& input) override;
  int64_t start_dim, end_dim;
};

}  // namespace chorus::nn
