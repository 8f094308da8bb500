// CPU capability selection (see capability.h).
#include "kernels/cpu/capability.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "tensor/error.h"

namespace chorus::kernels::cpu {

namespace detail {
std::atomic<int> current_capability{-1};

int resolve_capability() {
  static const int chosen = [] {
    const std::string want = requested_capability();
    if (want == "avx512" && !cpu_has_avx512())
      fail("CHORUS_CPU_CAPABILITY=avx512, but this CPU has no AVX-512 (F, BW, VL and DQ); expected avx2 or default here");
    if (want == "avx512" && !CHORUS_AVX512_VARIANT)
      fail("CHORUS_CPU_CAPABILITY=avx512, but this is a sanitizer build, which compiles only the AVX2 variant of the "
           "loops (kernels/cpu/capability.h); expected avx2 or default here");
    const bool avx512 = want.empty() ? avx512_variant_available() : want == "avx512";
    return static_cast<int>(avx512 ? CpuCapability::kAvx512 : CpuCapability::kAvx2);
  }();
  int expected = -1;
  current_capability.compare_exchange_strong(expected, chosen, std::memory_order_relaxed);
  return current_capability.load(std::memory_order_relaxed);
}
}  // namespace detail

bool cpu_has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

const char* requested_capability() {
  static const std::string value = [] {
    const char* v = std::getenv("CHORUS_CPU_CAPABILITY");
    const std::string s = v ? v : "";
    if (!s.empty() && s != "avx512" && s != "avx2" && s != "default")
      fail("CHORUS_CPU_CAPABILITY='{}': expected avx512, avx2 or default", s);
    return s;
  }();
  return value.c_str();
}

CpuCapability cpu_capability() { return cpu_capability_fast(); }

void set_cpu_capability(CpuCapability capability) {
  if (capability == CpuCapability::kAvx512 && !cpu_has_avx512())
    fail("set_cpu_capability(avx512): this CPU has no AVX-512 (F, BW, VL and DQ); expected avx2");
  if (capability == CpuCapability::kAvx512 && !CHORUS_AVX512_VARIANT)
    fail("set_cpu_capability(avx512): this is a sanitizer build, which compiles only the AVX2 variant of the loops "
         "(kernels/cpu/capability.h); expected avx2");
  detail::resolve_capability();  // the environment is validated once either way
  detail::current_capability.store(static_cast<int>(capability), std::memory_order_relaxed);
}

const char* capability_name(CpuCapability capability) {
  return capability == CpuCapability::kAvx512 ? "avx512" : "avx2";
}

}  // namespace chorus::kernels::cpu
