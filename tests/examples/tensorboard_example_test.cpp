// --tensorboard in the examples, as a user runs them: the event files a run leaves, read back with
// chorus::utils::read_events (whose format tests/utils checks against Google's protobuf), hold the
// values the run printed in its JSON summary, at the right steps, in the layout tensorboard_log.h
// describes (the job's values in DIR, each rank's in DIR/rank<r>).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/examples/example_runs.h"
#include "utils/event_file_reader.h"

namespace {

namespace fs = std::filesystem;

using chorus::testing::examples::binary;
using chorus::testing::examples::Run;
using chorus::testing::examples::run;
using chorus::testing::examples::scratch;

// tag -> step -> value, of the scalars in the one event file directly in `dir` (not its sub-runs).
using Scalars = std::map<std::string, std::map<int64_t, float>>;
Scalars scalars_in(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path());
  }
  INFO(dir);
  REQUIRE(files.size() == 1);
  const chorus::utils::EventFileContents contents = chorus::utils::read_events(files[0].string());
  CHECK_FALSE(contents.truncated);
  REQUIRE(!contents.events.empty());
  CHECK(contents.events[0].file_version == "brain.Event:2");
  Scalars out;
  for (const auto& event : contents.events) {
    for (const auto& v : event.values) {
      if (v.simple_value) out[v.tag][event.step] = *v.simple_value;
    }
  }
  return out;
}

std::vector<int64_t> steps_of(const Scalars& s, const std::string& tag) {
  std::vector<int64_t> steps;
  if (auto it = s.find(tag); it != s.end()) {
    for (const auto& [step, value] : it->second) steps.push_back(step);
  }
  return steps;
}

}  // namespace

TEST_CASE("mnist --tensorboard on 2 processes: the job's values in DIR, each rank's DDP timings in DIR/rank<r>",
          "[examples][tensorboard]") {
  const std::string dir = scratch("mnist_tb");
  Run r = run(binary("distributed/launcher/chorusrun") + " --nproc-per-node 2 --master-port " +
              std::to_string(chorus::testing::free_port()) + " " + binary("examples/mnist/mnist") +
              " --max-steps 6 --epochs 1 --threads 1 --log-every 0 --tensorboard " + dir);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::vector<int64_t> steps{1, 2, 3, 4, 5, 6};
  const Scalars job = scalars_in(dir);
  for (const char* tag : {"train/loss", "train/accuracy", "train/lr", "train/samples_per_s"}) {
    INFO(tag);
    CHECK(steps_of(job, tag) == steps);
  }
  // The last step's loss is rank 0's, as the summary's (a float either way: exactly equal).
  CHECK(job.at("train/loss").at(6) == static_cast<float>(r.summary["last_batch_loss"].get<double>()));
  CHECK(job.at("train/loss").at(1) == static_cast<float>(r.summary["first_batch_loss"].get<double>()));
  for (const auto& [step, accuracy] : job.at("train/accuracy")) CHECK((accuracy >= 0 && accuracy <= 1));
  CHECK(job.count("ddp/backward_ms") == 0);  // per rank only
  for (int rank = 0; rank < 2; ++rank) {
    const Scalars mine = scalars_in(dir + "/rank" + std::to_string(rank));
    INFO("rank " << rank);
    CHECK(steps_of(mine, "train/step_ms") == steps);
    // The Reducer records its first 10 iterations: each step's DDP timings, communication included.
    for (const char* tag : {"ddp/forward_ms", "ddp/backward_ms", "ddp/communication_ms", "ddp/overlapped_ms"}) {
      INFO(tag);
      CHECK(steps_of(mine, tag) == steps);
    }
    for (const auto& [step, ms] : mine.at("ddp/communication_ms")) CHECK(ms > 0);
    CHECK(mine.count("train/loss") == 0);  // the job's values are rank 0's, in DIR
  }
}

TEST_CASE("gpt --tensorboard alone: losses, learning rate, gradient norm, held-out loss and the sample",
          "[examples][tensorboard]") {
  const std::string dir = scratch("gpt_tb");
  Run r = run(binary("examples/gpt/gpt") +
              " --config tiny --seq-len 32 --batch-size 8 --threads 1 --log-every 0 --lr 3e-3 --steps 4"
              " --eval-sequences 8 --sample 8 --tensorboard " + dir);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const Scalars job = scalars_in(dir);  // alone: per-rank values in DIR too, no rank folders
  CHECK_FALSE(fs::exists(dir + "/rank0"));
  const std::vector<int64_t> steps{1, 2, 3, 4};
  for (const char* tag : {"train/loss", "train/lr", "train/examples_per_s", "train/grad_norm", "train/step_ms"}) {
    INFO(tag);
    CHECK(steps_of(job, tag) == steps);
  }
  CHECK(job.at("train/loss").at(4) == static_cast<float>(r.summary["last_step_loss"].get<double>()));
  CHECK(job.at("train/loss").at(1) == static_cast<float>(r.summary["first_step_loss"].get<double>()));
  CHECK(job.at("heldout/loss").at(0) == static_cast<float>(r.summary["heldout_loss_before"].get<double>()));
  CHECK(job.at("heldout/loss").at(4) == static_cast<float>(r.summary["heldout_loss"].get<double>()));
  for (const auto& [step, norm] : job.at("train/grad_norm")) CHECK(norm > 0);
  // The learning rate each step used (read before the example steps its scheduler): no warm-up
  // steps in 10% of 4, then the cosine from 3e-3 to 3e-4 over the 4 steps, step k at index k - 1.
  for (int64_t k = 1; k <= 4; ++k) {
    const double expected = 3e-4 + (3e-3 - 3e-4) * (1 + std::cos(M_PI * static_cast<double>(k - 1) / 4)) / 2;
    INFO("step " << k);
    CHECK(job.at("train/lr").at(k) == Approx(expected).epsilon(1e-6));
  }
  // The sample, as text.
  bool sample_found = false;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    for (const auto& event : chorus::utils::read_events(e.path().string()).events) {
      for (const auto& v : event.values) {
        if (v.tag == "sample/text_summary") {
          REQUIRE(v.tensor_strings.size() == 1);
          CHECK(v.tensor_strings[0].size() > 0);
          CHECK(event.step == 4);
          sample_found = true;
        }
      }
    }
  }
  CHECK(sample_found);
}

TEST_CASE("--tensorboard into a folder that cannot be made is refused with its path", "[examples][tensorboard]") {
  const std::string file = scratch("a_file");
  std::ofstream(file) << "not a folder";
  Run r = run(binary("examples/mnist/mnist") + " --max-steps 1 --threads 1 --tensorboard " + file + "/runs");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Catch::Contains(file + "/runs"));
}
