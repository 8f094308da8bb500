// Parameter initialization, as torch.nn.init: every function fills a tensor in place (without
// recording history) from the given generator or the default one, so manual_seed makes models
// reproducible. Layers use these for PyTorch's default initializations.
#pragma once

#include <string>
#include <utility>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace chorus::nn::init {

// (fan_in, fan_out) of a weight: dims 1 and 0 times the receptive field (product of dims >= 2).
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& t);
// Recommended gain for a nonlinearity: "linear", "conv2d", "sigmoid" -> 1, "tanh" -> 5/3,
// "relu" -> sqrt(2), "leaky_relu" -> sqrt(2 / (1 + param^2)), "selu" -> 3/4.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

Tensor& uniform_(Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
// Normal(mean, std) redrawn until inside [a, b] (PyTorch's defaults a=-2, b=2 are absolute bounds).
Tensor& trunc_normal_(Tensor& t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                      Generator* gen = nullptr);
Tensor& constant_(Tensor& t, double value);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
Tensor& xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
Tensor& xavier_normal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
// mode "fan_in" or "fan_out"; nonlinearity as calculate_gain, with `a` its parameter.
Tensor& kaiming_uniform_(Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                         const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor& kaiming_normal_(Tensor& t, double a = 0.0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);

}  // namespace chorus::nn::init
