// Convolution and pooling layers (NCHW), with PyTorch's constructor options and default init.
#pragma once

#include <optional>

#include "nn/functional/conv.h"
#include "nn/functional/pad.h"
#include "nn/module.h"

namespace chorus::nn {

using functional::Pair;

// Chainable options, as torch::nn::Conv2dOptions: Conv2dOptions(3, 32, 3).stride(2).padding(1).bias(false).
// padding also takes functional::ConvPadding::Same / Valid (PyTorch's padding="same" / "valid");
// padding_mode pads with F::pad (Reflect, Replicate, Circular) before an unpadded convolution.
struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, Pair kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  Conv2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : Conv2dOptions(in_channels, out_channels, Pair{kernel_size, kernel_size}) {}
#define CHORUS_OPTION(type, name)            \
  Conv2dOptions& name(type value) {           \
    name##_ = value;                          \
    return *this;                             \
  }                                           \
  type name() const { return name##_; }
  CHORUS_OPTION(Pair, stride)
  CHORUS_OPTION(Pair, dilation)
  CHORUS_OPTION(int64_t, groups)
  CHORUS_OPTION(bool, bias)
  CHORUS_OPTION(functional::PadMode, padding_mode)
#undef CHORUS_OPTION
  Conv2dOptions& stride(int64_t s) { return stride(Pair{s, s}); }
  Conv2dOptions& padding(Pair p) {
    padding_ = p;
    padding_kind_.reset();
    return *this;
  }
  Conv2dOptions& padding(int64_t p) { return padding(Pair{p, p}); }
  // padding="valid" / "same" (functional::ConvPadding); padding() is then {0, 0}.
  Conv2dOptions& padding(functional::ConvPadding p) {
    padding_ = {0, 0};
    padding_kind_ = p;
    return *this;
  }
  Pair padding() const { return padding_; }
  std::optional<functional::ConvPadding> padding_kind() const { return padding_kind_; }
  Conv2dOptions& dilation(int64_t d) { return dilation(Pair{d, d}); }
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  Pair kernel_size() const { return kernel_size_; }

 private:
  int64_t in_channels_, out_channels_;
  Pair kernel_size_;
  Pair stride_{1, 1}, padding_{0, 0}, dilation_{1, 1};
  int64_t groups_ = 1;
  bool bias_ = true;
  functional::PadMode padding_mode_ = functional::PadMode::Constant;  // zeros
  std::optional<functional::ConvPadding> padding_kind_;
};

// weight [out, in/groups, kH, kW] ~ kaiming_uniform(a = sqrt(5)); bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : Conv2d(Conv2dOptions(in_channels, out_channels, kernel_size)) {}
  Tensor forward(const Tensor& input) override;
  void reset_parameters();

  Conv2dOptions options;
  Tensor weight, bias;  // bias undefined with bias(false)

 protected:
  std::string extra_repr() const override;
};

// Chainable like Conv2dOptions, with single numbers; padding_mode pads with F::pad (Reflect,
// Replicate, Circular) before an unpadded convolution, as PyTorch's padding_mode.
struct Conv1dOptions {
  Conv1dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
#define CHORUS_OPTION(type, name) \
  Conv1dOptions& name(type value) { \
    name##_ = value;                \
    return *this;                   \
  }                                 \
  type name() const { return name##_; }
  CHORUS_OPTION(int64_t, stride)
  CHORUS_OPTION(int64_t, dilation)
  CHORUS_OPTION(int64_t, groups)
  CHORUS_OPTION(bool, bias)
  CHORUS_OPTION(functional::PadMode, padding_mode)
#undef CHORUS_OPTION
  Conv1dOptions& padding(int64_t p) {
    padding_ = p;
    padding_kind_.reset();
    return *this;
  }
  // padding="valid" / "same" (functional::ConvPadding); padding() is then 0.
  Conv1dOptions& padding(functional::ConvPadding p) {
    padding_ = 0;
    padding_kind_ = p;
    return *this;
  }
  int64_t padding() const { return padding_; }
  std::optional<functional::ConvPadding> padding_kind() const { return padding_kind_; }
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  int64_t kernel_size() const { return kernel_size_; }

 private:
  std::optional<functional::ConvPadding> padding_kind_;
  int64_t in_channels_, out_channels_, kernel_size_;
  int64_t stride_ = 1, padding_ = 0, dilation_ = 1, groups_ = 1;
  bool bias_ = true;
  functional::PadMode padding_mode_ = functional::PadMode::Constant;  // zeros
};

// weight [out, in/groups, k] and bias initialized as Conv2d's (kaiming_uniform(a = sqrt(5))).
class Conv1d : public Module {
 public:
  explicit Conv1d(const Conv1dOptions& options);
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : Conv1d(Conv1dOptions(in_channels, out_channels, kernel_size)) {}
  Tensor forward(const Tensor& input) override;
  void reset_parameters();

  Conv1dOptions options;
  Tensor weight, bias;  // bias undefined with bias(false)

 protected:
  std::string extra_repr() const override;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Pair kernel_size, std::optional<Pair> stride = std::nullopt, Pair padding = {0, 0},
                     Pair dilation = {1, 1}, bool ceil_mode = false);
  explicit MaxPool2d(int64_t kernel_size) : MaxPool2d(Pair{kernel_size, kernel_size}) {}
  Tensor forward(const Tensor& input) override;
  Pair kernel_size;
  std::optional<Pair> stride;
  Pair padding, dilation;
  bool ceil_mode;

 protected:
  std::string extra_repr() const override;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Pair kernel_size, std::optional<Pair> stride = std::nullopt, Pair padding = {0, 0},
                     bool ceil_mode = false, bool count_include_pad = true);
  explicit AvgPool2d(int64_t kernel_size) : AvgPool2d(Pair{kernel_size, kernel_size}) {}
  Tensor forward(const Tensor& input) override;
  Pair kernel_size;
  std::optional<Pair> stride;
  Pair padding;
  bool ceil_mode, count_include_pad;

 protected:
  std::string extra_repr() const override;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Pair output_size) : Module("AdaptiveAvgPool2d"), output_size(output_size) {}
  explicit AdaptiveAvgPool2d(int64_t output_size) : AdaptiveAvgPool2d(Pair{output_size, output_size}) {}
  Tensor forward(const Tensor& input) override { return functional::adaptive_avg_pool2d(input, output_size); }
  Pair output_size;

 protected:
  std::string extra_repr() const override;
};

}  // namespace chorus::nn
