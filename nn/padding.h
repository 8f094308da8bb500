// Padding layers, as torch.nn.ZeroPad2d, ConstantPad1d/2d, ReflectionPad1d/2d, ReplicationPad1d/2d
// and CircularPad1d/2d: each holds its padding list (PyTorch's order, last dim first) and calls F::pad.
#pragma once

#include <array>
#include <vector>

#include "nn/functional/pad.h"
#include "nn/module.h"

namespace chorus::nn {

class PadLayer : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::vector<int64_t> padding;
  functional::PadMode mode;
  double value;

 protected:
  PadLayer(const char* name, std::vector<int64_t> padding, functional::PadMode mode, double value = 0.0);
  std::string extra_repr() const override;
};

// 1d layers take {left, right}; 2d layers {left, right, top, bottom}; one number pads every side.
#define CHORUS_PAD_LAYER(Name, sides, mode_value)                                                        \
  class Name : public PadLayer {                                                                         \
   public:                                                                                               \
    explicit Name(int64_t p) : Name(filled(p)) {}                                                        \
    explicit Name(std::array<int64_t, sides> p)                                                          \
        : PadLayer(#Name, std::vector<int64_t>(p.begin(), p.end()), functional::PadMode::mode_value) {} \
                                                                                                         \
   private:                                                                                              \
    static std::array<int64_t, sides> filled(int64_t p) {                                                \
      std::array<int64_t, sides> a;                                                                      \
      a.fill(p);                                                                                         \
      return a;                                                                                          \
    }                                                                                                    \
  };
CHORUS_PAD_LAYER(ZeroPad2d, 4, Constant)
CHORUS_PAD_LAYER(ReflectionPad1d, 2, Reflect)
CHORUS_PAD_LAYER(ReflectionPad2d, 4, Reflect)
CHORUS_PAD_LAYER(ReplicationPad1d, 2, Replicate)
CHORUS_PAD_LAYER(ReplicationPad2d, 4, Replicate)
CHORUS_PAD_LAYER(CircularPad1d, 2, Circular)
CHORUS_PAD_LAYER(CircularPad2d, 4, Circular)
#undef CHORUS_PAD_LAYER

class ConstantPad1d : public PadLayer {
 public:
  ConstantPad1d(int64_t p, double value) : ConstantPad1d(std::array<int64_t, 2>{p, p}, value) {}
  ConstantPad1d(std::array<int64_t, 2> p, double value)
      : PadLayer("ConstantPad1d", {p[0], p[1]}, functional::PadMode::Constant, value) {}
};

class ConstantPad2d : public PadLayer {
 public:
  ConstantPad2d(int64_t p, double value) : ConstantPad2d(std::array<int64_t, 4>{p, p, p, p}, value) {}
  ConstantPad2d(std::array<int64_t, 4> p, double value)
      : PadLayer("ConstantPad2d", {p[0], p[1], p[2], p[3]}, functional::PadMode::Constant, value) {}
};

}  // namespace chorus::nn
