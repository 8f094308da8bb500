// One optimizer step over a whole model's parameters on the CPU: the per-tensor path (foreach=false:
// one kernel call, and one parallel_for, per parameter) against the multi-tensor foreach path (one
// loop over every parameter's elements, split evenly across threads), for SGD with momentum, Adam
// and AdamW on ResNet-18's 62 parameters (11.7M elements), BERT-mini's 78 (11.3M elements, many
// small LayerNorm and bias vectors) and 300 small tensors (0.35M elements). Medians of --reps steps
// after --warmup, at 1 and 2 threads, on random gradients. Both paths produce bit-identical
// parameters (tests/optim:foreach_test).
//   bazel run -c opt //tests/bench:optim_bench -- [--reps N] [--warmup N]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "examples/models/bert.h"
#include "examples/models/resnet.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"
#include "utils/cli.h"

namespace {

using chorus::Tensor;

struct Model {
  std::string name;
  std::vector<Tensor> params;
};

// Copies of the parameters with random gradients, so each optimizer starts from the same values.
std::vector<Tensor> with_grads(const std::vector<Tensor>& params) {
  chorus::Generator gen(3);
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor q = p.detach().clone().requires_grad_();
    q.mutable_grad() = chorus::randn(p.sizes(), {}, &gen).mul(1e-3);
    out.push_back(q);
  }
  return out;
}

std::unique_ptr<chorus::optim::Optimizer> make(const std::string& which, const std::vector<Tensor>& params,
                                               bool foreach) {
  namespace o = chorus::optim;
  if (which == "SGD momentum") {
    return std::make_unique<o::SGD>(params, o::SGDOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4,
                                                          .foreach = foreach});
  }
  if (which == "Adam") return std::make_unique<o::Adam>(params, o::AdamOptions{.lr = 1e-3, .foreach = foreach});
  return std::make_unique<o::AdamW>(params, o::AdamOptions{.lr = 1e-3, .weight_decay = 0.01, .foreach = foreach});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"optimizer step: per-tensor against foreach"};
  int reps = 30, warmup = 5;
  app.add_option("--reps", reps, "timed steps per row (median reported)");
  app.add_option("--warmup", warmup, "untimed steps before timing");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  chorus::manual_seed(1);
  std::vector<Model> models;
  models.push_back({"ResNet-18", chorus::models::resnet18()->parameters()});
  chorus::models::BertForPreTraining bert(chorus::models::BertConfig::named("mini"));
  models.push_back({"BERT-mini", bert.parameters()});
  // Where a per-tensor step is all overhead: 300 small tensors (biases, norm weights: 64-4096
  // elements, 0.35M in all), as a model's non-matrix parameters.
  Model small{"300 small", {}};
  for (int i = 0; i < 300; ++i) small.params.push_back(chorus::randn({64 << (i % 7)}).requires_grad_());
  models.push_back(small);

  std::printf("%-10s %7s %11s %-13s %7s %15s %13s %8s\n", "model", "tensors", "elements", "optimizer", "threads",
              "per-tensor ms", "foreach ms", "speedup");
  for (const Model& m : models) {
    int64_t elements = 0;
    for (const Tensor& p : m.params) elements += p.numel();
    for (const std::string which : {"SGD momentum", "Adam", "AdamW"}) {
      for (int threads : {1, 2}) {
        chorus::set_num_threads(threads);
        double ms[2];
        for (bool foreach : {false, true}) {
          const std::vector<Tensor> params = with_grads(m.params);
          auto opt = make(which, params, foreach);
          ms[foreach] = 1e3 * chorus::bench::median_time([&] { opt->step(); }, warmup, reps);
        }
        std::printf("%-10s %7zu %11lld %-13s %7d %15.3f %13.3f %7.2fx\n", m.name.c_str(), m.params.size(),
                    static_cast<long long>(elements), which.c_str(), threads, ms[0], ms[1], ms[0] / ms[1]);
      }
    }
  }
  return 0;
}
