// BERT-mini-sized attention (4 heads, 128 tokens, head dim 64; batch 8 and 16), float32 on the CPU:
// the formula BERT's self-attention spelled out before F::scaled_dot_product_attention existed
// (matmul, scale, + additive mask, softmax, matmul) against scaled_dot_product_attention with each
// kind of mask and with dropout, forward alone and forward + backward (gradients of q, k, v),
// median of 15 after 3 warm-up runs, at 1 and 2 threads. Figures in docs/benchmarks.md.
//
//   bazel run -c opt //tests/bench:attention_bench
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/functional.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"

using namespace chorus;
namespace F = nn::functional;

int main() {
  const int64_t heads = 4, tokens = 128, head_dim = 64;
  std::printf("Attention [B, %lld heads, %lld tokens, head dim %lld], float32, ms (median of 15)\n\n",
              static_cast<long long>(heads), static_cast<long long>(tokens), static_cast<long long>(head_dim));
  std::printf("| B | attention | forward, 1 thread | fwd+bwd, 1 thread | forward, 2 threads | fwd+bwd, 2 threads |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int64_t batch : {8, 16}) {
    manual_seed(5);
    const Shape shape{batch, heads, tokens, head_dim};
    Tensor q = randn(shape).requires_grad_(), k = randn(shape).requires_grad_(), v = randn(shape).requires_grad_();
    Tensor grad_out = randn(shape);
    // BERT's padding mask: the last quarter of every other sequence is padding.
    std::vector<int64_t> length_values;
    for (int64_t b = 0; b < batch; ++b) length_values.push_back(b % 2 == 0 ? tokens : tokens * 3 / 4);
    Tensor lengths = tensor(length_values, Shape{batch, 1, 1, 1});
    Tensor keep = lt(arange(tokens).reshape({1, 1, 1, tokens}), lengths);
    Tensor additive = mul(sub(keep.to(kFloat32), 1.0), 1e9);  // 0 or -1e9, as BERT's
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    struct Case {
      std::string name;
      std::function<Tensor()> run;
    };
    const std::vector<Case> cases = {
        {"spelled out (BERT before), additive mask",
         [&] { return matmul(softmax(add(mul(matmul(q, k.transpose(-1, -2)), scale), additive), -1), v); }},
        {"sdpa, no mask", [&] { return F::scaled_dot_product_attention(q, k, v); }},
        {"sdpa, additive mask (BERT now)", [&] { return F::scaled_dot_product_attention(q, k, v, {.attn_mask = additive}); }},
        {"sdpa, bool mask", [&] { return F::scaled_dot_product_attention(q, k, v, {.attn_mask = keep}); }},
        {"sdpa, causal", [&] { return F::scaled_dot_product_attention(q, k, v, {.is_causal = true}); }},
        {"sdpa, additive mask, dropout 0.1",
         [&] { return F::scaled_dot_product_attention(q, k, v, {.attn_mask = additive, .dropout_p = 0.1}); }},
    };
    {  // Half a second of work first: the CPU leaves its idle clock before anything is timed.
      const double until = bench::now_s() + 0.5;
      while (bench::now_s() < until) cases[0].run();
    }
    for (const Case& c : cases) {
      double ms[2][2];
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        ms[threads - 1][0] = 1e3 * bench::median_time([&] { NoGradGuard no_grad; c.run(); }, 3, 15);
        ms[threads - 1][1] = 1e3 * bench::median_time(
                                       [&] {
                                         c.run().backward(grad_out);
                                         for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
                                       },
                                       3, 15);
      }
      std::printf("| %lld | %s | %.2f | %.2f | %.2f | %.2f |\n", static_cast<long long>(batch), c.name.c_str(), ms[0][0],
                  ms[0][1], ms[1][0], ms[1][1]);
      std::fflush(stdout);
    }
  }
  return 0;
}
