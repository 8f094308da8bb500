#include "nn/conv.h"

#include <cmath>

#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::nn {

namespace {
std::string pair_str(Pair p) { return fmt::format("({}, {})", p[0], p[1]); }
}  // namespace

Conv2d::Conv2d(const Conv2dOptions& opts) : Module("Conv2d"), options(opts) {
  const int64_t in = opts.in_channels(), out = opts.out_channels(), groups = opts.groups();
  if (in <= 0 || out <= 0) fail("Conv2d: in_channels ({}) and out_channels ({}) must be positive", in, out);
  if (groups <= 0 || in % groups != 0 || out % groups != 0) {
    fail("Conv2d: in_channels ({}) and out_channels ({}) must be divisible by groups ({})", in, out, groups);
  }
  const Pair k = opts.kernel_size();
  if (k[0] <= 0 || k[1] <= 0) fail("Conv2d: kernel_size must be positive, got {}", pair_str(k));
  weight = register_parameter("weight", empty({out, in / groups, k[0], k[1]}));
  if (opts.bias()) bias = register_parameter("bias", empty({out}));
  reset_parameters();
}

void Conv2d::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const auto [fan_in, fan_out] = init::fan_in_and_fan_out(weight);
    (void)fan_out;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  return functional::conv2d(input, weight, bias, options.stride(), options.padding(), options.dilation(),
                            options.groups());
}

std::string Conv2d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", options.in_channels(), options.out_channels(),
                              pair_str(options.kernel_size()), pair_str(options.stride()));
  if (options.padding() != Pair{0, 0}) s += fmt::format(", padding={}", pair_str(options.padding()));
  if (options.dilation() != Pair{1, 1}) s += fmt::format(", dilation={}", pair_str(options.dilation()));
  if (options.groups() != 1) s += fmt::format(", groups={}", options.groups());
  if (!options.bias()) s += ", bias=false";
  return s;
}

Conv1d::Conv1d(const Conv1dOptions& opts) : Module("Conv1d"), options(opts) {
  const int64_t in = opts.in_channels(), out = opts.out_channels(), groups = opts.groups();
  if (in <= 0 || out <= 0) fail("Conv1d: in_channels ({}) and out_channels ({}) must be positive", in, out);
  if (groups <= 0 || in % groups != 0 || out % groups != 0) {
    fail("Conv1d: in_channels ({}) and out_channels ({}) must be divisible by groups ({})", in, out, groups);
  }
  if (opts.kernel_size() <= 0) fail("Conv1d: kernel_size must be positive, got {}", opts.kernel_size());
  weight = register_parameter("weight", empty({out, in / groups, opts.kernel_size()}));
  if (opts.bias()) bias = register_parameter("bias", empty({out}));
  reset_parameters();
}

void Conv1d::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const auto [fan_in, fan_out] = init::fan_in_and_fan_out(weight);
    (void)fan_out;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv1d::forward(const Tensor& input) {
  const int64_t p = options.padding();
  if (options.padding_mode() != functional::PadMode::Constant && p > 0) {
    return functional::conv1d(functional::pad(input, {p, p}, options.padding_mode()), weight, bias, options.stride(), 0,
                              options.dilation(), options.groups());
  }
  return functional::conv1d(input, weight, bias, options.stride(), p, options.dilation(), options.groups());
}

std::string Conv1d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size=({},), stride=({},)", options.in_channels(), options.out_channels(),
                              options.kernel_size(), options.stride());
  if (options.padding() != 0) s += fmt::format(", padding=({},)", options.padding());
  if (options.dilation() != 1) s += fmt::format(", dilation=({},)", options.dilation());
  if (options.groups() != 1) s += fmt::format(", groups={}", options.groups());
  if (!options.bias()) s += ", bias=false";
  if (options.padding_mode() != functional::PadMode::Constant) {
    s += fmt::format(", padding_mode={}", functional::pad_mode_name(options.padding_mode()));
  }
  return s;
}

MaxPool2d::MaxPool2d(Pair k, std::optional<Pair> s, Pair p, Pair d, bool ceil)
    : Module("MaxPool2d"), kernel_size(k), stride(s), padding(p), dilation(d), ceil_mode(ceil) {}
Tensor MaxPool2d::forward(const Tensor& input) {
  return functional::max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode);
}
std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation={}, ceil_mode={}", pair_str(kernel_size),
                     pair_str(stride.value_or(kernel_size)), pair_str(padding), pair_str(dilation), ceil_mode);
}

AvgPool2d::AvgPool2d(Pair k, std::optional<Pair> s, Pair p, bool ceil, bool include_pad)
    : Module("AvgPool2d"), kernel_size(k), stride(s), padding(p), ceil_mode(ceil), count_include_pad(include_pad) {}
Tensor AvgPool2d::forward(const Tensor& input) {
  return functional::avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad);
}
std::string AvgPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", pair_str(kernel_size),
                     pair_str(stride.value_or(kernel_size)), pair_str(padding));
}

std::string AdaptiveAvgPool2d::extra_repr() const { return fmt::format("output_size={}", pair_str(output_size)); }

}  // namespace chorus::nn
