// The work of a BERT-mini training step (batch 8 x 128 tokens, hidden 256, 4 heads, FFN 1024, the
// masked-LM head over 146 positions of a 30522-word vocabulary) that is not a matrix product, op by
// op, chorus against libtorch 1.13 in the same process at 1 thread: ms per call (median of 21
// after 5 warm-up calls) and the ratio. The whole-step benchmark (train_step_bench) moves by 10-30%
// between runs on a shared VM; op against op in one process says which op to work on. One row is
// not BERT's: GPT-2 small's causal attention at 2 x 1024 tokens (the fused CPU attention's case,
// nn/functional/attention.cpp; libtorch's side takes seconds a call).
//
//   bazel run -c opt //tests/bench:transformer_ops_bench
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "nn/functional.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/libtorch_peer.h"

using namespace chorus;
namespace F = nn::functional;
using autograd::EnableGradGuard;

namespace {

struct Row {
  std::string name;
  std::function<void()> chorus_op, torch_op;
};

void run(const std::vector<Row>& rows, const std::string& only, int reps) {
  std::printf("| op | chorus ms | libtorch ms | chorus / libtorch |\n|---|---|---|---|\n");
  double ct = 0, tt = 0;
  for (const Row& r : rows) {
    if (r.name.find(only) == std::string::npos) continue;
    const double c = bench::median_time(r.chorus_op, 5, reps), t = bench::median_time(r.torch_op, 5, reps);
    ct += c;
    tt += t;
    std::printf("| %s | %.3f | %.3f | %.2f |\n", r.name.c_str(), c * 1e3, t * 1e3, c / t);
    std::fflush(stdout);
  }
  std::printf("| all | %.3f | %.3f | %.2f |\n", ct * 1e3, tt * 1e3, ct / tt);
}

}  // namespace

int main(int argc, char** argv) {
  // --only TEXT: the rows whose name contains TEXT; --reps N: timed calls per side (21).
  std::string only;
  int reps = 21;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
  }
  set_num_threads(1);
  bench::peer_threads(1);
  const int64_t b = 8, t = 128, h = 256, heads = 4, ffn = 1024, masked = 146, vocab = 30522;
  manual_seed(3);
  torch::manual_seed(3);
  // chorus tensors and their libtorch twins (same shapes; values need not match).
  auto both = [](const Shape& s) {
    Tensor c = randn(s);
    torch::Tensor tt = torch::randn(std::vector<int64_t>(s.begin(), s.end()));
    return std::pair{c, tt};
  };
  auto [x, tx] = both({b * t, h});
  auto [x4, tx4] = both({b * t, ffn});
  auto [qkv, tqkv] = both({b, t, 3 * h});
  auto [probs, tprobs] = both({b, heads, t, t});
  auto [logits, tlogits] = both({masked, vocab});
  Tensor w = randn({h}), bias = randn({h});
  torch::Tensor tw = torch::randn({h}), tbias = torch::randn({h});
  Tensor target = randint(0, vocab, {masked});
  torch::Tensor ttarget = torch::randint(0, vocab, {masked}, torch::kLong);
  Tensor dy768 = randn({b * t, 3 * h}), dy1024 = randn({b * t, ffn});
  torch::Tensor tdy768 = torch::randn({b * t, 3 * h}), tdy1024 = torch::randn({b * t, ffn});
  Tensor out;
  torch::Tensor tout;
  Tensor xg = x.detach().requires_grad_(true), x4g = x4.detach().requires_grad_(true);
  torch::Tensor txg = tx.detach().requires_grad_(true), tx4g = tx4.detach().requires_grad_(true);
  // The attention row's q, k, v: three [8, 128, 256] leaves, as BERT's three Linear projections give
  // (narrowing one [8, 128, 768] tensor would add three zero-filled full-size gradients to the
  // backward that the model never makes).
  std::vector<Tensor> qkv_g;
  std::vector<torch::Tensor> tqkv_g;
  for (int i = 0; i < 3; ++i) {
    qkv_g.push_back(qkv.narrow(2, i * h, h).contiguous().detach().requires_grad_(true));
    tqkv_g.push_back(tqkv.narrow(2, i * h, h).contiguous().detach().requires_grad_(true));
  }
  auto [dctx, tdctx] = both({b, t, h});
  Tensor lg = logits.detach().requires_grad_(true);
  torch::Tensor tlg = tlogits.detach().requires_grad_(true);
  const Shape gpt_heads{2, 12, 1024, 64};
  Tensor gq = randn(gpt_heads).requires_grad_(true), gk = randn(gpt_heads).requires_grad_(true),
         gv = randn(gpt_heads).requires_grad_(true), gctx = randn(gpt_heads);
  auto torch_heads = [] { return torch::randn({2, 12, 1024, 64}).requires_grad_(true); };
  torch::Tensor tgq = torch_heads(), tgk = torch_heads(), tgv = torch_heads(), tgctx = torch::randn({2, 12, 1024, 64});
  torch::Tensor tcausal = torch::ones({1024, 1024}, torch::kBool).triu(1);
  NoGradGuard no_grad_outside;  // rows that time a backward turn grad mode on themselves
  std::printf("BERT-mini's non-GEMM work, float32, 1 thread, ms per call (median of %d after 5)\n\n", reps);
  const std::vector<Row> rows = {
      {"dropout p=0.1 on [1024, 256]", [&] {
         EnableGradGuard on;
         out = F::dropout(xg, 0.1, true);
       },
       [&] { torch::AutoGradMode on(true); tout = torch::dropout(txg, 0.1, true); }},
      {"dropout p=0.1 on probs [8, 4, 128, 128]", [&] { out = F::dropout(probs, 0.1, true); },
       [&] { tout = torch::dropout(tprobs, 0.1, true); }},
      {"softmax(-1) on probs [8, 4, 128, 128]", [&] { out = softmax(probs, -1); },
       [&] { tout = torch::softmax(tprobs, -1); }},
      {"gelu on [1024, 1024]", [&] { out = F::gelu(x4); }, [&] { tout = torch::gelu(tx4); }},
      {"gelu forward + backward [1024, 1024]",
       [&] {
         EnableGradGuard on;
         F::gelu(x4g).sum().backward();
       },
       [&] {
         torch::AutoGradMode on(true);
         torch::gelu(tx4g).sum().backward();
       }},
      {"layer_norm [1024, 256]", [&] { out = F::layer_norm(x, {h}, w, bias, 1e-12); },
       [&] { tout = torch::layer_norm(tx, {h}, tw, tbias, 1e-12); }},
      {"residual add [1024, 256]", [&] { out = add(x, x); }, [&] { tout = torch::add(tx, tx); }},
      {"bias gradient: sum(0) of [1024, 768]", [&] { out = dy768.sum({0}); }, [&] { tout = tdy768.sum(0); }},
      {"bias gradient: sum(0) of [1024, 1024]", [&] { out = dy1024.sum({0}); }, [&] { tout = tdy1024.sum(0); }},
      {"decoder bias gradient: sum(0) of [146, 30522]", [&] { out = logits.sum({0}); },
       [&] { tout = tlogits.sum(0); }},
      {"heads out: [8, 128, 768] -> 3 x [8, 4, 128, 64] contiguous",
       [&] {
         for (int i = 0; i < 3; ++i) out = qkv.narrow(2, i * h, h).reshape({b, t, heads, h / heads}).transpose(1, 2).contiguous();
       },
       [&] {
         for (int i = 0; i < 3; ++i)
           tout = tqkv.narrow(2, i * h, h).reshape({b, t, heads, h / heads}).transpose(1, 2).contiguous();
       }},
      // The whole attention between the projections and the output projection, as BERT runs it:
      // the heads of q, k, v (views of three [8, 128, 256] projections), scores, softmax, dropout, the
      // context back to [8, 128, 256], and the backward of all of it to the projections.
      {"attention forward + backward, heads of [8, 128, 3 x 256]",
       [&] {
         EnableGradGuard on;
         auto split = [&](int i) { return qkv_g[i].reshape({b, t, heads, h / heads}).permute({0, 2, 1, 3}); };
         Tensor ctx = F::scaled_dot_product_attention(split(0), split(1), split(2), {.dropout_p = 0.1});
         ctx.permute({0, 2, 1, 3}).reshape({b, t, h}).backward(dctx);
       },
       [&] {
         torch::AutoGradMode on(true);
         auto split = [&](int i) { return tqkv_g[i].view({b, t, heads, h / heads}).transpose(1, 2); };
         torch::Tensor scores = torch::matmul(split(0), split(1).transpose(-1, -2)) / std::sqrt(64.0);
         torch::Tensor probs = torch::dropout(scores.softmax(-1), 0.1, true);
         torch::matmul(probs, split(2)).transpose(1, 2).reshape({b, t, h}).backward(tdctx);
       }},
      // GPT-2 small's causal attention at 2 x 1024 tokens (12 heads of 64): the scores are 24 x 4 MiB.
      {"causal attention forward + backward, [2, 12, 1024, 64], dropout 0.1",
       [&] {
         EnableGradGuard on;
         Tensor ctx = F::scaled_dot_product_attention(gq, gk, gv, {.dropout_p = 0.1, .is_causal = true});
         ctx.backward(gctx);
       },
       [&] {
         torch::AutoGradMode on(true);
         torch::Tensor scores = torch::matmul(tgq, tgk.transpose(-1, -2)) / 8.0;
         scores = scores.masked_fill(tcausal, -std::numeric_limits<float>::infinity());
         torch::Tensor weights = torch::dropout(scores.softmax(-1), 0.1, true);
         torch::matmul(weights, tgv).backward(tgctx);
       }},
      {"transpose copy [1024, 768] -> [768, 1024]", [&] { out = dy768.t().contiguous(); },
       [&] { tout = tdy768.t().contiguous(); }},
      {"cross_entropy forward + backward [146, 30522]",
       [&] {
         EnableGradGuard on;
         F::cross_entropy(lg, target).backward();
       },
       [&] {
         torch::AutoGradMode on(true);
         torch::cross_entropy_loss(tlg, ttarget).backward();  // what F::cross_entropy calls
       }},
  };
  run(rows, only, reps);
  return 0;
}
