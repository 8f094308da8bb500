// Trains an MLP on MNIST with DAPPLE's hybrid pipeline + data parallelism, under chorusrun:
//
//   chorusrun --nproc-per-node 3 bazel-bin/examples/pipeline/pipeline --replicas 2,1 --micro-batches 4
//   chorusrun --nproc-per-node 4 bazel-bin/examples/pipeline/pipeline --pipeline-stages 4 --schedule gpipe
//   chorusrun --nproc-per-node 3 bazel-bin/examples/pipeline/pipeline --plan plan.json   # the planner's
//
// Every rank builds the whole model with the same seed and reads the same global batches (the first
// stage uses the images, the last the labels); the runtime keeps each rank's layers only. At the
// end the whole model is gathered on rank 0, which measures test accuracy and prints one JSON line
// {"summary": {...}}. See docs/pipeline.md.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "data/data.h"
#include "distributed/init.h"
#include "distributed/pipeline/pipeline.h"
#include "examples/common/example_util.h"
#include "examples/common/pipeline_flags.h"
#include "examples/common/tensorboard_log.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "utils/cli.h"

using namespace chorus;
namespace F = chorus::nn::functional;
namespace pp = chorus::distributed::pipeline;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  examples::PipelineFlags pipeline;
  int64_t batch_size = 128;
  int hidden = 256;
  int hidden_layers = 3;
  int epochs = 1;
  int64_t max_steps = 0;
  double lr = 0.05;
  uint64_t seed = 1;
  std::string data_dir;
  std::string tensorboard;  // --tensorboard DIR
  double log_every_s = 5;
  int64_t test_limit = 0;
};

// Flatten, then (Linear, ReLU) blocks, then the classifier: 2 + 2 * hidden_layers layers, each a
// unit the plan can cut between.
std::shared_ptr<nn::Sequential> make_model(const Flags& f) {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Flatten>());
  int64_t d = 784;
  for (int i = 0; i < f.hidden_layers; ++i) {
    net->push_back(std::make_shared<nn::Linear>(d, f.hidden));
    net->push_back(std::make_shared<nn::ReLU>());
    d = f.hidden;
  }
  net->push_back(std::make_shared<nn::Linear>(d, 10));
  return net;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Train an MLP on MNIST with pipeline + data parallelism (DAPPLE); run under chorusrun"};
  examples::add_pipeline_options(app, f.pipeline);
  app.add_option("--batch-size", f.batch_size, "global batch size")->check(CLI::PositiveNumber);
  app.add_option("--hidden", f.hidden, "width of the hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--hidden-layers", f.hidden_layers, "number of hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--epochs", f.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", f.max_steps, "stop after this many steps (0: all epochs)");
  app.add_option("--lr", f.lr, "SGD learning rate (momentum 0.9)")->check(CLI::PositiveNumber);
  app.add_option("--seed", f.seed, "seed of initialization and shuffling");
  app.add_option("--data-dir", f.data_dir, "folder holding mnist/ (default: $CHORUS_DATA_DIR or ~/.cache/chorus/data)");
  app.add_option("--log-every", f.log_every_s, "seconds between progress lines");
  app.add_option("--tensorboard", f.tensorboard,
                 "write TensorBoard event files here (loss, test accuracy; per rank in DIR/rank<r>: step time, "
                 "micro-batches in flight, activation memory); tools/plot.py DIR draws them");
  app.add_option("--test-limit", f.test_limit, "evaluate on the first N test images (0: all)");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t_start = Clock::now();
    examples::Job job = examples::Job::join();
    examples::pipeline_group(job);  // alone: a one-stage pipeline over a group of one (the same code path)
    manual_seed(f.seed);
    auto model = make_model(f);
    pp::PipelinePlan plan =
        examples::make_pipeline_plan("pipeline", f.pipeline, static_cast<int>(model->size()), job.world, f.batch_size);
    if (!f.pipeline.plan.empty()) f.batch_size = plan.global_batch;

    const std::string root = (f.data_dir.empty() ? data::default_data_dir() : f.data_dir) + "/mnist";
    auto train = std::make_shared<data::MNIST>(root, data::Split::Train);
    auto test = std::make_shared<data::MNIST>(root, data::Split::Test);
    // Every rank reads the same global batches in the same order (a sampler for one replica).
    auto sampler = std::make_shared<data::DistributedSampler>(train->size(), 1, 0, true, f.seed);
    data::DataLoader loader(train, {.batch_size = f.batch_size, .drop_last = true, .sampler = sampler});

    pp::PipelineOptions options;
    options.recompute = f.pipeline.recompute;
    pp::PipelineStage stage(model, plan, job.group, options);
    optim::SGD opt(stage.parameters(), {.lr = f.lr, .momentum = 0.9});
    job.log(fmt::format("pipeline: {}, world size {}", examples::describe(plan), job.world));
    job.log(pp::to_string(stage.schedule()));
    examples::TensorBoardLog tensorboard(f.tensorboard, job);

    int64_t step = 0;
    double first_loss = -1, last_loss = 0, step_ms_sum = 0;
    int max_in_flight = 0;
    size_t peak_bytes = 0;
    auto t_log = Clock::now();
    const auto t_train = Clock::now();
    bool done = false;
    for (int epoch = 0; epoch < f.epochs && !done; ++epoch) {
      loader.set_epoch(epoch);
      for (data::Batch& b : loader) {
        pp::StepStats st = stage.train_step(b.data, b.target, [](const Tensor& out, const Tensor& y) {
          return F::cross_entropy(out, y);
        }, opt);
        ++step;
        if (first_loss < 0) first_loss = st.loss;
        last_loss = st.loss;
        step_ms_sum += st.step_ms;
        max_in_flight = std::max(max_in_flight, st.max_in_flight);
        peak_bytes = std::max(peak_bytes, st.peak_activation_bytes);
        tensorboard.scalar("train/loss", st.loss, step);  // the global batch's mean (reported on every rank)
        tensorboard.rank_scalar("pipeline/step_ms", st.step_ms, step);
        tensorboard.rank_scalar("pipeline/max_in_flight", st.max_in_flight, step);
        tensorboard.rank_scalar("pipeline/peak_activation_mib", st.peak_activation_bytes / 1048576.0, step);
        if (std::chrono::duration<double>(Clock::now() - t_log).count() >= f.log_every_s) {
          t_log = Clock::now();
          job.log(fmt::format("epoch {} step {} loss {:.4f} {:.1f} ms/step", epoch + 1, step, st.loss,
                              step_ms_sum / step));
        }
        if (f.max_steps > 0 && step >= f.max_steps) {
          done = true;
          break;
        }
      }
    }
    const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
    // Rank 0 assembles the whole model and evaluates it alone.
    nn::NamedTensors whole = stage.gather_state_dict(0);
    double accuracy = 0;
    if (job.rank == 0) {
      model->load_state_dict(whole);
      examples::Job solo;
      auto [correct, count] = examples::classification_accuracy(*model, *test, f.test_limit, solo);
      accuracy = static_cast<double>(correct) / std::max<int64_t>(count, 1);
      tensorboard.scalar("test/accuracy", accuracy, step);
    }
    nlohmann::json summary = {
        {"schedule", plan.schedule},
        {"recompute", f.pipeline.recompute},
        {"stages", plan.num_stages()},
        {"micro_batches", plan.micro_batches},
        {"world_size", job.world},
        {"steps", step},
        {"batch_size", f.batch_size},
        {"first_step_loss", first_loss},
        {"last_step_loss", last_loss},
        {"test_accuracy", accuracy},
        {"rank0_max_in_flight", max_in_flight},
        {"rank0_peak_activation_bytes", peak_bytes},
        {"samples_per_s", static_cast<double>(step * f.batch_size) / std::max(train_s, 1e-9)},
        {"wall_s", std::chrono::duration<double>(Clock::now() - t_start).count()},
    };
    job.log(nlohmann::json{{"summary", summary}}.dump());
    job.finish();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline: error: %s\n", e.what());
    return 1;
  }
}
