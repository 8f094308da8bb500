// The profiler on a small Sequential: exact byte counts (outputs, parameters, what forward leaves
// for backward, measured on the sim device), positive median times, the batch, and the layers
// left as they were (on the CPU, no gradients).
#include <catch2/catch.hpp>

#include "distributed/pipeline/planner/profiler.h"
#include "nn/nn.h"
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

TEST_CASE("the profiler refuses empty models and bad repeat counts", "[planner][profiler][errors]") {
  REQUIRE_THROWS_WITH(profile_layers({}, randn({2, 2})), Catch::Contains("got no layers, expected at least one"));
  nn::Sequential model{std::make_shared<nn::Linear>(2, 2)};
  REQUIRE_THROWS_WITH(profile_sequential(model, randn({2, 2}), {.repeats = 0}),
                      Catch::Contains("repeats = 0, expected warmup >= 0 and repeats >= 1"));
}
