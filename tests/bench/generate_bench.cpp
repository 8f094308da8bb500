// GPT-2 greedy generation, batch 1, CPU, tokens per second (issue 34 item 4):
// - chorus with its KVCache (GPT2LMHeadModel::generate, the default),
// - chorus recomputing the whole context for every token (GenerateOptions::use_cache = false),
// - libtorch 1.13 eager with a key/value cache grown by torch::cat, as Hugging Face's
//   GPT2LMHeadModel.generate does with its eager attention (q k^T / sqrt(d), the causal mask,
//   softmax, times v), on chorus's weights.
// Each row: the prompt's forward (the prefill) plus one forward per new token, argmax each time;
// the median of --reps runs after --warmup. The tokens of all three are compared and the first
// disagreement is printed (float round-off can flip a near tie; on these models none did).
//
//   bazel run -c opt //tests/bench:generate_bench -- [--threads 1] [--reps 3] [--warmup 1] [--only mini|gpt2]
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/types.h>
#include <torch/utils.h>

#include "autograd/grad_mode.h"
#include "examples/models/gpt.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/libtorch_peer.h"
#include "utils/cli.h"

namespace {

using chorus::models::GPTConfig;

// GPT-2 in libtorch, functional, on a copy of chorus's parameters (Hugging Face's names and
// Conv1D [in, out] weights), with a per-layer key/value cache.
struct TorchGPT2 {
  std::map<std::string, torch::Tensor> w;
  GPTConfig c;
  std::vector<torch::Tensor> keys, values;  // [heads, past, d], grown by cat

  TorchGPT2(chorus::models::GPT2LMHeadModel& model) : c(model.transformer->config) {
    for (const auto& [name, p] : model.named_parameters()) {
      const chorus::Tensor f = p.detach().contiguous();
      std::vector<int64_t> sizes(f.sizes().begin(), f.sizes().end());
      w[name] = torch::from_blob(const_cast<float*>(f.data_ptr<float>()), sizes, torch::kFloat32).clone();
    }
  }
  const torch::Tensor& p(const std::string& name) { return w.at("transformer." + name); }

  torch::Tensor linear(const torch::Tensor& x, const std::string& name) {
    return torch::addmm(p(name + ".bias"), x, p(name + ".weight"));
  }
  torch::Tensor norm(const torch::Tensor& x, const std::string& name) {
    return torch::layer_norm(x, {c.n_embd}, p(name + ".weight"), p(name + ".bias"), c.layer_norm_epsilon);
  }

  // ids [T] continuing the cached positions -> logits [T, vocab].
  torch::Tensor forward(const torch::Tensor& ids) {
    const int64_t past = keys.empty() ? 0 : keys[0].size(1), t = ids.size(0), h = c.n_head, d = c.n_embd / h;
    torch::Tensor x = p("wte.weight").index_select(0, ids) + p("wpe.weight").narrow(0, past, t);
    const bool first = keys.empty();
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string b = "h." + std::to_string(l);
      torch::Tensor qkv = linear(norm(x, b + ".ln_1"), b + ".attn.c_attn").view({t, 3, h, d}).permute({1, 2, 0, 3});
      torch::Tensor k = qkv[1], v = qkv[2];
      if (!first) {
        k = torch::cat({keys[l], k}, 1);
        v = torch::cat({values[l], v}, 1);
        keys[l] = k;
        values[l] = v;
      } else {
        keys.push_back(k);
        values.push_back(v);
      }
      torch::Tensor scores = torch::matmul(qkv[0], k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
      if (t > 1) {
        // Query i (position past + i) sees keys 0 .. past + i.
        torch::Tensor hidden = torch::arange(past + t).unsqueeze(0) > torch::arange(past, past + t).unsqueeze(1);
        scores = scores.masked_fill(hidden, -INFINITY);
      }
      torch::Tensor y = torch::matmul(scores.softmax(-1), v).permute({1, 0, 2}).reshape({t, c.n_embd});
      x = x + linear(y, b + ".attn.c_proj");
      x = x + linear(torch::gelu(linear(norm(x, b + ".ln_2"), b + ".mlp.c_fc"), "tanh"), b + ".mlp.c_proj");
    }
    return torch::matmul(norm(x, "ln_f"), p("wte.weight").t());
  }

  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t n) {
    torch::NoGradGuard no_grad;
    keys.clear();
    values.clear();
    std::vector<int64_t> out;
    torch::Tensor ids = torch::tensor(prompt, torch::kLong);
    for (int64_t i = 0; i < n; ++i) {
      torch::Tensor logits = forward(ids);
      const int64_t next = logits[logits.size(0) - 1].argmax().item<int64_t>();
      out.push_back(next);
      ids = torch::tensor(std::vector<int64_t>{next}, torch::kLong);
    }
    return out;
  }
};

std::string first_difference(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) return "token " + std::to_string(i);
  }
  return a.size() == b.size() ? "none" : "length";
}

void row(const std::string& name, int64_t prompt_len, int64_t new_tokens, int warmup, int reps) {
  chorus::manual_seed(1);
  GPTConfig config = GPTConfig::named(name);
  config.dropout = 0.0;
  chorus::models::GPT2LMHeadModel model(config);
  model.eval();
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back((i * 7919 + 13) % config.vocab_size);
  TorchGPT2 peer(model);

  std::vector<int64_t> cached, uncached, theirs;
  const auto run = [&](bool use_cache, std::vector<int64_t>& out) {
    return chorus::bench::median_time(
        [&] { out = model.generate(prompt, {.max_new_tokens = new_tokens, .temperature = 0, .use_cache = use_cache}); },
        warmup, reps);
  };
  const double t_cached = run(true, cached);
  const double t_uncached = run(false, uncached);
  const double t_torch =
      chorus::bench::median_time([&] { theirs = peer.generate(prompt, new_tokens); }, warmup, reps);
  // The two models' logits over the prompt and chorus's tokens, whole-sequence forward on both.
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), cached.begin(), cached.end());
  all.resize(std::min<int64_t>(static_cast<int64_t>(all.size()), config.n_positions));
  double diff = 0, largest = 0, gap = -1;
  {
    chorus::NoGradGuard no_grad;
    const chorus::Tensor ours = model.forward(chorus::tensor<int64_t>(all).unsqueeze(0)).select(0, 0).contiguous();
    peer.keys.clear();
    peer.values.clear();
    torch::NoGradGuard torch_no_grad;
    const torch::Tensor theirs_logits = peer.forward(torch::tensor(all, torch::kLong)).contiguous();
    const float* a = ours.data_ptr<float>();
    const float* b = theirs_logits.data_ptr<float>();
    for (int64_t i = 0; i < ours.numel(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
      largest = std::max(largest, static_cast<double>(std::fabs(b[i])));
    }
    // Where libtorch chose another token: chorus's margin between its choice and libtorch's.
    for (size_t i = 0; i < std::min(cached.size(), theirs.size()); ++i) {
      if (cached[i] == theirs[i]) continue;
      const chorus::Tensor at = ours.select(0, static_cast<int64_t>(prompt.size() + i) - 1);
      gap = at[cached[i]].item<double>() - at[theirs[i]].item<double>();
      break;
    }
  }
  const std::string torch_diff = first_difference(cached, theirs) + (gap >= 0 ? fmt::format(" (margin {:.1e})", gap) : "");
  const double n = static_cast<double>(new_tokens);
  std::printf("| %s (%lld layers, %lld wide) | %lld + %lld | %.1f | %.1f | %.1f | %.2f | %.2f | %s / %s | %.1e / %.1e |\n", name.c_str(),
              static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
              static_cast<long long>(prompt_len), static_cast<long long>(new_tokens), n / t_cached, n / t_uncached,
              n / t_torch, t_uncached / t_cached, t_cached / t_torch, first_difference(cached, uncached).c_str(),
              torch_diff.c_str(), diff, largest);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 greedy generation: chorus with and without its KVCache, and libtorch 1.13 eager with a cache"};
  int threads = 1, reps = 3, warmup = 1;
  std::string only;
  app.add_option("--threads", threads, "threads for both sides")->check(CLI::Range(1, 256));
  app.add_option("--reps", reps, "timed runs per row (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", warmup, "untimed runs first")->check(CLI::Range(0, 1000));
  app.add_option("--only", only, "one row: mini or gpt2")->check(CLI::IsMember({"mini", "gpt2"}));
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);
  chorus::set_num_threads(threads);
  chorus::bench::peer_threads(threads);
  std::printf("GPT-2 greedy generation, batch 1, %d thread(s), median of %d after %d warm-up\n\n", threads, reps, warmup);
  std::printf("| model | prompt + new tokens | chorus cached tok/s | chorus uncached tok/s | libtorch cached tok/s | "
              "cached speed-up | chorus / libtorch time | first different token: uncached / libtorch | logits: largest difference / largest |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  if (only.empty() || only == "mini") row("mini", 32, 192, warmup, reps);
  if (only.empty() || only == "gpt2") row("gpt2", 32, 32, warmup, reps);
  return 0;
}
