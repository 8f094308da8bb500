// The examples' divergence check (examples/common/loss_guard.h) as a user meets it: a training
// whose loss explodes after a good checkpoint, or that resumes from finite garbage weights, exits
// with code 76 naming the step, the loss and the threshold, and the last checkpoint keeps its
// bytes; with --max-loss-growth 0 the same run saves over it (the check is what protects it). MNIST
// (its own loop) alone and under chorusrun with the loss exploding on one rank only, GPT through
// the Trainer. The explosion is injected with the test-only CHORUS_TEST_LOSS_FROM_STEP, except in
// the resume case, whose weights really are garbage.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>

#include "nn/serialize.h"
#include "tests/examples/example_runs.h"

namespace {

namespace fs = std::filesystem;

using chorus::testing::slurp;
using chorus::testing::examples::binary;
using chorus::testing::examples::Run;
using chorus::testing::examples::run;
using chorus::testing::examples::scratch;

const std::string mnist_flags =
    " --model mlp --epochs 1 --batch-size 64 --threads 1 --workers 0 --log-every 60 --checkpoint-every 2";

// The number after `after` in `text` (e.g. the threshold in the message), NaN when absent.
double number_after(const std::string& text, const std::string& after) {
  const size_t at = text.find(after);
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + after.size()));
}

// A good checkpoint at step 2 in `dir`, its bytes and the run's first loss.
struct Good {
  std::string bytes;
  double first_loss;
};
Good mnist_good_checkpoint(const fs::path& dir) {
  const Run r = run(binary("examples/mnist/mnist") + mnist_flags + " --max-steps 2 --checkpoint-dir " + dir.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string bytes = slurp((dir / "checkpoint.safetensors").string());
  REQUIRE(bytes.size() > 100000);
  return {bytes, r.summary["first_batch_loss"].get<double>()};
}

TEST_CASE("mnist: a loss that explodes after a good checkpoint exits 76 and leaves that checkpoint's bytes",
          "[examples][divergence]") {
  const fs::path dir = scratch("mnist_exploded");
  const Good good = mnist_good_checkpoint(dir);
  const std::string ckpt = (dir / "checkpoint.safetensors").string();
  const std::string resume = binary("examples/mnist/mnist") + mnist_flags + " --max-steps 6 --resume --checkpoint-dir " +
                             dir.string();

  SECTION("finite but 1e30 from step 3: the mean of steps 3-4 above 10 x the first loss") {
    const Run r = run("CHORUS_TEST_LOSS_FROM_STEP=3:1e30 " + resume);
    INFO(r.output);
    CHECK(r.code == 76);
    CHECK(r.output.find("training diverged before the checkpoint of step 4: the mean loss of steps 3-4 is 1e+30 "
                        "(highest 1e+30 at step 3)") != std::string::npos);
    // The threshold is 10 x the first loss of the run that made the checkpoint (read back from it).
    CHECK(number_after(r.output, "above the threshold ") == Approx(10 * good.first_loss).epsilon(1e-5));
    CHECK(r.output.find("the last good checkpoint " + ckpt + " (step 2) is kept as it was") != std::string::npos);
    CHECK(r.output.find("saved " + ckpt) == std::string::npos);
    CHECK(slurp(ckpt) == good.bytes);
  }
  SECTION("NaN at step 4") {
    const Run r = run("CHORUS_TEST_LOSS_FROM_STEP=4:nan " + resume);
    INFO(r.output);
    CHECK(r.code == 76);
    CHECK(r.output.find("the loss was nan at step 4 (1 step with a non-finite loss since the save at step 2)") !=
          std::string::npos);
    CHECK(slurp(ckpt) == good.bytes);
  }
  SECTION("control: with --max-loss-growth 0 the same run saves over it") {
    const Run r = run("CHORUS_TEST_LOSS_FROM_STEP=3:1e30 " + resume + " --max-loss-growth 0");
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("saved " + ckpt + " at epoch 1 step 4") != std::string::npos);
    CHECK(slurp(ckpt) != good.bytes);
  }
  SECTION("control: below the threshold the run saves as before") {
    const Run r = run("CHORUS_TEST_LOSS_FROM_STEP=3:" + std::to_string(9 * good.first_loss) + " " + resume);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("saved " + ckpt + " at epoch 1 step 6") != std::string::npos);
  }
}

// The probe's case: a checkpoint whose weights are finite garbage (here every tensor of the model
// x 1e4, written with valid checksums; the probe stripped them) resumes, trains and must not be
// saved as if it were good.
TEST_CASE("mnist: a run resumed from finite garbage weights exits 76 without saving over the file",
          "[examples][divergence]") {
  const fs::path dir = scratch("mnist_garbage");
  mnist_good_checkpoint(dir);
  const std::string ckpt = (dir / "checkpoint.safetensors").string();
  {
    chorus::nn::Checkpoint c = chorus::nn::Checkpoint::load(ckpt);
    for (auto& [name, t] : c.model) t = t.mul(1e4);
    c.save(ckpt);
  }
  const std::string garbage = slurp(ckpt);
  const Run r = run(binary("examples/mnist/mnist") + mnist_flags + " --max-steps 6 --resume --checkpoint-dir " +
                    dir.string());
  INFO(r.output);
  CHECK(r.code == 76);
  CHECK(r.output.find("training diverged before the checkpoint of step 4: the mean loss of steps 3-4 is ") !=
        std::string::npos);
  CHECK(number_after(r.output, "the mean loss of steps 3-4 is ") > 1e6);
  CHECK(slurp(ckpt) == garbage);
}

// Only rank 1 sees the explosion: rank 0, which writes the file, must learn it, and nobody may
// wait in a collective for a rank that stopped.
TEST_CASE("mnist under chorusrun: a loss exploding on rank 1 only stops both ranks before rank 0 saves",
          "[examples][divergence]") {
  const fs::path dir = scratch("mnist_two_ranks");
  const std::string job = binary("distributed/launcher/chorusrun") + " --nproc-per-node 2 --master-port " +
                          std::to_string(chorus::testing::free_port()) + " " + binary("examples/mnist/mnist") +
                          mnist_flags + " --checkpoint-dir " + dir.string();
  const Run good = run(job + " --max-steps 2");
  INFO(good.output);
  REQUIRE(good.code == 0);
  const std::string ckpt = (dir / "checkpoint.safetensors").string(), bytes = slurp(ckpt);
  const Run r = run("CHORUS_TEST_LOSS_FROM_STEP=3:1e30:1 " + job + " --max-steps 6 --resume");
  INFO(r.output);
  CHECK(r.code == 76);
  CHECK(r.output.find("training diverged before the checkpoint of step 4") != std::string::npos);
  CHECK(r.output.find("exited with code 76") != std::string::npos);
  CHECK(r.output.find("saved " + ckpt + " at epoch 1 step 4") == std::string::npos);
  CHECK(slurp(ckpt) == bytes);
}

TEST_CASE("gpt (the Trainer): a loss that explodes after a good checkpoint exits 76 and leaves that checkpoint's bytes",
          "[examples][divergence]") {
  const fs::path dir = scratch("gpt_exploded");
  const std::string gpt = binary("examples/gpt/gpt") +
                          " --config tiny --seq-len 32 --batch-size 8 --threads 1 --log-every 0 --lr 3e-3 --steps 8 "
                          "--eval-sequences 16 --checkpoint-every 3 --checkpoint-dir " + dir.string();
  const Run good = run(gpt + " --max-steps 3");
  INFO(good.output);
  REQUIRE(good.code == 0);
  const std::string ckpt = (dir / "checkpoint.safetensors").string(), bytes = slurp(ckpt);
  const Run r = run("CHORUS_TEST_LOSS_FROM_STEP=5:1e30 " + gpt + " --resume");
  INFO(r.output);
  CHECK(r.code == 76);
  CHECK(r.output.find("gpt: training diverged before the checkpoint of step 6: the mean loss of steps 4-6 is ") !=
        std::string::npos);
  CHECK(r.output.find("(highest 1e+30 at step 5)") != std::string::npos);
  CHECK(number_after(r.output, "above the threshold ") ==
        Approx(10 * good.summary["first_step_loss"].get<double>()).epsilon(1e-5));
  CHECK(r.output.find("the last good checkpoint " + ckpt + " (step 3) is kept as it was") != std::string::npos);
  CHECK(slurp(ckpt) == bytes);
}

}  // namespace
