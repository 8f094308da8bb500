// DDP with two processes on one device (issue 31, item 5): how much of the gradient allreduce the
// backward hides. At world size 1 (ddp_gpu_bench) NCCL moves no data; here two ranks really send
// their buckets, through Gloo with the device's tensors (staged through page-locked host memory on
// the communication stream), as `multiprocess_gpu_test` checks for values.
//
// The parent times the step alone (one process, no DDP). Then it starts two copies of itself as
// ranks 0 and 1 (a FileStore); each alternates a plain step and a DDP step on the same batch size.
// The two processes share the device, so the fair reference for a DDP step is the plain step of two
// processes at once, not one process alone; both are given. Each rank writes its medians and the
// reducer's device-timed spans (forward, backward, allreduce time, the part of it that overlapped the
// backward; IterationStats, recorded for iterations 0-9) to a JSON file, which the parent prints:
//
//   overhead = DDP step / plain step (two processes) - 1
//   overlap  = overlapped allreduce time / allreduce time
//
//   ddp_overlap_bench [--device cuda|sim] [--model resnet50|bert|tiny] [--steps N] [--warmup N]
//
// GPU use: tools/gpu/run.sh (GPU_BENCH_ONLY=ddp_overlap) runs it on cuda; `--device sim --model tiny`
// runs anywhere (tests/bench:ddp_overlap_sim_test, in CI).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/ddp.h"
#include "distributed/init.h"
#include "examples/models/bert.h"
#include "examples/models/resnet.h"
#include "nn/functional.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

using namespace chorus;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string device = "cuda", model = "resnet50", store, out;
  int steps = 10, warmup = 4, rank = -1;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The model, its one batch's loss, and a description.
struct Work {
  std::string name;
  std::shared_ptr<nn::Module> model;
  std::function<Tensor(nn::Module&)> loss;
};

Work make_work(const std::string& model, Device device) {
  manual_seed(7);  // the same parameters on every rank and in the parent
  if (model == "resnet50" || model == "tiny") {
    const bool tiny = model == "tiny";
    auto net = tiny ? models::resnet18({.num_classes = 10, .small_input = true}) : models::resnet50();
    net->to(device);
    const int64_t batch = tiny ? 4 : 32, side = tiny ? 16 : 224, classes = tiny ? 10 : 1000;
    Tensor images = randn({batch, 3, side, side}).to(device), labels = randint(0, classes, {batch}).to(device);
    return {tiny ? "ResNet-18 (small input), batch 4 x 3x16x16" : "ResNet-50, batch 32 x 3x224x224", net,
            [images, labels](nn::Module& m) { return nn::functional::cross_entropy(m.forward(images), labels); }};
  }
  if (model == "bert") {
    auto net = std::make_shared<models::BertForPreTraining>(models::BertConfig::named("base"));
    net->to(device);
    Tensor ids = randint(1000, 30000, {16, 128}, {.dtype = kInt64}).to(device), next = randint(0, 2, {16}).to(device);
    return {"BERT-base pretraining, batch 16 x 128", net, [ids, next](nn::Module& m) {
              models::BertOutputs out = static_cast<models::BertForPreTraining&>(m).forward(ids, Tensor(), Tensor());
              return nn::functional::cross_entropy(out.prediction_logits.reshape({-1, 30522}), ids.reshape({-1})) +
                     nn::functional::cross_entropy(out.seq_relationship_logits, next);
            }};
  }
  fail("ddp_overlap_bench: unknown --model '{}' (expected resnet50, bert or tiny)", model);
}

// One step (zero_grad, forward + backward, SGD), timed from a synchronized device to a synchronized
// device.
double step_ms(Device device, optim::Optimizer& opt, const std::function<Tensor()>& forward) {
  synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  opt.zero_grad();
  forward().backward();
  opt.step();
  synchronize(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

Device parse_device(const std::string& name) {
  if (name == "cuda") return Device::cuda(0);
  if (name == "sim") return Device::sim(0);
  fail("ddp_overlap_bench: unknown --device '{}' (expected cuda or sim)", name);
}

// A rank: plain and DDP steps in alternation; its figures to opts.out.
int run_rank(const Options& opts) {
  const Device device = parse_device(opts.device);
  auto group = distributed::init_process_group(
      {.backend = "gloo", .init_method = "file://" + opts.store, .rank = opts.rank, .world_size = 2});
  Work plain = make_work(opts.model, device);
  Work wrapped = make_work(opts.model, device);
  distributed::DistributedDataParallel ddp(wrapped.model, group);
  optim::SGD opt_plain(plain.model->parameters(), {.lr = 1e-4, .momentum = 0.9});
  optim::SGD opt_ddp(wrapped.model->parameters(), {.lr = 1e-4, .momentum = 0.9});
  std::vector<double> plain_ms, ddp_ms;
  for (int i = 0; i < opts.warmup + opts.steps; ++i) {
    const double a = step_ms(device, opt_plain, [&] { return plain.loss(*plain.model); });
    const double b = step_ms(device, opt_ddp, [&] { return ddp.forward([&] { return wrapped.loss(*wrapped.model); }); });
    if (i >= opts.warmup) {
      plain_ms.push_back(a);
      ddp_ms.push_back(b);
    }
  }
  // The reducer's device-timed iterations after the warm-up (it records iterations 0-9).
  std::vector<double> comm, overlapped, forward, backward;
  for (const distributed::IterationStats& st : ddp.stats()) {
    if (st.iteration < opts.warmup) continue;
    comm.push_back(st.communication_ms);
    overlapped.push_back(st.overlapped_ms);
    forward.push_back(st.forward_ms);
    backward.push_back(st.backward_ms);
  }
  nlohmann::json result = {{"rank", opts.rank},
                           {"model", plain.name},
                           {"plain_ms", median(plain_ms)},
                           {"ddp_ms", median(ddp_ms)},
                           {"spans", comm.size()},
                           {"communication_ms", median(comm)},
                           {"overlapped_ms", median(overlapped)},
                           {"forward_ms", median(forward)},
                           {"backward_ms", median(backward)},
                           {"buckets", ddp.reducer().buckets().size()}};
  const std::string tmp = opts.out + ".tmp";
  std::ofstream(tmp) << result.dump(1);
  fs::rename(tmp, opts.out);
  distributed::destroy_process_group();
  return 0;
}

// Starts this program as rank `rank`; returns its pid.
pid_t spawn_rank(const Options& opts, int rank, const std::string& out) {
  std::vector<std::string> args = {"/proc/self/exe", "--device",     opts.device,          "--model", opts.model,
                                   "--steps",        std::to_string(opts.steps), "--warmup", std::to_string(opts.warmup),
                                   "--rank",         std::to_string(rank),       "--store",  opts.store,
                                   "--out",          out};
  const pid_t pid = fork();
  if (pid < 0) fail("ddp_overlap_bench: fork failed");
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::perror("ddp_overlap_bench: execv");
    _exit(127);
  }
  return pid;
}

int run_parent(Options opts) {
  const Device device = parse_device(opts.device);
  if (device.is_cuda() && device_count(DeviceType::CUDA) == 0) {
    std::fprintf(stderr, "ddp_overlap_bench: no CUDA device\n");
    return 2;
  }
  // One process alone, no DDP (before the ranks start: the device is the parent's alone).
  double alone = 0;
  std::string name;
  {
    Work w = make_work(opts.model, device);
    name = w.name;
    optim::SGD opt(w.model->parameters(), {.lr = 1e-4, .momentum = 0.9});
    std::vector<double> ms;
    for (int i = 0; i < opts.warmup + opts.steps; ++i) {
      const double t = step_ms(device, opt, [&] { return w.loss(*w.model); });
      if (i >= opts.warmup) ms.push_back(t);
    }
    alone = median(ms);
  }
  const fs::path dir = fs::temp_directory_path() / ("chorus_ddp_overlap_" + std::to_string(getpid()));
  fs::create_directories(dir);
  opts.store = (dir / "store").string();
  const std::string out0 = (dir / "rank0.json").string(), out1 = (dir / "rank1.json").string();
  const pid_t pids[2] = {spawn_rank(opts, 0, out0), spawn_rank(opts, 1, out1)};
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
  }
  if (!ok || !fs::exists(out0) || !fs::exists(out1)) {
    std::fprintf(stderr, "ddp_overlap_bench: a rank failed (its output is above)\n");
    fs::remove_all(dir);
    return 1;
  }
  nlohmann::json r[2];
  std::ifstream(out0) >> r[0];
  std::ifstream(out1) >> r[1];
  fs::remove_all(dir);
  std::printf("DDP over Gloo with two processes on one %s device (each rank's batch as one process's), "
              "medians of %d steps after %d warm-up; spans from the reducer's device events\n\n",
              device.str().c_str(), opts.steps, opts.warmup);
  std::printf("| model | rank | one process alone, no DDP ms | two processes, no DDP ms | two processes, DDP ms | "
              "overhead | allreduce ms | overlapped with backward ms | overlap | buckets |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const nlohmann::json& x : r) {
    const double plain = x["plain_ms"], with = x["ddp_ms"], comm = x["communication_ms"], over = x["overlapped_ms"];
    std::printf("| %s | %d | %.2f | %.2f | %.2f | %+.1f%% | %.2f | %.2f | %.0f%% | %d |\n", name.c_str(),
                x["rank"].get<int>(), alone, plain, with, 100.0 * (with - plain) / plain, comm, over,
                comm > 0 ? 100.0 * over / comm : 0.0, x["buckets"].get<int>());
  }
  // One line a rank for scripts (tools/gpu/run.sh's summary).
  for (const nlohmann::json& x : r) {
    nlohmann::json row = x;
    row["alone_ms"] = alone;
    row["device"] = device.str();
    std::printf("ddp_overlap_json %s\n", row.dump().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--device") opts.device = value;
    else if (flag == "--model") opts.model = value;
    else if (flag == "--steps") opts.steps = std::max(1, std::atoi(value.c_str()));
    else if (flag == "--warmup") opts.warmup = std::max(0, std::atoi(value.c_str()));
    else if (flag == "--rank") opts.rank = std::atoi(value.c_str());
    else if (flag == "--store") opts.store = value;
    else if (flag == "--out") opts.out = value;
    else {
      std::fprintf(stderr, "usage: ddp_overlap_bench [--device cuda|sim] [--model resnet50|bert|tiny] [--steps N] "
                           "[--warmup N]\n");
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "ddp_overlap_bench: every option takes a value\n");
    return 2;
  }
  try {
    return opts.rank >= 0 ? run_rank(opts) : run_parent(opts);
  } catch (const Error& e) {
    std::fprintf(stderr, "ddp_overlap_bench%s: %s\n", opts.rank >= 0 ? (" rank " + std::to_string(opts.rank)).c_str() : "",
                 e.what());
    return 1;
  }
}
