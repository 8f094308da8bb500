// The multi-tensor launch plan (kernels/shared/multi_tensor_plan.h) that the CUDA optimizer steps
// run: every element of every tensor in exactly one block, within the per-launch limits on tensors
// and blocks, tensors split across launches continuing as the next launch's first tensor, empty
// tensors given nothing. Checked on random lists with small limits (many splits) and on the CUDA
// limits with ResNet-like parameter sizes.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "kernels/shared/multi_tensor_plan.h"
#include "tensor/error.h"

namespace chorus::kernels::shared {
namespace {

// Checks `plan` for `numels` under `limits`; returns how many launches split a tensor with the next.
int check_plan(const std::vector<int64_t>& numels, const MultiTensorLimits& limits,
               const std::vector<MultiTensorLaunch>& plan) {
  std::vector<std::vector<int>> hits(numels.size());
  for (size_t t = 0; t < numels.size(); ++t) hits[t].assign(numels[t], 0);
  int splits = 0;
  for (size_t l = 0; l < plan.size(); ++l) {
    const MultiTensorLaunch& launch = plan[l];
    INFO("launch " << l);
    REQUIRE(!launch.tensors.empty());
    REQUIRE(!launch.block_tensor.empty());
    REQUIRE(static_cast<int>(launch.tensors.size()) <= limits.max_tensors);
    REQUIRE(static_cast<int>(launch.block_tensor.size()) <= limits.max_blocks);
    REQUIRE(launch.block_chunk.size() == launch.block_tensor.size());
    for (int t : launch.tensors) REQUIRE(numels.at(t) > 0);
    for (size_t j = 1; j < launch.tensors.size(); ++j) REQUIRE(launch.tensors[j] > launch.tensors[j - 1]);
    if (l > 0 && plan[l - 1].tensors.back() == launch.tensors.front()) ++splits;
    for (size_t b = 0; b < launch.block_tensor.size(); ++b) {
      const int t = launch.tensors.at(launch.block_tensor[b]);
      const int64_t lo = launch.block_chunk[b] * limits.chunk_elements;
      const int64_t hi = std::min(numels[t], lo + limits.chunk_elements);
      REQUIRE(lo < hi);
      for (int64_t i = lo; i < hi; ++i) ++hits[t][i];
    }
  }
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int64_t i = 0; i < numels[t]; ++i) {
      if (hits[t][i] != 1) FAIL("tensor " << t << " element " << i << " updated " << hits[t][i] << " times");
    }
  }
  return splits;
}

}  // namespace

TEST_CASE("a tensor longer than a launch's blocks continues in the next launches", "[multi_tensor_plan]") {
  const MultiTensorLimits limits{.max_tensors = 4, .max_blocks = 4, .chunk_elements = 10};
  const auto plan = plan_multi_tensor({95}, limits);  // 10 chunks: 4 + 4 + 2 blocks
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].block_chunk == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(plan[1].block_chunk == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(plan[2].block_chunk == std::vector<int64_t>{8, 9});
  for (const auto& launch : plan) CHECK(launch.tensors == std::vector<int>{0});
  CHECK(check_plan({95}, limits, plan) == 2);
}

TEST_CASE("a launch holds at most max_tensors tensors; empty tensors get no slot", "[multi_tensor_plan]") {
  const MultiTensorLimits limits{.max_tensors = 3, .max_blocks = 100, .chunk_elements = 8};
  const std::vector<int64_t> numels = {0, 5, 0, 1, 9, 0, 3, 2, 0};
  const auto plan = plan_multi_tensor(numels, limits);
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].tensors == std::vector<int>{1, 3, 4});
  CHECK(plan[0].block_tensor == std::vector<int>{0, 1, 2, 2});
  CHECK(plan[1].tensors == std::vector<int>{6, 7});
  CHECK(check_plan(numels, limits, plan) == 0);
  CHECK(plan_multi_tensor({0, 0}, limits).empty());
  CHECK(plan_multi_tensor({}, limits).empty());
}

TEST_CASE("random lists under small limits: every element exactly once", "[multi_tensor_plan]") {
  std::mt19937_64 rng(5);
  int splits = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const MultiTensorLimits limits{.max_tensors = 1 + static_cast<int>(rng() % 5),
                                   .max_blocks = 1 + static_cast<int>(rng() % 7),
                                   .chunk_elements = 1 + static_cast<int64_t>(rng() % 9)};
    std::vector<int64_t> numels(rng() % 20);
    for (int64_t& n : numels) n = rng() % 4 == 0 ? 0 : static_cast<int64_t>(rng() % 60);
    INFO("trial " << trial);
    splits += check_plan(numels, limits, plan_multi_tensor(numels, limits));
  }
  CHECK(splits > 100);  // the trials did exercise split tensors
}

TEST_CASE("CUDA's limits on a ResNet-18-like parameter list", "[multi_tensor_plan]") {
  // 62 tensors: conv weights up to 2.4M elements (37 chunks), BatchNorm vectors of 64-512.
  std::vector<int64_t> numels;
  for (int64_t c : {64, 64, 64, 64, 64, 128, 128, 128, 128, 256, 256, 256, 256, 512, 512, 512, 512}) {
    numels.push_back(c * c * 9);
    numels.push_back(c);
    numels.push_back(c);
  }
  numels.push_back(512 * 1000);
  numels.push_back(1000);
  for (int depth_tensors : {64, 48, 36, 30}) {
    const MultiTensorLimits limits{.max_tensors = depth_tensors, .max_blocks = 320, .chunk_elements = 65536};
    const auto plan = plan_multi_tensor(numels, limits);
    int64_t blocks = 0;
    for (const auto& launch : plan) blocks += static_cast<int64_t>(launch.block_tensor.size());
    int64_t want_blocks = 0;
    for (int64_t n : numels) want_blocks += (n + 65535) / 65536;
    CHECK(blocks == want_blocks);
    CHECK(plan.size() >= static_cast<size_t>((want_blocks + 319) / 320));
    check_plan(numels, limits, plan);
  }
}

TEST_CASE("limits below 1 are refused", "[multi_tensor_plan]") {
  CHECK_THROWS_WITH(plan_multi_tensor({4}, {.max_tensors = 0}), Catch::Contains("limits must be >= 1"));
  CHECK_THROWS_WITH(plan_multi_tensor({4}, {.chunk_elements = 0}), Catch::Contains("chunk_elements 0"));
}

}  // namespace chorus::kernels::shared
