#include "nn/upsample.h"

#include <fmt/format.h>

namespace chorus::nn {

// Checked here, not only at the first forward, so a misconfigured model fails where it is built.
Upsample::Upsample(functional::InterpolateOptions o) : Module("Upsample"), options(std::move(o)) {
  if (options.size.empty() == options.scale_factor.empty()) fail("Upsample: give exactly one of size and scale_factor");
  if (options.mode == functional::InterpolateMode::Nearest && options.align_corners) {
    fail("Upsample: align_corners only applies to the linear modes, not nearest");
  }
}

std::string Upsample::extra_repr() const {
  std::string s = options.size.empty() ? fmt::format("scale_factor={}", fmt::join(options.scale_factor, ", "))
                                       : fmt::format("size={}", fmt::join(options.size, ", "));
  return s + fmt::format(", mode={}", functional::interpolate_mode_name(options.mode));
}

PixelShuffle::PixelShuffle(int64_t r) : Module("PixelShuffle"), upscale_factor(r) {
  if (r <= 0) fail("PixelShuffle: upscale_factor must be positive, got {}", r);
}

PixelUnshuffle::PixelUnshuffle(int64_t r) : Module("PixelUnshuffle"), downscale_factor(r) {
  if (r <= 0) fail("PixelUnshuffle: downscale_factor must be positive, got {}", r);
}

}  // namespace chorus::nn
