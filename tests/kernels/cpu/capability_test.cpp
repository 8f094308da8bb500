// [ISA variants] (kernels/cpu/capability.h): the AVX-512 and AVX2 variants of the CPU loops compute
// the same results (bit for bit where the per-element arithmetic is the same: the functors and the
// optimizer updates; within a few units in the last place where the vector math library has its own
// AVX-512 versions), the variant in use follows CHORUS_CPU_CAPABILITY, and asking for a variant the
// CPU lacks is an error. tools/test.sh also runs this under each capability the machine has.
#include <catch2/catch.hpp>
#include <dnnl.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/onednn_conv.h"
#include "tests/kernels/cpu/capabilities.h"
#include "optim/optim.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace chorus;
namespace kc = chorus::kernels::cpu;
using chorus::testing::CapabilityGuard;

namespace {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
         std::memcmp(a.contiguous().raw_data_ptr(), b.contiguous().raw_data_ptr(), a.nbytes()) == 0;
}

}  // namespace

// [oneDNN's cap at load] (kernels/cpu/onednn_conv.cpp). This case must stay the file's first: it
// stands for another user of oneDNN in the process (libtorch's, in the benchmarks) that reaches the
// library before chorus's first product, and asks oneDNN for its instruction set, which fixes it.
TEST_CASE("CHORUS_CPU_CAPABILITY caps oneDNN even when something else used oneDNN first", "[kernels][isa]") {
  const char* env = std::getenv("CHORUS_CPU_CAPABILITY");
  const std::string want = env ? env : "";
  const dnnl_cpu_isa_t first = dnnl_get_effective_cpu_isa();  // oneDNN's ISA is now fixed for good
  // A product large enough for oneDNN (float32 goes to dnnl_sgemm or OpenBLAS by shape; either way it
  // must not throw), then the instruction set oneDNN reports.
  Tensor a = ones({64, 512}), b = ones({512, 256});
  Tensor c;
  REQUIRE_NOTHROW(c = matmul(a, b));
  CHECK(c[0][0].item<float>() == 512.0f);
  const std::string isa = kc::onednn::capability();
  INFO("CHORUS_CPU_CAPABILITY=" << want << ", oneDNN's ISA at the first query: " << static_cast<int>(first)
                                << ", now " << isa);
  if (want.empty()) {
    std::printf("CHORUS-SKIP: CHORUS_CPU_CAPABILITY is not set, so there is no cap to check (tools/test.sh --full's "
                "isa phases set it)\n");
    return;
  }
  if (want == "avx2") REQUIRE(isa == "avx2");
  else if (want == "default") REQUIRE(isa == "sse41");
  else REQUIRE(isa.rfind("avx512", 0) == 0);
}

TEST_CASE("the loops run the variant CHORUS_CPU_CAPABILITY asks for, or the best the CPU has", "[kernels][isa]") {
  const char* env = std::getenv("CHORUS_CPU_CAPABILITY");
  const std::string want = env ? env : "";
  INFO("CHORUS_CPU_CAPABILITY=" << want << ", AVX-512: " << kc::cpu_has_avx512());
  REQUIRE(std::string(kc::requested_capability()) == want);
  if (want == "avx512" || (want.empty() && kc::avx512_variant_available())) {
    REQUIRE(kc::cpu_capability() == kc::CpuCapability::kAvx512);
  } else {
    REQUIRE(kc::cpu_capability() == kc::CpuCapability::kAvx2);
  }
  CapabilityGuard guard;
  if (!kc::cpu_has_avx512()) {
    REQUIRE_THROWS_WITH(kc::set_cpu_capability(kc::CpuCapability::kAvx512), Catch::Contains("this CPU has no AVX-512"));
  } else if (!CHORUS_AVX512_VARIANT) {
    // A sanitizer build on an AVX-512 CPU: the variant is not there to switch to.
    REQUIRE_THROWS_WITH(kc::set_cpu_capability(kc::CpuCapability::kAvx512), Catch::Contains("sanitizer build"));
  } else {
    kc::set_cpu_capability(kc::CpuCapability::kAvx512);
    REQUIRE(kc::cpu_capability() == kc::CpuCapability::kAvx512);
  }
  kc::set_cpu_capability(kc::CpuCapability::kAvx2);
  REQUIRE(kc::cpu_capability() == kc::CpuCapability::kAvx2);
}

namespace {

// The cases below compare the variants; with one variant (a CPU without AVX-512, or a sanitizer
// build) there is nothing to compare, and they say so instead of passing.
bool one_variant_only() {
  if (chorus::testing::available_capabilities().size() > 1) return false;
  std::printf("CHORUS-SKIP: only the AVX2 variant can run here (%s): no second variant to compare it with\n",
              kc::cpu_has_avx512() ? "a sanitizer build compiles no AVX-512 variant" : "this CPU has no AVX-512");
  return true;
}

}  // namespace

TEST_CASE("the AVX-512 and AVX2 loops give the same elementwise results", "[kernels][isa]") {
  if (one_variant_only()) return;
  CapabilityGuard guard;
  manual_seed(11);
  // Lengths around the vector widths (16, 8 floats) and remainders, a large one split over threads.
  for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 1000, 70001}) {
    const Tensor a = randn({n}), b = randn({n}), c = rand({n}).gt(0.5);
    const Tensor ad = a.to(kFloat64), bd = b.to(kFloat64);
    // Pure arithmetic and comparisons (the same functor, the same FMA contraction): exact.
    const std::vector<std::pair<std::string, std::function<Tensor()>>> exact = {
        {"add alpha", [&] { return add(a, b, 2.5); }},
        {"mul", [&] { return mul(a, b); }},
        {"div", [&] { return div(a, b); }},
        {"maximum", [&] { return maximum(a, b); }},
        {"where", [&] { return where(c, a, b); }},
        {"relu", [&] { return a.relu(); }},
        {"float64 add", [&] { return add(ad, bd, -0.5); }},
        {"cast to float16", [&] { return a.to(kFloat16).to(kFloat32); }},
        {"cast to bfloat16", [&] { return a.to(kBFloat16).to(kFloat32); }},
        {"broadcast scalar", [&] { return add(a, 3.25); }},
    };
    // The vector math library (libmvec) has separate AVX2 and AVX-512 versions of these.
    const std::vector<std::pair<std::string, std::function<Tensor()>>> close = {
        {"exp", [&] { return exp(a); }},
        {"tanh", [&] { return tanh(a); }},
        {"sigmoid", [&] { return sigmoid(a); }},
        {"gelu", [&] { return gelu(a); }},
    };
    for (const auto& [name, op] : exact) {
      INFO(name << ", n = " << n);
      kc::set_cpu_capability(kc::CpuCapability::kAvx2);
      const Tensor reference = op();
      for (kc::CpuCapability cap : chorus::testing::available_capabilities()) {
        kc::set_cpu_capability(cap);
        REQUIRE(bitwise_equal(op(), reference));
      }
    }
    for (const auto& [name, op] : close) {
      INFO(name << ", n = " << n);
      kc::set_cpu_capability(kc::CpuCapability::kAvx2);
      const Tensor reference = op();
      for (kc::CpuCapability cap : chorus::testing::available_capabilities()) {
        kc::set_cpu_capability(cap);
        const Tensor got = op();
        REQUIRE((got - reference).abs().max().item<float>() <= 4e-7f * (1 + reference.abs().max().item<float>()));
      }
    }
  }
}

TEST_CASE("the AVX-512 and AVX2 optimizer updates are bit-identical", "[kernels][isa][optim]") {
  if (one_variant_only()) return;
  CapabilityGuard guard;
  for (const bool adam : {false, true}) {
    std::vector<Tensor> results;
    for (kc::CpuCapability cap : chorus::testing::available_capabilities()) {
      kc::set_cpu_capability(cap);
      manual_seed(5);
      Tensor w = randn({40001}).requires_grad_(true);
      std::unique_ptr<optim::Optimizer> opt;
      if (adam) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{w}, optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
      else opt = std::make_unique<optim::SGD>(std::vector<Tensor>{w}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
      for (int step = 0; step < 3; ++step) {
        opt->zero_grad();
        (w * w * w).sum().backward();
        opt->step();
      }
      results.push_back(w.detach().clone());
    }
    INFO((adam ? "AdamW" : "SGD nesterov"));
    for (const Tensor& r : results) REQUIRE(bitwise_equal(r, results[0]));
  }
}
