#include "nn/padding.h"

namespace chorus::nn {

PadLayer::PadLayer(const char* name, std::vector<int64_t> p, functional::PadMode m, double v)
    : Module(name), padding(std::move(p)), mode(m), value(v) {}

Tensor PadLayer::forward(const Tensor& input) { return functional::pad(input, padding, mode, value); }

std::string PadLayer::extra_repr() const {
  std::string s = "padding=(";
  for (size_t i = 0; i < padding.size(); ++i) s += (i ? ", " : "") + std::to_string(padding[i]);
  s += ")";
  if (mode == functional::PadMode::Constant && value != 0.0) s += fmt::format(", value={}", value);
  return s;
}

}  // namespace chorus::nn
