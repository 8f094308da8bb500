// DDP's overhead on one GPU (the PyTorch DDP paper's world-size-1 figure: 3% for PyTorch), for
// ResNet-50 and BERT-base training steps: the same step with and without DDP over NCCL, medians of
// interleaved runs after warm-up. At world size 1 the reducer would skip the (identity) allreduce,
// so the DDP model registers the plain allreduce hook: every bucket really goes through NCCL on the
// communication stream, ordered by events, as at any world size.
//
// Also writes the second-to-last DDP iteration's measured spans (forward, backward, each bucket's
// bytes, ready point and allreduce time, from the device's events) as JSON for
// tests/bench:scaling_projection --measured FILE (default file: $OUT/ddp_gpu_spans.json, else
// ./ddp_gpu_spans.json).
//
// GPU only (tag gpu_bench; tools/gpu_bundle.sh bundles it, run.sh runs it).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/ddp.h"
#include "distributed/init.h"
#include "examples/models/bert.h"
#include "examples/models/gpt.h"
#include "examples/models/resnet.h"
#include "optim/optim.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"

using namespace chorus;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make;
  std::function<Tensor(nn::Module&)> loss;  // one batch's loss, on cuda:0
};

// One timed step: zero_grad, forward + backward (through `forward`), SGD step, then wait for the GPU.
double step_ms(optim::Optimizer& opt, const std::function<Tensor()>& forward) {
  cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  opt.zero_grad();
  forward().backward();
  opt.step();
  cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main() {
  if (!cuda::is_available()) {
    std::fprintf(stderr, "ddp_gpu_bench: no CUDA device\n");
    return 2;
  }
  const std::string store = std::filesystem::temp_directory_path() / "chorus_ddp_gpu_bench_store";
  std::filesystem::remove(store);
  auto group = distributed::init_process_group({.backend = "nccl", .init_method = "file://" + store, .rank = 0, .world_size = 1});
  const Device gpu = Device::cuda(0);

  manual_seed(1);
  Tensor images = randn({32, 3, 224, 224}).to(gpu), labels = randint(0, 1000, {32}).to(gpu);
  Tensor ids = randint(1000, 30000, {16, 128}, {.dtype = kInt64}).to(gpu), next = randint(0, 2, {16}).to(gpu);
  Tensor gpt_ids = randint(0, 50257, {8, 1024}, {.dtype = kInt64}).to(gpu);
  const std::vector<Case> cases = {
      {"ResNet-50, batch 32 x 3x224x224", [] { return std::static_pointer_cast<nn::Module>(models::resnet50()); },
       [&](nn::Module& m) { return nn::functional::cross_entropy(m.forward(images), labels); }},
      {"BERT-base pretraining, batch 16 x 128",
       [] { return std::static_pointer_cast<nn::Module>(
                std::make_shared<models::BertForPreTraining>(models::BertConfig::named("base"))); },
       [&](nn::Module& m) {
         models::BertOutputs out = static_cast<models::BertForPreTraining&>(m).forward(ids, Tensor(), Tensor());
         return nn::functional::cross_entropy(out.prediction_logits.reshape({-1, 30522}), ids.reshape({-1})) +
                nn::functional::cross_entropy(out.seq_relationship_logits, next);
       }},
      {"GPT-2 124M, batch 8 x 1024",
       [] { return std::static_pointer_cast<nn::Module>(std::make_shared<models::GPT2LMHeadModel>(models::GPTConfig::named("gpt2"))); },
       [&](nn::Module& m) {
         auto& gpt = static_cast<models::GPT2LMHeadModel&>(m);
         return gpt.loss(gpt_ids.narrow(1, 0, 1023), gpt_ids.narrow(1, 1, 1023));
       }},
  };

  nlohmann::json spans = nlohmann::json::object();
  std::printf("DDP overhead at world size 1 on %s (NCCL, every bucket allreduced), medians of 20 interleaved steps "
              "after 5 warm-up\n\n| model | without DDP ms | with DDP ms | overhead |\n|---|---|---|---|\n",
              gpu.str().c_str());
  for (const Case& c : cases) {
    manual_seed(7);
    auto plain = c.make();
    manual_seed(7);
    auto wrapped = c.make();
    plain->to(gpu);
    wrapped->to(gpu);
    distributed::DistributedDataParallel ddp(wrapped, group);
    ddp.register_comm_hook(distributed::allreduce_hook);
    optim::SGD opt_plain(plain->parameters(), {.lr = 1e-4, .momentum = 0.9});
    optim::SGD opt_ddp(wrapped->parameters(), {.lr = 1e-4, .momentum = 0.9});
    std::vector<double> without, with;
    for (int i = 0; i < 25; ++i) {
      const double a = step_ms(opt_plain, [&] { return c.loss(*plain); });
      const double b = step_ms(opt_ddp, [&] { return ddp.forward([&] { return c.loss(*wrapped); }); });
      if (i >= 5) {
        without.push_back(a);
        with.push_back(b);
      }
    }
    const double ma = median(without), mb = median(with);
    std::printf("| %s | %.2f | %.2f | %+.1f%% |\n", c.name.c_str(), ma, mb, 100.0 * (mb - ma) / ma);

    // Spans of a recorded iteration (the 10 first are; take the last of those).
    const auto& stats = ddp.stats();
    const distributed::IterationStats& st = stats.back();
    nlohmann::json buckets = nlohmann::json::array();
    const auto& bs = ddp.reducer().buckets();
    for (const auto& b : bs) {
      double ready_us = st.forward_ms * 1e3 + st.backward_ms * 1e3, comm_ms = 0;
      for (const auto& sp : st.spans) {
        if (sp.name == "backward: bucket " + std::to_string(b.index) + " gradients") ready_us = sp.end_us;
        if (sp.lane == 1 && sp.name.rfind("allreduce bucket " + std::to_string(b.index) + " ", 0) == 0) {
          comm_ms = (sp.end_us - sp.start_us) / 1e3;
        }
      }
      const double fraction = std::clamp((ready_us - st.forward_ms * 1e3) / (st.backward_ms * 1e3), 0.0, 1.0);
      buckets.push_back({{"bytes", b.buffer.nbytes()}, {"ready_fraction", fraction}, {"allreduce_ms", comm_ms}});
    }
    const std::string key = c.name.rfind("ResNet", 0) == 0 ? "resnet50" : c.name.rfind("BERT", 0) == 0 ? "bert_base" : "gpt2";
    spans[key] = {{"model", c.name},
                  {"iteration", st.iteration},
                  {"forward_ms", st.forward_ms},
                  {"backward_ms", st.backward_ms},
                  {"communication_ms", st.communication_ms},
                  {"overlapped_ms", st.overlapped_ms},
                  {"buckets", buckets}};
    std::printf("  spans (iteration %lld, device events): forward %.2f ms, backward %.2f ms, %zu buckets, "
                "allreduce %.2f ms of which %.2f overlapped with backward\n",
                static_cast<long long>(st.iteration), st.forward_ms, st.backward_ms, bs.size(), st.communication_ms,
                st.overlapped_ms);
  }
  const char* out_dir = std::getenv("OUT");
  const std::string path = std::string(out_dir && *out_dir ? out_dir : ".") + "/ddp_gpu_spans.json";
  std::ofstream(path) << spans.dump(1);
  std::printf("\nspans written to %s (tests/bench:scaling_projection --measured %s)\n", path.c_str(), path.c_str());
  distributed::destroy_process_group();
  std::filesystem::remove(store);
  return 0;
}
