// The profiler on a small Sequential: exact byte counts (outputs, parameters, what forward leaves
// for backward, measured on the sim device), positive median times, the batch, and the layers
// left as they were (on the CPU, no gradients).
#include <catch2/catch.hpp>

#include "distributed/pipeline/planner/profiler.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace chorus;
using namespace chorus::distributed::pipeline::planner;

TEST_CASE("profiling a Sequential measures bytes exactly and times per layer", "[planner][profiler]") {
  manual_seed(3);
  auto block = std::make_shared<nn::Sequential>();
  block->push_back(std::make_shared<nn::Linear>(16, 32));
  block->push_back(std::make_shared<nn::ReLU>());
  nn::Sequential model{block, std::make_shared<nn::Linear>(32, 8)};
  const ModelProfile p = profile_sequential(model, randn({6, 16}), {.warmup = 1, .repeats = 3});
  REQUIRE(p.batch == 6);
  REQUIRE(p.num_layers() == 2);
  REQUIRE(p.layers[0].name == "0");
  REQUIRE(p.layers[0].param_bytes == (16 * 32 + 32) * 4);
  REQUIRE(p.layers[1].param_bytes == (32 * 8 + 8) * 4);
  REQUIRE(p.layers[0].activation_bytes == 6 * 32 * 4);
  REQUIRE(p.layers[1].activation_bytes == 6 * 8 * 4);
  // Linear + ReLU keeps only ReLU's output (ReLU's backward reads its output; the Linear's output
  // is dropped once ReLU has run, and the Linear's input arrived from outside and is not counted);
  // the second Linear keeps its output.
  REQUIRE(p.layers[0].saved_bytes == 6 * 32 * 4);
  REQUIRE(p.layers[1].saved_bytes == 6 * 8 * 4);
  for (const LayerProfile& l : p.layers) {
    REQUIRE(l.forward_ms > 0);
    REQUIRE(l.backward_ms > 0);
  }
  for (const Tensor& t : model.parameters()) {
    REQUIRE(t.device() == Device::cpu());
    REQUIRE_FALSE(t.grad().defined());
  }
}

TEST_CASE("the profiler times more batch sizes, the gradient accumulation and an optimizer step", "[planner][profiler]") {
  manual_seed(4);
  nn::Sequential model{std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(64, 4)};
  std::vector<Tensor> before;
  for (const Tensor& t : model.parameters()) before.push_back(t.detach().clone());
  ProfileOptions options{.warmup = 1, .repeats = 3, .measure_saved_bytes = false, .extra_batches = {2, 24, 8, 24}};
  int built = 0;
  options.make_optimizer = [&](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    ++built;
    return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.5, .momentum = 0.9});
  };
  const ModelProfile p = profile_sequential(model, randn({8, 64}), options);
  // The profile's own batch (8) and the duplicate 24 are not repeated; the rest sorted.
  REQUIRE(p.layers[0].timings.size() == 2);
  REQUIRE(p.layers[0].timings[0].batch == 2);
  REQUIRE(p.layers[0].timings[1].batch == 24);
  for (const LayerProfile& l : p.layers)
    for (const BatchTiming& t : l.timings) REQUIRE((t.forward_ms > 0 && t.backward_ms > 0));
  // Layers with parameters get an optimizer step time (ReLU has none: no optimizer built for it).
  REQUIRE(built == 2);
  REQUIRE(p.layers[0].optimizer_ms > 0);
  REQUIRE(p.layers[1].optimizer_ms == 0);
  REQUIRE(p.layers[2].optimizer_ms > 0);
  for (const LayerProfile& l : p.layers) REQUIRE(l.grad_accumulate_ms >= 0);
  // The optimizer's steps were undone: the parameters are exactly what they were, without grads.
  const std::vector<Tensor> after = model.parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    REQUIRE((after[i].detach() - before[i]).abs().max().item<float>() == 0.0f);
    REQUIRE_FALSE(after[i].grad().defined());
  }
  REQUIRE_THROWS_WITH(profile_sequential(model, randn({8, 64}), {.extra_batches = {0}}),
                      Catch::Contains("extra batch size of 0, expected at least 1"));
}

TEST_CASE("the profiler refuses empty models and bad repeat counts", "[planner][profiler][errors]") {
  REQUIRE_THROWS_WITH(profile_layers({}, randn({2, 2})), Catch::Contains("got no layers, expected at least one"));
  nn::Sequential model{std::make_shared<nn::Linear>(2, 2)};
  REQUIRE_THROWS_WITH(profile_sequential(model, randn({2, 2}), {.repeats = 0}),
                      Catch::Contains("repeats = 0, expected warmup >= 0 and repeats >= 1"));
}
