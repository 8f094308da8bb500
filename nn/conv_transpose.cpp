#include "nn/conv_transpose.h"

#include <fmt/format.h>

#include <cmath>

#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::nn {

namespace {

std::string pair_str(Pair p) { return fmt::format("({}, {})", p[0], p[1]); }

void check_channels(const char* layer, int64_t in, int64_t out, int64_t groups) {
  if (in <= 0 || out <= 0) fail("{}: in_channels ({}) and out_channels ({}) must be positive", layer, in, out);
  if (groups <= 0 || in % groups != 0 || out % groups != 0) {
    fail("{}: in_channels ({}) and out_channels ({}) must be divisible by groups ({})", layer, in, out, groups);
  }
}

// As PyTorch's _ConvNd.reset_parameters: fan_in is weight.size(1) times the kernel's size, which
// for a transposed conv is out_channels/groups (not in_channels).
void reset_conv_parameters(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

// The output_padding of each spatial dim that makes the output output_size, as PyTorch's
// _ConvTransposeNd._output_padding: output_size names the spatial dims, optionally after N and C.
std::vector<int64_t> padding_for_size(const char* layer, const Tensor& input, const std::vector<int64_t>& output_size,
                                      const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                                      const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation) {
  const size_t dims = kernel.size();
  if (output_size.size() != dims && output_size.size() != dims + 2) {
    fail("{}: output_size must have {} or {} elements (spatial dims, optionally after N and C), got {}", layer, dims,
         dims + 2, fmt::join(output_size, ", "));
  }
  std::vector<int64_t> result(dims);
  for (size_t d = 0; d < dims; ++d) {
    const int64_t in = input.size(input.dim() - static_cast<int64_t>(dims) + static_cast<int64_t>(d));
    const int64_t want = output_size[output_size.size() - dims + d];
    const int64_t smallest = (in - 1) * stride[d] - 2 * padding[d] + dilation[d] * (kernel[d] - 1) + 1;
    const int64_t largest = smallest + stride[d] - 1;
    if (want < smallest || want > largest) {
      fail("{}: requested an output size of [{}], but valid sizes range from {} to {} in dim {} (for an input of "
           "shape {})",
           layer, fmt::join(output_size, ", "), smallest, largest, d, shape_str(input.sizes()));
    }
    result[d] = want - smallest;
  }
  return result;
}

}  // namespace

ConvTranspose2d::ConvTranspose2d(const ConvTranspose2dOptions& opts) : Module("ConvTranspose2d"), options(opts) {
  const int64_t in = opts.in_channels(), out = opts.out_channels(), groups = opts.groups();
  check_channels("ConvTranspose2d", in, out, groups);
  const Pair k = opts.kernel_size();
  if (k[0] <= 0 || k[1] <= 0) fail("ConvTranspose2d: kernel_size must be positive, got {}", pair_str(k));
  weight = register_parameter("weight", empty({in, out / groups, k[0], k[1]}));
  if (opts.bias()) bias = register_parameter("bias", empty({out}));
  reset_parameters();
}

void ConvTranspose2d::reset_parameters() { reset_conv_parameters(weight, bias); }

Tensor ConvTranspose2d::forward(const Tensor& input, const std::optional<std::vector<int64_t>>& output_size) {
  Pair output_padding = options.output_padding();
  if (output_size) {
    const Pair k = options.kernel_size(), s = options.stride(), p = options.padding(), d = options.dilation();
    const std::vector<int64_t> op = padding_for_size("ConvTranspose2d", input, *output_size, {k[0], k[1]},
                                                     {s[0], s[1]}, {p[0], p[1]}, {d[0], d[1]});
    output_padding = {op[0], op[1]};
  }
  return functional::conv_transpose2d(input, weight, bias, options.stride(), options.padding(), output_padding,
                                      options.groups(), options.dilation());
}

std::string ConvTranspose2d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", options.in_channels(), options.out_channels(),
                              pair_str(options.kernel_size()), pair_str(options.stride()));
  if (options.padding() != Pair{0, 0}) s += fmt::format(", padding={}", pair_str(options.padding()));
  if (options.output_padding() != Pair{0, 0}) s += fmt::format(", output_padding={}", pair_str(options.output_padding()));
  if (options.dilation() != Pair{1, 1}) s += fmt::format(", dilation={}", pair_str(options.dilation()));
  if (options.groups() != 1) s += fmt::format(", groups={}", options.groups());
  if (!options.bias()) s += ", bias=false";
  return s;
}

ConvTranspose1d::ConvTranspose1d(const ConvTranspose1dOptions& opts) : Module("ConvTranspose1d"), options(opts) {
  const int64_t in = opts.in_channels(), out = opts.out_channels(), groups = opts.groups();
  check_channels("ConvTranspose1d", in, out, groups);
  if (opts.kernel_size() <= 0) fail("ConvTranspose1d: kernel_size must be positive, got {}", opts.kernel_size());
  weight = register_parameter("weight", empty({in, out / groups, opts.kernel_size()}));
  if (opts.bias()) bias = register_parameter("bias", empty({out}));
  reset_parameters();
}

void ConvTranspose1d::reset_parameters() { reset_conv_parameters(weight, bias); }

Tensor ConvTranspose1d::forward(const Tensor& input, const std::optional<std::vector<int64_t>>& output_size) {
  int64_t output_padding = options.output_padding();
  if (output_size) {
    output_padding = padding_for_size("ConvTranspose1d", input, *output_size, {options.kernel_size()},
                                      {options.stride()}, {options.padding()}, {options.dilation()})[0];
  }
  return functional::conv_transpose1d(input, weight, bias, options.stride(), options.padding(), output_padding,
                                      options.groups(), options.dilation());
}

std::string ConvTranspose1d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size=({},), stride=({},)", options.in_channels(), options.out_channels(),
                              options.kernel_size(), options.stride());
  if (options.padding() != 0) s += fmt::format(", padding=({},)", options.padding());
  if (options.output_padding() != 0) s += fmt::format(", output_padding=({},)", options.output_padding());
  if (options.dilation() != 1) s += fmt::format(", dilation=({},)", options.dilation());
  if (options.groups() != 1) s += fmt::format(", groups={}", options.groups());
  if (!options.bias()) s += ", bias=false";
  return s;
}

}  // namespace chorus::nn
