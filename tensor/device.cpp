#include "tensor/device.h"

#include "tensor/error.h"

namespace chorus {

Device Device::parse(const std::string& text) {
  auto bad = [&]() { fail("Device: cannot parse '{}' (expected 'cpu', 'cuda', 'cuda:N', 'sim' or 'sim:N')", text); };
  if (text == "cpu") return cpu();
  for (auto [prefix, type] : {std::pair<const char*, DeviceType>{"cuda", DeviceType::CUDA}, {"sim", DeviceType::Sim}}) {
    const std::string p = prefix;
    if (text == p) return {type, 0};
    if (text.rfind(p + ":", 0) == 0 && text.size() > p.size() + 1) {
      int index = 0;
      for (size_t i = p.size() + 1; i < text.size(); ++i) {
        if (text[i] < '0' || text[i] > '9' || index > 1000000) bad();
        index = index * 10 + (text[i] - '0');
      }
      return {type, index};
    }
  }
  bad();
  return cpu();
}

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return "CPU";
    case DeviceType::CUDA: return "CUDA";
    case DeviceType::Sim: return "sim";
  }
  return "?";
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return fmt::format("cuda:{}", index);
    case DeviceType::Sim: return fmt::format("sim:{}", index);
  }
  return "?";
}

}  // namespace chorus
