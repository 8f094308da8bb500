// Where a tensor's memory lives: the CPU, CUDA device i, or simulated device i ("sim": a CUDA-like
// device run on the CPU by tensor/sim/, so CI exercises streams, events and device memory without a GPU).
#pragma once

#include <cstdint>
#include <string>

namespace chorus {

enum class DeviceType : uint8_t { CPU, CUDA, Sim };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // the device ordinal; always 0 for the CPU

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  static Device sim(int index = 0) { return {DeviceType::Sim, index}; }
  // Parses "cpu", "cuda", "cuda:1", "sim", "sim:1"; anything else is a chorus::Error naming the string.
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_sim() const { return type == DeviceType::Sim; }
  std::string str() const;  // "cpu", "cuda:0", "sim:1"
  bool operator==(const Device&) const = default;
  // A string literal or std::string converts, so `t.to("sim:0")` reads as in PyTorch.
  Device() = default;
  Device(DeviceType t, int i) : type(t), index(i) {}
  Device(const char* text) : Device(parse(text)) {}         // NOLINT: implicit on purpose
  Device(const std::string& text) : Device(parse(text)) {}  // NOLINT
};

inline const Device kCPU = Device::cpu();

// The device type as messages name it: "CPU", "CUDA", "sim".
const char* device_type_name(DeviceType type);

}  // namespace chorus
