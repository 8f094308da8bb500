// What the tests of the CPU loops' instruction-set variants share: the variants this CPU can run
// (and this build has: a sanitizer build compiles only AVX2's, kernels/cpu/capability.h),
// and a guard that restores the variant in use when a test started.
#pragma once

#include <vector>

#include "kernels/cpu/capability.h"

namespace chorus::testing {

inline std::vector<kernels::cpu::CpuCapability> available_capabilities() {
  std::vector<kernels::cpu::CpuCapability> caps = {kernels::cpu::CpuCapability::kAvx2};
  if (kernels::cpu::avx512_variant_available()) caps.push_back(kernels::cpu::CpuCapability::kAvx512);
  return caps;
}

struct CapabilityGuard {
  kernels::cpu::CpuCapability saved = kernels::cpu::cpu_capability();
  ~CapabilityGuard() { kernels::cpu::set_cpu_capability(saved); }
};

}  // namespace chorus::testing
