#include "nn/conv.h"

#include <algorithm>
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
  if (opts.padding_kind() == functional::ConvPadding::Same && opts.stride() != Pair{1, 1}) {
    fail("Conv2d: padding=\"same\" is not supported for strided convolutions, got stride {}; expected (1, 1)",
         pair_str(opts.stride()));
  }
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
  const Pair d = options.dilation(), k = options.kernel_size();
  const bool same = options.padding_kind() == functional::ConvPadding::Same;
  if (options.padding_mode() != functional::PadMode::Constant) {
    // Pad in the mode first (left, right, top, bottom: F::pad's order), then convolve unpadded.
    std::vector<int64_t> amounts;
    if (same) {
      const auto h = functional::same_padding(k[0], d[0]), w = functional::same_padding(k[1], d[1]);
      amounts = {w[0], w[1], h[0], h[1]};
    } else {
      const Pair p = options.padding();
      amounts = {p[1], p[1], p[0], p[0]};
    }
    const bool any = std::any_of(amounts.begin(), amounts.end(), [](int64_t a) { return a > 0; });
    return functional::conv2d(any ? functional::pad(input, amounts, options.padding_mode()) : input, weight, bias,
                              options.stride(), Pair{0, 0}, d, options.groups());
  }
  if (options.padding_kind()) {
    return functional::conv2d(input, weight, bias, options.stride(), *options.padding_kind(), d, options.groups());
  }
  return functional::conv2d(input, weight, bias, options.stride(), options.padding(), d, options.groups());
}

std::string Conv2d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", options.in_channels(), options.out_channels(),
                              pair_str(options.kernel_size()), pair_str(options.stride()));
  if (options.padding_kind()) s += fmt::format(", padding={}", functional::conv_padding_name(*options.padding_kind()));
  if (options.padding() != Pair{0, 0}) s += fmt::format(", padding={}", pair_str(options.padding()));
  if (options.dilation() != Pair{1, 1}) s += fmt::format(", dilation={}", pair_str(options.dilation()));
  if (options.groups() != 1) s += fmt::format(", groups={}", options.groups());
  if (!options.bias()) s += ", bias=false";
  if (options.padding_mode() != functional::PadMode::Constant) {
    s += fmt::format(", padding_mode={}", functional::pad_mode_name(options.padding_mode()));
  }
  return s;
}

Conv1d::Conv1d(const Conv1dOptions& opts) : Module("Conv1d"), options(opts) {
  const int64_t in = opts.in_channels(), out = opts.out_channels(), groups = opts.groups();
  if (in <= 0 || out <= 0) fail("Conv1d: in_channels ({}) and out_channels ({}) must be positive", in, out);
  if (groups <= 0 || in % groups != 0 || out % groups != 0) {
    fail("Conv1d: in_channels ({}) and out_channels ({}) must be divisible by groups ({})", in, out, groups);
  }
  if (opts.kernel_size() <= 0) fail("Conv1d: kernel_size must be positive, got {}", opts.kernel_size());
  if (opts.padding_kind() == functional::ConvPadding::Same && opts.stride() != 1) {
    fail("Conv1d: padding=\"same\" is not supported for strided convolutions, got stride {}; expected 1",
         opts.stride());
  }
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
  const bool same = options.padding_kind() == functional::ConvPadding::Same;
  if (options.padding_mode() != functional::PadMode::Constant && (p > 0 || same)) {
    const auto amounts = same ? functional::same_padding(options.kernel_size(), options.dilation())
                              : std::array<int64_t, 2>{p, p};
    const Tensor padded =
        amounts[0] || amounts[1] ? functional::pad(input, {amounts[0], amounts[1]}, options.padding_mode()) : input;
    return functional::conv1d(padded, weight, bias, options.stride(), int64_t{0}, options.dilation(), options.groups());
  }
  if (options.padding_kind()) {
    return functional::conv1d(input, weight, bias, options.stride(), *options.padding_kind(), options.dilation(),
                              options.groups());
  }
  return functional::conv1d(input, weight, bias, options.stride(), p, options.dilation(), options.groups());
}

std::string Conv1d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size=({},), stride=({},)", options.in_channels(), options.out_channels(),
                              options.kernel_size(), options.stride());
  if (options.padding_kind()) s += fmt::format(", padding={}", functional::conv_padding_name(*options.padding_kind()));
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
