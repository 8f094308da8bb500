// Per-rank memory of data parallelism with and without sharding (docs/sharding.md), run under
// chorusrun, one configuration per job:
//
//   chorusrun --nproc-per-node 4 bazel-bin/tests/bench/sharding_bench --model gpt2 --strategy full_shard --device sim
//
// strategies: ddp (DDP + AdamW), zero1 (DDP + ZeroRedundancyOptimizer(AdamW)), shard_grad_op and
// full_shard (FullyShardedDataParallel + AdamW over the shards). Each rank trains --steps steps of
// --batch sequences of --seq-len random tokens (GPT models) or random rows (mlp) and measures, on its
// device's allocator (sim/cuda: the caching allocator's counters; cpu: the CPU allocator's):
//   resident: bytes allocated between steps, once the group's watchdog has let go of finished
//             collectives' buffers (parameters, gradients, optimizer state, the wrapper's
//             buffers, and the model's buffers, which no strategy shards: GPT's causal masks),
//             after the last step;
//   peak:     the most allocated at once during the last step (activations and gathered units too).
// Rank 0 prints one JSON line with every rank's figures and the model's size.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/init.h"
#include "distributed/zero_redundancy_optimizer.h"
#include "examples/models/gpt.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/caching_allocator.h"
#include "tensor/cpu_memory.h"
#include "tensor/ops.h"
#include "utils/cli.h"

using namespace chorus;
using namespace chorus::distributed;

namespace {

size_t allocated(Device d) { return d.is_cpu() ? cpu_memory_allocated() : memory_allocated(d); }
size_t peak(Device d) { return d.is_cpu() ? cpu_max_memory_allocated() : max_memory_allocated(d); }
void reset_peak(Device d) {
  if (d.is_cpu()) reset_cpu_peak_memory_stats();
  else reset_peak_memory_stats(d);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "gpt-mini", strategy = "full_shard", device_name = "sim";
  int steps = 2;
  int64_t batch = 2, seq_len = 64;
  CLI::App app{"Per-rank memory of DDP, ZeRO-1, shard_grad_op and full_shard (run under chorusrun)"};
  app.add_option("--model", model_name, "gpt-tiny, gpt-mini (byte vocabularies), gpt2 (124M) or gpt2-medium (355M)")
      ->check(CLI::IsMember({"gpt-tiny", "gpt-mini", "gpt2", "gpt2-medium"}));
  app.add_option("--strategy", strategy, "ddp, zero1, shard_grad_op or full_shard")
      ->check(CLI::IsMember({"ddp", "zero1", "shard_grad_op", "full_shard"}));
  app.add_option("--device", device_name, "cpu or sim (sim:N under chorusrun: this rank's local index)");
  app.add_option("--steps", steps, "training steps (the last is measured)")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--seq-len", seq_len, "tokens per sequence")->check(CLI::PositiveNumber);
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);
  try {
    auto group = init_process_group();
    const int rank = group->rank(), world = group->size();
    const Device device = device_name == "cpu" ? Device::cpu() : Device::parse(device_name);
    if (!device.is_cpu()) set_device(device);
    models::GPTConfig config = models::GPTConfig::named(model_name == "gpt-tiny" ? "tiny"
                                                        : model_name == "gpt-mini" ? "mini"
                                                                                   : model_name);
    // GPT-2's own 50,257-token vocabulary for gpt2 and gpt2-medium (124M and 355M parameters, as
    // published); bytes for the small ones.
    if (model_name == "gpt-tiny" || model_name == "gpt-mini") config.vocab_size = 256;
    else config.vocab_size = 50257;
    config.dropout = 0;
    manual_seed(1);
    auto gpt = std::make_shared<models::GPT2LMHeadModel>(config);
    gpt->to(device);
    int64_t numel = 0, buffer_bytes = 0;
    for (const Tensor& p : gpt->parameters()) numel += p.numel();
    for (const Tensor& b : gpt->buffers()) buffer_bytes += static_cast<int64_t>(b.nbytes());
    const optim::AdamOptions adam = optim::AdamW::default_options();
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    std::shared_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<optim::Optimizer> opt;
    std::unique_ptr<ZeroRedundancyOptimizer> zero;
    if (strategy == "ddp" || strategy == "zero1") {
      ddp = std::make_shared<DistributedDataParallel>(gpt, group);
      if (strategy == "ddp") {
        opt = std::make_unique<optim::AdamW>(gpt->parameters(), adam);
      } else {
        zero = std::make_unique<ZeroRedundancyOptimizer>(gpt->parameters(), group, [adam](std::vector<optim::ParamGroup> g) {
          return std::make_unique<optim::AdamW>(std::move(g), adam);
        });
      }
    } else {
      FSDPOptions o;
      o.sharding_strategy = parse_sharding_strategy(strategy);
      fsdp = std::make_unique<FullyShardedDataParallel>(gpt->pipeline_blocks(), group, o);
      gpt.reset();  // the blocks and the wrapper hold what is needed
      opt = std::make_unique<optim::AdamW>(fsdp->parameters(), adam);
    }
    for (int s = 0; s < steps; ++s) {
      manual_seed(100 + s * world + rank);
      Tensor tokens = randint(0, config.vocab_size, {batch, seq_len + 1});
      Tensor ids = tokens.narrow(1, 0, seq_len).contiguous().to(device);
      Tensor targets = tokens.narrow(1, 1, seq_len).contiguous().to(device);
      reset_peak(device);
      if (zero) zero->zero_grad();
      else opt->zero_grad();
      Tensor loss;
      if (fsdp) {
        loss = models::GPT2LMHeadModel::pipeline_loss(fsdp->forward({ids}), {targets});
      } else {
        loss = ddp->forward([&] { return gpt->loss(ids, targets); });
      }
      loss.backward();
      if (zero) zero->step();
      else opt->step();
      (void)loss.item<double>();
    }
    if (!device.is_cpu()) synchronize(device);
    const double top = static_cast<double>(peak(device));
    // Gloo on a device stream (sim) keeps a finished collective's job, and so its device tensors
    // (all-gather and reduce-scatter buffers), until the next collective is issued on that
    // communicator (release_staging), and the group's watchdog drops finished works on its own
    // thread: issue one small device collective, then read the resident bytes once they settle.
    if (!device.is_cpu()) {
      Tensor one = zeros({1}, {.device = device});
      group->allreduce({one})->wait();
      synchronize(device);
    }
    group->barrier()->wait();
    size_t settled = allocated(device);
    for (int same = 0, tries = 0; same < 5 && tries < 200; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const size_t now = allocated(device);
      same = now == settled ? same + 1 : 0;
      settled = now;
    }
    const double resident = static_cast<double>(settled);
    TensorList all;
    for (int r = 0; r < world; ++r) all.push_back(zeros({2}, {.dtype = kFloat64}));
    group->allgather(all, tensor<double>({resident, top}))->wait();
    if (rank == 0) {
      nlohmann::json ranks = nlohmann::json::array();
      for (int r = 0; r < world; ++r) {
        ranks.push_back({{"resident_bytes", all[r][0].item<double>()}, {"peak_bytes", all[r][1].item<double>()}});
      }
      const nlohmann::json out = {{"model", model_name},
                                  {"parameters", numel},
                                  {"strategy", strategy},
                                  {"world_size", world},
                                  {"device", device.str()},
                                  {"batch_per_rank", batch},
                                  {"seq_len", seq_len},
                                  {"fp32_param_grad_adam_bytes", 16.0 * static_cast<double>(numel)},
                                  {"buffer_bytes", buffer_bytes},
                                  {"ranks", ranks}};
      std::printf("%s\n", out.dump().c_str());
      std::fflush(stdout);
    }
    group->barrier()->wait();
    destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharding_bench: error: %s\n", e.what());
    return 1;
  }
}
