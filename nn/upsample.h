// Upsample, PixelShuffle and PixelUnshuffle layers over nn/functional/upsample.h:
// nn::Upsample({.scale_factor = {2.0}, .mode = F::InterpolateMode::Bilinear}).
#pragma once

#include "nn/functional/upsample.h"
#include "nn/module.h"

namespace chorus::nn {

class Upsample : public Module {
 public:
  explicit Upsample(functional::InterpolateOptions options);
  Tensor forward(const Tensor& input) override { return functional::interpolate(input, options); }
  functional::InterpolateOptions options;

 protected:
  std::string extra_repr() const override;
};

class PixelShuffle : public Module {
 public:
  explicit PixelShuffle(int64_t upscale_factor);
  Tensor forward(const Tensor& input) override { return functional::pixel_shuffle(input, upscale_factor); }
  int64_t upscale_factor;

 protected:
  std::string extra_repr() const override { return fmt::format("upscale_factor={}", upscale_factor); }
};

class PixelUnshuffle : public Module {
 public:
  explicit PixelUnshuffle(int64_t downscale_factor);
  Tensor forward(const Tensor& input) override { return functional::pixel_unshuffle(input, downscale_factor); }
  int64_t downscale_factor;

 protected:
  std::string extra_repr() const override { return fmt::format("downscale_factor={}", downscale_factor); }
};

}  // namespace chorus::nn
