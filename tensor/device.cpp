#include "tensor/device.h"

#include "tensor/error.h"

namespace chorus {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    int index = 0;
    for (size_t i = 5; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9' || index > 1000000) {
        fail("Device: cannot parse '{}' (expected 'cpu', 'cuda' or 'cuda:N')", text);
      }
      index = index * 10 + (text[i] - '0');
    }
    return cuda(index);
  }
  fail("Device: cannot parse '{}' (expected 'cpu', 'cuda' or 'cuda:N')", text);
}

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

}  // namespace chorus
