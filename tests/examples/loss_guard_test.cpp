// examples/common/loss_guard.h in one process: which intervals of losses refuse a save, what the
// message says, what a checkpoint records and reads back, and that a step --amp fp16's scaler
// skipped does not count. The example programs' use of it: divergence_test.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "examples/common/loss_guard.h"

namespace {

using chorus::examples::LossGuard;
using chorus::examples::TrainingDiverged;

LossGuard guard(double growth = 10) { return LossGuard({.program = "test", .max_loss_growth = growth}); }

// The message of the refused check, or "" when the save may go on.
std::string refusal(LossGuard& g, int64_t step) {
  try {
    g.check(step, "/nonexistent/checkpoint.safetensors", nullptr);
    return "";
  } catch (const TrainingDiverged& e) {
    return e.what();
  }
}

TEST_CASE("a falling loss saves; the first step's loss becomes the reference the checkpoint records") {
  LossGuard g = guard();
  for (int s = 1; s <= 10; ++s) g.observe(s, 2.5 / s);
  CHECK(refusal(g, 10).empty());
  REQUIRE(g.metadata().count("loss_reference"));
  CHECK(std::stod(g.metadata().at("loss_reference")) == 2.5);
  // A spike inside the bound (the mean of the interval 12, below 10 x 2.5) still saves.
  for (int s = 11; s <= 12; ++s) g.observe(s, s == 11 ? 22.0 : 2.0);
  CHECK(refusal(g, 12).empty());
}

TEST_CASE("a mean loss above max-loss-growth x the reference refuses the save, naming step, loss and threshold") {
  LossGuard g = guard();
  g.observe(1, 2.0);
  CHECK(refusal(g, 1).empty());
  g.observe(2, 3.0);
  g.observe(3, 3.6e34);
  const std::string m = refusal(g, 3);
  INFO(m);
  CHECK(m.find("before the checkpoint of step 3") != std::string::npos);
  CHECK(m.find("the mean loss of steps 2-3 is 1.8e+34 (highest 3.6e+34 at step 3)") != std::string::npos);
  CHECK(m.find("threshold 20 = --max-loss-growth 10 x the reference loss 2") != std::string::npos);
  CHECK(m.find("/nonexistent/checkpoint.safetensors") != std::string::npos);
  // The threshold is on the mean: just above refuses, the bound itself saves.
  LossGuard h = guard(4);
  h.observe(1, 2.0);
  h.observe(2, 8.0);
  CHECK(refusal(h, 2).empty());  // mean 5 <= 4 x 2
  h.observe(3, 8.0);
  h.observe(4, 8.02);
  CHECK_FALSE(refusal(h, 4).empty());  // mean 8.01 > 8
}

TEST_CASE("a NaN or infinite loss of an applied step refuses the save; one the fp16 scaler skipped does not count") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  LossGuard g = guard();
  g.observe(1, 2.3);
  g.observe(2, inf, /*applied=*/false);  // an fp16 overflow: the scaler skipped the step, no weight moved
  g.observe(3, nan, /*applied=*/false);
  g.observe(4, 2.2);
  CHECK(refusal(g, 4).empty());
  g.observe(5, 2.1);
  g.observe(6, nan);
  g.observe(7, inf);
  const std::string m = refusal(g, 7);
  INFO(m);
  CHECK(m.find("the loss was nan at step 6 (2 steps with a non-finite loss since the save at step 4)") != std::string::npos);
}

TEST_CASE("a resumed run compares with the checkpoint's reference, not with its own first loss") {
  LossGuard g = guard();
  g.resumed({{"loss_reference", "2.5"}}, 40, "ckpt");
  // Finite garbage weights: every loss of the resumed run is huge, its first included.
  for (int s = 41; s <= 44; ++s) g.observe(s, 3.6e34);
  const std::string m = refusal(g, 44);
  INFO(m);
  CHECK(m.find("steps 41-44") != std::string::npos);
  CHECK(m.find("the reference loss 2.5") != std::string::npos);
  CHECK(g.metadata().at("loss_reference") == "2.5");
  // Without the key (a checkpoint from before the check) this run's first loss is the reference.
  LossGuard old = guard();
  old.resumed({}, 40, "ckpt");
  old.observe(41, 0.3);
  CHECK(refusal(old, 41).empty());
  CHECK(std::stod(old.metadata().at("loss_reference")) == 0.3);
  // A reference below 1 counts as 1: a fine-tuning run that starts near 0 may rise to 10.
  old.observe(42, 9.0);
  CHECK(refusal(old, 42).empty());
  CHECK_THROWS_WITH(guard().resumed({{"loss_reference", "abc"}}, 1, "ckpt"),
                    Catch::Contains("the checkpoint ckpt has loss_reference 'abc', expected a finite number"));
}

TEST_CASE("--max-loss-growth 0 turns the check off; between 0 and 1 is refused") {
  LossGuard g = guard(0);
  g.observe(1, 2.0);
  g.observe(2, std::numeric_limits<double>::quiet_NaN());
  g.observe(3, 1e30);
  CHECK(refusal(g, 3).empty());
  CHECK_THROWS_WITH(guard(0.5), Catch::Contains("--max-loss-growth 0.5 would refuse a loss lower than the first one"));
}

}  // namespace
