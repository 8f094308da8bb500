// Where a tensor's memory lives: the CPU, or CUDA device i.
#pragma once

#include <string>

namespace chorus {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // the CUDA ordinal; always 0 for the CPU

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  // Parses "cpu", "cuda", "cuda:1"; anything else is a chorus::Error naming the string.
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu" or "cuda:0"
  bool operator==(const Device&) const = default;
};

inline const Device kCPU = Device::cpu();

}  // namespace chorus
