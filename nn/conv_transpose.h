// ConvTranspose1d/2d: PyTorch's transposed-convolution layers (options, weight layout
// [in, out/groups, k...], init, forward with an optional output_size) over F::conv_transpose*d.
#pragma once

#include <optional>
#include <vector>

#include "nn/functional/conv.h"
#include "nn/module.h"

namespace chorus::nn {

using functional::Pair;

// Chainable, as torch::nn::ConvTranspose2dOptions: ConvTranspose2dOptions(16, 8, 3).stride(2).output_padding(1).
struct ConvTranspose2dOptions {
  ConvTranspose2dOptions(int64_t in_channels, int64_t out_channels, Pair kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  ConvTranspose2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : ConvTranspose2dOptions(in_channels, out_channels, Pair{kernel_size, kernel_size}) {}
#define CHORUS_OPTION(type, name)                \
  ConvTranspose2dOptions& name(type value) {      \
    name##_ = value;                              \
    return *this;                                 \
  }                                               \
  type name() const { return name##_; }
  CHORUS_OPTION(Pair, stride)
  CHORUS_OPTION(Pair, padding)
  CHORUS_OPTION(Pair, output_padding)
  CHORUS_OPTION(Pair, dilation)
  CHORUS_OPTION(int64_t, groups)
  CHORUS_OPTION(bool, bias)
#undef CHORUS_OPTION
  ConvTranspose2dOptions& stride(int64_t s) { return stride(Pair{s, s}); }
  ConvTranspose2dOptions& padding(int64_t p) { return padding(Pair{p, p}); }
  ConvTranspose2dOptions& output_padding(int64_t p) { return output_padding(Pair{p, p}); }
  ConvTranspose2dOptions& dilation(int64_t d) { return dilation(Pair{d, d}); }
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  Pair kernel_size() const { return kernel_size_; }

 private:
  int64_t in_channels_, out_channels_;
  Pair kernel_size_;
  Pair stride_{1, 1}, padding_{0, 0}, output_padding_{0, 0}, dilation_{1, 1};
  int64_t groups_ = 1;
  bool bias_ = true;
};

// weight [in, out/groups, kH, kW] ~ kaiming_uniform(a = sqrt(5)) and bias ~ U(+-1/sqrt(fan_in)) with
// fan_in = weight.size(1) * kH * kW, as PyTorch's _ConvNd. forward(input, output_size) picks the
// output_padding that gives output_size (its last two entries; it may also name N and C), which
// must lie within stride - 1 of the smallest output; the output_padding option is then unused.
class ConvTranspose2d : public Module {
 public:
  explicit ConvTranspose2d(const ConvTranspose2dOptions& options);
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : ConvTranspose2d(ConvTranspose2dOptions(in_channels, out_channels, kernel_size)) {}
  Tensor forward(const Tensor& input) override { return forward(input, std::nullopt); }
  Tensor forward(const Tensor& input, const std::optional<std::vector<int64_t>>& output_size);
  void reset_parameters();

  ConvTranspose2dOptions options;
  Tensor weight, bias;  // bias undefined with bias(false)

 protected:
  std::string extra_repr() const override;
};

struct ConvTranspose1dOptions {
  ConvTranspose1dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
#define CHORUS_OPTION(type, name)                \
  ConvTranspose1dOptions& name(type value) {      \
    name##_ = value;                              \
    return *this;                                 \
  }                                               \
  type name() const { return name##_; }
  CHORUS_OPTION(int64_t, stride)
  CHORUS_OPTION(int64_t, padding)
  CHORUS_OPTION(int64_t, output_padding)
  CHORUS_OPTION(int64_t, dilation)
  CHORUS_OPTION(int64_t, groups)
  CHORUS_OPTION(bool, bias)
#undef CHORUS_OPTION
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  int64_t kernel_size() const { return kernel_size_; }

 private:
  int64_t in_channels_, out_channels_, kernel_size_;
  int64_t stride_ = 1, padding_ = 0, output_padding_ = 0, dilation_ = 1, groups_ = 1;
  bool bias_ = true;
};

// weight [in, out/groups, k]; init and output_size as ConvTranspose2d's (output_size: its last entry).
class ConvTranspose1d : public Module {
 public:
  explicit ConvTranspose1d(const ConvTranspose1dOptions& options);
  ConvTranspose1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : ConvTranspose1d(ConvTranspose1dOptions(in_channels, out_channels, kernel_size)) {}
  Tensor forward(const Tensor& input) override { return forward(input, std::nullopt); }
  Tensor forward(const Tensor& input, const std::optional<std::vector<int64_t>>& output_size);
  void reset_parameters();

  ConvTranspose1dOptions options;
  Tensor weight, bias;

 protected:
  std::string extra_repr() const override;
};

}  // namespace chorus::nn
