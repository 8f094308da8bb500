// Throughput of chorus's CPU pointwise kernels (kernels/cpu/pointwise.cpp, copy.cpp) on 4M random
// elements: arithmetic, transcendental, comparison, where, casts to and from float16/bfloat16, and
// random fills, in ns per element (median of 21 after warm-up) at 1 and 2 threads. Run it before
// and after touching the functors of kernels/shared/pointwise_math.h or the loops of loops.h.
//
//   bazel run -c opt //tests/bench:pointwise_bench
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tests/bench/bench_util.h"

using namespace chorus;

int main() {
  const int64_t n = 4 << 20;
  manual_seed(7);
  Tensor a = randn({n}), b = randn({n}), pos = rand({n}).add(0.5);
  Tensor cond = gt(a, b);
  Tensor ah = a.to(kFloat16), abf = a.to(kBFloat16);
  Tensor a2 = randn({2048, 2048}), row = randn({2048});
  Tensor out;
  struct Case {
    std::string name;
    std::function<void()> run;
  };
  const std::vector<Case> cases = {
      {"add a + b", [&] { out = add(a, b); }},
      {"add a + 2.5 * b", [&] { out = add(a, b, 2.5); }},
      {"mul a * 3 (scalar)", [&] { out = mul(a, 3.0); }},
      {"add [2048,2048] + row (broadcast)", [&] { out = add(a2, row); }},
      {"add a^T + a (transposed)", [&] { out = add(a2.t(), a2); }},
      {"maximum(a, b)", [&] { out = maximum(a, b); }},
      {"pow(a, b) (pos)", [&] { out = pow(pos, b); }},
      {"pow(a, 3)", [&] { out = pow(a, 3.0); }},
      {"gt(a, b)", [&] { out = gt(a, b); }},
      {"where(c, a, b)", [&] { out = where(cond, a, b); }},
      {"clamp(a, -1, 1)", [&] { out = clamp(a, -1.0, 1.0); }},
      {"relu", [&] { out = relu(a); }},
      {"exp", [&] { out = exp(a); }},
      {"tanh", [&] { out = tanh(a); }},
      {"sigmoid", [&] { out = sigmoid(a); }},
      {"gelu (erf)", [&] { out = gelu(a); }},
      {"float32 -> float16", [&] { out = a.to(kFloat16); }},
      {"float16 -> float32", [&] { out = ah.to(kFloat32); }},
      {"float32 -> bfloat16", [&] { out = a.to(kBFloat16); }},
      {"bfloat16 -> float32", [&] { out = abf.to(kFloat32); }},
      {"float32 -> float64", [&] { out = a.to(kFloat64); }},
      {"rand (float32)", [&] { out = rand({n}); }},
      {"randn (float32)", [&] { out = randn({n}); }},
      {"randn (float64)", [&] { out = randn({n}, TensorOptions{.dtype = kFloat64}); }},
  };
  {  // Half a second of work first: the CPU leaves its idle clock before anything is timed.
    const double until = bench::now_s() + 0.5;
    while (bench::now_s() < until) out = exp(a);
  }
  std::printf("CPU pointwise kernels on %lld float32 elements, ns per element (median of 21)\n\n",
              static_cast<long long>(n));
  std::printf("| op | 1 thread | 2 threads |\n|---|---|---|\n");
  for (const Case& c : cases) {
    double ns[2];
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      ns[threads - 1] = bench::median_time(c.run, 3, 21) / static_cast<double>(n) * 1e9;
    }
    std::printf("| %s | %.3f | %.3f |\n", c.name.c_str(), ns[0], ns[1]);
    std::fflush(stdout);
  }
  return 0;
}
