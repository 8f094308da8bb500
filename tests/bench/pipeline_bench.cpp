// DAPPLE's schedules against pure data parallelism (a table; not a pass/fail test). Run with 4
// processes:
//
//   chorusrun --nproc-per-node 4 bazel-bin/tests/bench/pipeline_bench [steps] [width] [batch]
//
// Or, to check the planner's predictions: measure given plans (JSON, as `plan` writes them) on the
// planner profile tool's MLP (784 -> hidden x (layers - 1) -> 10, layer i = Linear + ReLU), with
// as many processes as the plans use, and print each plan's median iteration time:
//
//   chorusrun --nproc-per-node 2 bazel-bin/tests/bench/pipeline_bench --plans [--hidden 512]
//       [--steps 10] a.json b.json ...
//   (--model gpt [--config mini] [--seq-len 128]: GPT-2's pipeline blocks instead, as
//   `profile --model gpt` profiles them)
//
// Or the activation memory of GPT-2 as 4 stages (examples/models/gpt.h, pipeline_blocks()) under
// GPipe, 1F1B and 1F1B with recomputation at M = 4, 8, 16 (a table per stage, from the stage
// device's allocator: sim's counts device bytes; 1 warm-up step, then the step measured):
//
//   chorusrun --nproc-per-node 4 bazel-bin/tests/bench/pipeline_bench --gpt-memory [--config mini]
//       [--seq-len 128] [--batch 32 | --micro-batch 2] [--layers N] [--device sim:0]
//
// (--layers 6 or more: also interleaved 1F1B with 2 chunks per stage, 8 virtual stages.)
//
// (--micro-batch N: the global batch is N x M, so the micro-batch stays N as M grows: DAPPLE's
// setting, where GPipe's memory grows with M and 1F1B's does not.)
//
// The same MLP (16 layers: 8 x (Linear width->width, ReLU)) and global batch, three ways:
//   gpipe  4 stages x 1 replica, M = 8, all forwards then all backwards
//   1f1b   4 stages x 1 replica, M = 8, early backward (stage i holds at most 4 - i micro-batches)
//   dp     1 stage x 4 replicas, M = 1 (DDP: each rank runs batch / 4 rows at once)
// For each: median iteration time over `steps` steps after 2 warm-up steps (the slowest rank's), and
// per stage (the maximum over its ranks): the peak activation memory (bytes the forwards left
// allocated, summed over the micro-batches held at once), the peak of everything the step allocated
// above its start (activations, gradients, temporaries; tensor/cpu_memory.h), and the most
// micro-batches held at once.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "distributed/init.h"
#include "distributed/pipeline/pipeline.h"
#include "examples/models/gpt.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"

using namespace chorus;
namespace F = chorus::nn::functional;
namespace pp = chorus::distributed::pipeline;

namespace {

std::shared_ptr<nn::Sequential> mlp(int64_t width, int blocks) {
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>();
  for (int i = 0; i < blocks; ++i) {
    net->push_back(std::make_shared<nn::Linear>(width, width));
    net->push_back(std::make_shared<nn::ReLU>());
  }
  return net;
}

struct Row {
  std::string mode;
  double step_ms;
  std::vector<double> act_mib;   // per stage
  std::vector<double> peak_mib;  // per stage
  std::vector<int> in_flight;    // per stage
};

// The planner profile tool's MLP (distributed/pipeline/planner/profile_main.cpp), layer for layer.
std::shared_ptr<nn::Sequential> profile_mlp(int64_t hidden, int layers) {
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>();
  for (int i = 0; i < layers; ++i) {
    const int64_t in = i == 0 ? 784 : hidden, out = i == layers - 1 ? 10 : hidden;
    auto block = std::make_shared<nn::Sequential>();
    block->push_back(std::make_shared<nn::Linear>(in, out));
    if (i < layers - 1) block->push_back(std::make_shared<nn::ReLU>());
    net->push_back(block);
  }
  return net;
}

int measure_plans(int argc, char** argv) {
  int steps = 10;
  int64_t hidden = 512, seq_len = 128;
  std::string model_kind = "mlp", config = "mini";
  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--hidden" && i + 1 < argc) hidden = std::atoll(argv[++i]);
    else if (a == "--model" && i + 1 < argc) model_kind = argv[++i];
    else if (a == "--config" && i + 1 < argc) config = argv[++i];
    else if (a == "--seq-len" && i + 1 < argc) seq_len = std::atoll(argv[++i]);
    else if (a.rfind("--", 0) == 0) fail("pipeline_bench --plans: unknown option {}", a);
    else files.push_back(a);
  }
  if (steps < 1) fail("pipeline_bench --plans: --steps {}; expected at least 1", steps);
  if (model_kind != "mlp" && model_kind != "gpt") fail("pipeline_bench --plans: --model {}; expected mlp or gpt", model_kind);
  auto group = distributed::init_process_group();
  const int rank = group->rank();
  if (rank == 0) {
    std::printf("| plan | stages x replicas | M | schedule | measured iteration ms (median of %d, slowest rank) | "
                "communication wait ms per rank (median) |\n"
                "|---|---|---|---|---|---|\n",
                steps);
  }
  for (const std::string& file : files) {
    const pp::PipelinePlan plan = pp::load_plan(file);
    // The profile tool's models, block for block: its MLP, or GPT-2's pipeline blocks.
    pp::BlockModel blocks;
    TensorList x, y;
    pp::MultiLossFn loss;
    if (model_kind == "gpt") {
      manual_seed(3);
      auto gpt = std::make_shared<models::GPT2LMHeadModel>(models::GPTConfig::named(config));
      blocks = gpt->pipeline_blocks();
      manual_seed(4);
      Tensor tokens = randint(0, gpt->transformer->config.vocab_size, {plan.global_batch, seq_len + 1});
      x = {tokens.narrow(1, 0, seq_len).contiguous()};
      y = {tokens.narrow(1, 1, seq_len).contiguous()};
      loss = models::GPT2LMHeadModel::pipeline_loss;
    } else {
      blocks = pp::blocks_of(profile_mlp(hidden, plan.num_layers));
      manual_seed(4);
      x = {randn({plan.global_batch, 784})};
      y = {randint(0, 10, {plan.global_batch})};
      loss = [](const TensorList& out, const TensorList& t) { return F::cross_entropy(out[0], t[0]); };
    }
    pp::PipelineStage stage(std::move(blocks), plan, group, {.report_loss = false});
    optim::SGD opt(stage.parameters(), {.lr = 0.01, .momentum = 0.9});
    std::vector<double> times, waits;
    for (int i = 0; i < steps + 2; ++i) {
      group->barrier()->wait();
      pp::StepStats st = stage.train_step(x, y, loss, opt);
      group->barrier()->wait();
      if (i >= 2) times.push_back(st.step_ms), waits.push_back(st.communication_wait_ms);
    }
    std::sort(times.begin(), times.end());
    std::sort(waits.begin(), waits.end());
    Tensor mine = tensor<double>({times[times.size() / 2], waits[waits.size() / 2]});
    TensorList all;
    for (int r = 0; r < group->size(); ++r) all.push_back(zeros({2}, {.dtype = kFloat64}));
    group->allgather(all, mine)->wait();
    double slowest = 0;
    std::string wait_list;
    for (const Tensor& t : all) {
      slowest = std::max(slowest, t.data_ptr<double>()[0]);
      wait_list += fmt::format("{}{:.2f}", wait_list.empty() ? "" : " / ", t.data_ptr<double>()[1]);
    }
    if (rank == 0) {
      std::string shape;
      for (size_t s = 0; s < plan.stages.size(); ++s) shape += fmt::format("{}{}", s ? "+" : "", plan.stages[s].ranks.size());
      std::printf("| %s | %d stage(s): %s | %d | %s | %.2f | %s |\n", file.c_str(), plan.num_stages(), shape.c_str(),
                  plan.micro_batches, plan.schedule.c_str(), slowest, wait_list.c_str());
      std::fflush(stdout);
    }
  }
  group->barrier()->wait();
  distributed::destroy_process_group();
  return 0;
}

int gpt_memory(int argc, char** argv) {
  std::string config = "mini", device_name = "sim:0";
  int64_t seq_len = 128, batch = 32, micro = 0, layers = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--config") config = v;
    else if (a == "--seq-len") seq_len = std::atoll(v.c_str());
    else if (a == "--batch") batch = std::atoll(v.c_str());
    else if (a == "--micro-batch") micro = std::atoll(v.c_str());
    else if (a == "--layers") layers = std::atoll(v.c_str());
    else if (a == "--device") device_name = v;
    else fail("pipeline_bench --gpt-memory: unknown option {}", a);
  }
  auto group = distributed::init_process_group();
  const int world = group->size(), rank = group->rank();
  if (world != 4) fail("pipeline_bench --gpt-memory: run it with 4 processes (chorusrun --nproc-per-node 4), got {}", world);
  const Device device(device_name);
  models::GPTConfig c = models::GPTConfig::named(config);
  if (layers > 0) c.n_layer = layers;
  // Interleaved 1F1B with 2 chunks needs 8 virtual stages: at least 6 layers (+ embeddings, head).
  const bool interleaved = c.n_layer + 2 >= 8;
  if (rank == 0) {
    std::printf("GPT-2 %s (%lld layers, %lld wide), sequence %lld, %s, 4 stages x 1 replica, on %s\n", config.c_str(),
                static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd), static_cast<long long>(seq_len),
                micro > 0 ? fmt::format("micro-batches of {} (global batch {} x M)", micro, micro).c_str()
                          : fmt::format("global batch {}", batch).c_str(),
                device.str().c_str());
    std::printf("| schedule | M | micro-batch | peak activation MiB per stage (0 / 1 / 2 / 3) | held at once | step peak MiB "
                "per stage |\n|---|---|---|---|---|---|\n");
  }
  for (const int M : {4, 8, 16}) {
    if (micro > 0) batch = micro * M;
    for (const std::string run : {"gpipe", "1f1b", "1f1b + recompute", "interleaved, 2 chunks"}) {
      if (run == "interleaved, 2 chunks" && !interleaved) continue;
      manual_seed(1);
      auto gpt = std::make_shared<models::GPT2LMHeadModel>(c);
      gpt->to(device);
      pp::BlockModel blocks = gpt->pipeline_blocks();
      gpt.reset();
      const int L = static_cast<int>(blocks.size());
      const bool inter = run == "interleaved, 2 chunks";
      pp::PipelinePlan plan = pp::uniform_plan(L, pp::even_cuts(L, inter ? 8 : 4), std::vector<int>(inter ? 8 : 4, 1),
                                               static_cast<int>(batch), M, run == "gpipe" ? "gpipe" : "1f1b");
      if (inter) {  // virtual stage k on rank k mod 4
        plan.schedule = "interleaved";
        for (int k = 4; k < 8; ++k) plan.stages[k].ranks = plan.stages[k % 4].ranks;
      }
      pp::PipelineOptions options;
      options.report_loss = false;
      options.recompute = run == "1f1b + recompute";
      pp::PipelineStage stage(std::move(blocks), plan, group, options);
      optim::SGD opt(stage.parameters(), {.lr = 0.01});
      manual_seed(2);
      Tensor tokens = randint(0, c.vocab_size, {batch, seq_len + 1});
      const Tensor x = tokens.narrow(1, 0, seq_len).contiguous(), y = tokens.narrow(1, 1, seq_len).contiguous();
      pp::StepStats st;
      for (int i = 0; i < 2; ++i) {
        st = stage.train_step(stage.is_first() ? TensorList{x} : TensorList{}, stage.is_last() ? TensorList{y} : TensorList{},
                              models::GPT2LMHeadModel::pipeline_loss, opt);
      }
      Tensor mine = tensor<double>({static_cast<double>(st.peak_activation_bytes), static_cast<double>(st.max_in_flight),
                                    static_cast<double>(st.peak_step_bytes)});
      TensorList all;
      for (int r = 0; r < world; ++r) all.push_back(zeros({3}, {.dtype = kFloat64}));
      group->allgather(all, mine)->wait();
      if (rank == 0) {
        std::string act, held, step;
        for (int r = 0; r < world; ++r) {
          const double* v = all[r].data_ptr<double>();
          act += fmt::format("{}{:.1f}", r ? " / " : "", v[0] / (1 << 20));
          held += fmt::format("{}{:.0f}", r ? " / " : "", v[1]);
          step += fmt::format("{}{:.1f}", r ? " / " : "", v[2] / (1 << 20));
        }
        std::printf("| %s | %d | %lld | %s | %s | %s |\n", run.c_str(), M, static_cast<long long>(batch / M), act.c_str(),
                    held.c_str(), step.c_str());
        std::fflush(stdout);
      }
    }
  }
  group->barrier()->wait();
  distributed::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--gpt-memory") {
    try {
      return gpt_memory(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pipeline_bench: error: %s\n", e.what());
      return 1;
    }
  }
  if (argc > 1 && std::string(argv[1]) == "--plans") {
    try {
      return measure_plans(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pipeline_bench: error: %s\n", e.what());
      return 1;
    }
  }
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int64_t width = argc > 2 ? std::atoll(argv[2]) : 512;
  const int batch = argc > 3 ? std::atoi(argv[3]) : 512;
  if (steps < 1 || width < 1 || batch < 1) {
    std::fprintf(stderr, "pipeline_bench: expected [steps >= 1] [width >= 1] [batch >= 1], --plans or --gpt-memory; got %s\n",
                 argc > 1 ? argv[1] : "");
    return 2;
  }
  try {
    auto group = distributed::init_process_group();
    const int world = group->size(), rank = group->rank();
    if (world != 4) fail("pipeline_bench: run it with 4 processes (chorusrun --nproc-per-node 4), got {}", world);
    const int blocks = 8, layers = 2 * blocks;
    struct Mode {
      std::string name;
      pp::PipelinePlan plan;
    };
    std::vector<Mode> modes = {
        {"gpipe", pp::uniform_plan(layers, pp::even_cuts(layers, 4), {1, 1, 1, 1}, batch, 8, "gpipe")},
        {"1f1b", pp::uniform_plan(layers, pp::even_cuts(layers, 4), {1, 1, 1, 1}, batch, 8, "1f1b")},
        {"dp", pp::uniform_plan(layers, {}, {4}, batch, 1, "1f1b")},
    };
    std::vector<Row> rows;
    for (const Mode& mode : modes) {
      auto model = mlp(width, blocks);
      pp::PipelineStage stage(model, mode.plan, group, {.report_loss = false});
      model.reset();
      optim::SGD opt(stage.parameters(), {.lr = 0.01, .momentum = 0.9});
      manual_seed(4);
      Tensor x = randn({batch, width}), y = randn({batch, width});
      auto loss = [](const Tensor& out, const Tensor& t) { return F::mse_loss(out, t); };
      std::vector<double> times;
      pp::StepStats worst;
      for (int i = 0; i < steps + 2; ++i) {
        group->barrier()->wait();  // every mode's step starts together on all ranks
        pp::StepStats st = stage.train_step(x, y, loss, opt);
        group->barrier()->wait();
        if (i < 2) continue;
        times.push_back(st.step_ms);
        worst.peak_activation_bytes = std::max(worst.peak_activation_bytes, st.peak_activation_bytes);
        worst.peak_step_bytes = std::max(worst.peak_step_bytes, st.peak_step_bytes);
        worst.max_in_flight = std::max(worst.max_in_flight, st.max_in_flight);
      }
      std::sort(times.begin(), times.end());
      // Per rank: [median step ms, activation bytes, step peak bytes, in flight, stage].
      Tensor mine = tensor<double>({times[times.size() / 2], static_cast<double>(worst.peak_activation_bytes),
                                    static_cast<double>(worst.peak_step_bytes), static_cast<double>(worst.max_in_flight),
                                    static_cast<double>(stage.stage())});
      TensorList all;
      for (int r = 0; r < world; ++r) all.push_back(zeros({5}, {.dtype = kFloat64}));
      group->allgather(all, mine)->wait();
      const size_t S = static_cast<size_t>(mode.plan.num_stages());
      Row row{mode.name, 0, std::vector<double>(S, 0), std::vector<double>(S, 0), std::vector<int>(S, 0)};
      for (const Tensor& t : all) {
        const double* p = t.data_ptr<double>();
        const int s = static_cast<int>(p[4]);
        row.step_ms = std::max(row.step_ms, p[0]);
        row.act_mib[s] = std::max(row.act_mib[s], p[1] / (1 << 20));
        row.peak_mib[s] = std::max(row.peak_mib[s], p[2] / (1 << 20));
        row.in_flight[s] = std::max(row.in_flight[s], static_cast<int>(p[3]));
      }
      rows.push_back(row);
    }
    if (rank == 0) {
      std::printf("MLP %d x (Linear %lld->%lld, ReLU), float32, global batch %d, 4 processes, median of %d steps\n\n",
                  blocks, static_cast<long long>(width), static_cast<long long>(width), batch, steps);
      std::printf("| mode | stages x replicas | M | iteration ms | activation MiB per stage | step peak MiB per stage | "
                  "micro-batches held per stage |\n");
      std::printf("|---|---|---|---|---|---|---|\n");
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::string acts, peaks, held;
        for (size_t s = 0; s < r.peak_mib.size(); ++s) {
          acts += fmt::format("{}{:.2f}", s ? " / " : "", r.act_mib[s]);
          peaks += fmt::format("{}{:.2f}", s ? " / " : "", r.peak_mib[s]);
          held += fmt::format("{}{}", s ? " / " : "", r.in_flight[s]);
        }
        const auto& plan = modes[i].plan;
        std::printf("| %s | %d x %zu | %d | %.1f | %s | %s | %s |\n", r.mode.c_str(), plan.num_stages(),
                    plan.stages[0].ranks.size(), plan.micro_batches, r.step_ms, acts.c_str(), peaks.c_str(), held.c_str());
      }
      std::fflush(stdout);
    }
    group->barrier()->wait();
    distributed::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
