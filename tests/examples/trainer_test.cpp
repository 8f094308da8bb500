// examples::Trainer (examples/common/trainer.h), the step every training example shares, against
// the same arithmetic written out by hand in float64: --accumulate micro-batches give the step of
// the whole batch, clipping is the whole model's, a one-stage pipeline trains and evaluates as the
// whole model does, a checkpoint resumes to the same next step, and misuse is a clear error.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "distributed/gloo.h"
#include "distributed/pipeline/blocks.h"
#include "distributed/store.h"
#include "examples/common/trainer.h"
#include "nn/functional/loss.h"
#include "tensor/ops.h"

using namespace chorus;
namespace F = chorus::nn::functional;
namespace pp = chorus::distributed::pipeline;

namespace {

// An MLP whose blocks are its children, as the examples' models give theirs.
struct Mlp : nn::Sequential {
  pp::BlockModel pipeline_blocks() {
    return pp::blocks_of(std::static_pointer_cast<nn::Sequential>(shared_from_this()));
  }
};

std::shared_ptr<Mlp> make_mlp() {
  manual_seed(7);
  auto m = std::make_shared<Mlp>();
  m->push_back(std::make_shared<nn::Linear>(5, 8));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(8, 3));
  m->to(kFloat64);
  return m;
}

Tensor mse(const TensorList& out, const TensorList& y) { return F::mse_loss(out[0], y[0]); }

examples::Task task_of(Mlp* m) {
  return {.forward = [m](const TensorList& in) { return TensorList{m->forward(in[0])}; }, .loss = mse};
}

examples::TrainerOptions options(int64_t global_batch) {
  examples::TrainerOptions o;
  o.program = "trainer_test";
  o.global_batch = global_batch;
  return o;
}

// x [8, 5] and y [8, 3], float64.
std::pair<Tensor, Tensor> batch() {
  manual_seed(11);
  return {randn({8, 5}, {.dtype = kFloat64}), randn({8, 3}, {.dtype = kFloat64})};
}

// One SGD step of the whole batch by hand, optionally clipped; returns the loss.
double reference_step(Mlp& m, const Tensor& x, const Tensor& y, double lr, double max_norm) {
  for (Tensor p : m.parameters()) p.mutable_grad() = Tensor();
  Tensor loss = F::mse_loss(m.forward(x), y);
  loss.backward();
  if (max_norm > 0) optim::clip_grad_norm_(m.parameters(), max_norm);
  NoGradGuard no_grad;
  for (Tensor p : m.parameters()) p.sub_(p.grad() * lr);
  return loss.item<double>();
}

double max_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

}  // namespace

TEST_CASE("Trainer: --accumulate 4 micro-batches make the step of the whole batch", "[examples][trainer]") {
  auto [x, y] = batch();
  auto mine = make_mlp();
  auto ref = make_mlp();
  examples::Job job;
  examples::TrainerOptions o = options(8);
  o.accumulate = 4;
  Mlp* raw = mine.get();
  examples::Trainer trainer(o, job, mine, task_of(raw));
  optim::SGD opt(trainer.parameters(), {.lr = 0.5});
  optim::StepLR sched(opt, 100);
  REQUIRE(trainer.start(opt, &sched) == 0);
  for (int s = 0; s < 3; ++s) {
    std::optional<double> loss;
    for (int64_t i = 0; i < 4; ++i) {
      CHECK_FALSE(loss.has_value());
      loss = trainer.feed({{x.narrow(0, 2 * i, 2)}, {y.narrow(0, 2 * i, 2)}});
    }
    REQUIRE(loss.has_value());
    const double expected = reference_step(*ref, x, y, 0.5, 0);
    // Equal micro-batches: the mean of their means is the batch's mean.
    CHECK(std::abs(*loss - expected) <= 1e-14 * std::abs(expected));
    CHECK(max_difference(raw->parameters(), ref->parameters()) <= 1e-13);
  }
  CHECK_THROWS_WITH(trainer.step({{{x}, {y}}}), Catch::Contains("takes 4 micro-batches (--accumulate), got 1"));
}

TEST_CASE("Trainer: clipping is the whole model's norm", "[examples][trainer]") {
  auto [x, y] = batch();
  auto mine = make_mlp();
  auto ref = make_mlp();
  examples::Job job;
  examples::TrainerOptions o = options(8);
  o.max_grad_norm = 0.01;  // far below the gradient's norm: every step is clipped
  Mlp* raw = mine.get();
  examples::Trainer trainer(o, job, mine, task_of(raw));
  optim::SGD opt(trainer.parameters(), {.lr = 0.5});
  trainer.start(opt, nullptr);
  for (int s = 0; s < 3; ++s) {
    trainer.step({{{x}, {y}}});
    reference_step(*ref, x, y, 0.5, 0.01);
    CHECK(max_difference(raw->parameters(), ref->parameters()) <= 1e-14);
  }
  // Unclipped, the first step alone moves further than the clipped run's three steps did.
  auto unclipped = make_mlp();
  reference_step(*unclipped, x, y, 0.5, 0);
  auto start = make_mlp();
  CHECK(max_difference(unclipped->parameters(), start->parameters()) >
        3 * max_difference(raw->parameters(), start->parameters()));
}

TEST_CASE("Trainer: a one-stage pipeline trains and evaluates as the whole model", "[examples][trainer][pipeline]") {
  auto [x, y] = batch();
  auto ref = make_mlp();
  auto mine = make_mlp();
  examples::Job job;
  examples::TrainerOptions o = options(8);
  o.flags.pipeline.stages = 1;
  o.flags.pipeline.micro_batches = 2;
  o.max_grad_norm = 1.0;
  REQUIRE(examples::micro_batch_size(o, job) == 8);
  examples::join_pipeline(o.program, o.flags.amp, job);  // alone: a group of one
  examples::Trainer trainer(o, job, mine, task_of(nullptr));
  CHECK(mine == nullptr);  // the stage holds the blocks
  REQUIRE(trainer.pipelined());
  CHECK(trainer.micro_batches_per_step() == 1);
  optim::SGD opt(trainer.parameters(), {.lr = 0.5});
  trainer.start(opt, nullptr);
  for (int s = 0; s < 2; ++s) {
    const double loss = trainer.step({{{x}, {y}}});
    const double expected = reference_step(*ref, x, y, 0.5, 1.0);
    CHECK(std::abs(loss - expected) <= 1e-13 * std::abs(expected));
  }
  nn::NamedTensors whole = trainer.stage()->gather_state_dict(0);
  size_t i = 0;
  for (const auto& [name, p] : ref->named_parameters()) {
    INFO(name);
    REQUIRE(i < whole.size());
    CHECK((whole[i].second - p).abs().max().item<double>() <= 1e-13);
    ++i;
  }
  // Evaluation through the stage: the sum of squared errors and the count, over whole global batches.
  data::TensorDataset data(x, y);
  auto lists = [](const data::Batch& b) { return examples::Lists{{b.data}, {b.target}}; };
  auto sse = [](const TensorList& out, const TensorList& t) {
    return std::vector<double>{(out[0] - t[0]).pow(2).sum().item<double>(), static_cast<double>(t[0].numel())};
  };
  const std::vector<double> sums = trainer.evaluate(data, 0, 3, 2, lists, sse);
  NoGradGuard no_grad;
  const double expected = (ref->forward(x) - y).pow(2).sum().item<double>();
  CHECK(std::abs(sums[0] - expected) <= 1e-12 * expected);
  CHECK(sums[1] == 24);
  job.finish();
}

TEST_CASE("Trainer: a checkpoint resumes to the same next step", "[examples][trainer][checkpoint]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("chorus_trainer_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto [x, y] = batch();
  examples::TrainerOptions o = options(8);
  o.flags.checkpoint_dir = dir.string();
  o.identity = {{"model", "mlp"}};
  examples::Job job;
  auto first = make_mlp();
  Mlp* first_raw = first.get();
  examples::Trainer a(o, job, first, task_of(first_raw));
  optim::SGD opt_a(a.parameters(), {.lr = 0.3, .momentum = 0.9});
  optim::StepLR sched_a(opt_a, 1, 0.5);
  CHECK_THROWS_WITH(a.start(opt_a, nullptr), Catch::Contains("without a scheduler, but checkpoints hold one"));
  REQUIRE(a.start(opt_a, &sched_a) == 0);
  a.step({{{x}, {y}}});
  sched_a.step();
  a.save(0, 1);
  REQUIRE(fs::exists(a.checkpoint_path()));

  // Resumed: parameters, momentum and learning rate come back; the next step is the same.
  o.flags.resume = "always";
  auto second = make_mlp();
  Mlp* second_raw = second.get();
  examples::Trainer b(o, job, second, task_of(second_raw));
  optim::SGD opt_b(b.parameters(), {.lr = 0.3, .momentum = 0.9});
  optim::StepLR sched_b(opt_b, 1, 0.5);
  REQUIRE(b.start(opt_b, &sched_b) == 1);
  CHECK(b.resumed());
  CHECK(max_difference(first_raw->parameters(), second_raw->parameters()) == 0);
  a.step({{{x}, {y}}});
  b.step({{{x}, {y}}});
  CHECK(max_difference(first_raw->parameters(), second_raw->parameters()) == 0);

  // Another model's checkpoint is refused before anything is loaded.
  o.identity = {{"model", "cnn"}};
  auto third = make_mlp();
  Mlp* third_raw = third.get();
  examples::Trainer c(o, job, third, task_of(third_raw));
  optim::SGD opt_c(c.parameters(), {.lr = 0.3});
  optim::StepLR sched_c(opt_c, 1);
  CHECK_THROWS_WITH(c.start(opt_c, &sched_c), Catch::Contains("written with model mlp, not the cnn asked for now"));
  // A key the checkpoint does not carry is refused too (as FSDP's and the pipeline's resumes do):
  // it was written by another program, or before the key existed.
  o.identity = {{"model", "mlp"}, {"seq_len", "128"}};
  auto fourth = make_mlp();
  Mlp* fourth_raw = fourth.get();
  examples::Trainer d(o, job, fourth, task_of(fourth_raw));
  optim::SGD opt_d(d.parameters(), {.lr = 0.3});
  optim::StepLR sched_d(opt_d, 1);
  CHECK_THROWS_WITH(d.start(opt_d, &sched_d), Catch::Contains("does not say which seq_len it was written with"));
  fs::remove_all(dir);
}

TEST_CASE("--resume auto is decided by every rank together: ranks that disagree all fail, naming who found none",
          "[examples][checkpoint][distributed]") {
  // Two ranks in threads over a FileStore: rank 0 sees a checkpoint, rank 1 (another node's
  // --checkpoint-dir) does not. Each alone would decide differently (one resuming, one starting
  // afresh); together both fail with the same error. When both see one, or neither, they agree.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("chorus_trainer_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  const std::string there = (dir / "a" / "checkpoint.safetensors").string();
  const std::string missing = (dir / "b" / "checkpoint.safetensors").string();
  { std::ofstream(there) << "x"; }
  auto run = [&](const std::string& store, const std::string& path0, const std::string& path1) {
    auto st = std::make_shared<distributed::FileStore>((dir / store).string());
    std::string out[2];
    auto rank = [&](int r) {
      try {
        distributed::ProcessGroupGloo group(st, r, 2);
        out[r] = examples::agree_to_resume("test", "auto", r == 0 ? path0 : path1, &group) ? "resume" : "fresh";
      } catch (const std::exception& e) {
        out[r] = e.what();
      }
    };
    std::thread t1(rank, 1);
    rank(0);
    t1.join();
    return std::pair<std::string, std::string>(out[0], out[1]);
  };
  const auto split = run("store1", there, missing);
  for (const std::string& got : {split.first, split.second}) {
    CHECK_THAT(got, Catch::Contains("test: --resume auto: rank(s) 1 of 2 find no checkpoint") &&
                        Catch::Contains("one folder shared by every node"));
  }
  const auto both = run("store2", there, there);
  CHECK(both.first == "resume");
  CHECK(both.second == "resume");
  const auto neither = run("store3", missing, missing);
  CHECK(neither.first == "fresh");
  CHECK(neither.second == "fresh");
  // Alone, each decides by its own file.
  CHECK(examples::agree_to_resume("test", "auto", there, nullptr));
  CHECK_FALSE(examples::agree_to_resume("test", "auto", missing, nullptr));
  fs::remove_all(dir);
}

TEST_CASE("Trainer: misuse and flags that do not fit the job are clear errors", "[examples][trainer]") {
  auto [x, y] = batch();
  examples::Job job;
  auto m = make_mlp();
  Mlp* raw = m.get();
  examples::Trainer trainer(options(8), job, m, task_of(raw));
  CHECK_THROWS_WITH(trainer.step({{{x}, {y}}}), Catch::Contains("Trainer::step before Trainer::start"));

  examples::TrainerOptions o = options(8);
  o.flags.resume = "always";
  CHECK_THROWS_WITH(examples::join_job(o), Catch::Contains("trainer_test: --resume needs --checkpoint-dir"));
  o = options(8);
  o.accumulate = 3;
  CHECK_THROWS_WITH(examples::join_job(o),
                    Catch::Contains("--batch-size 8 must be divisible by 1 processes x --accumulate 3"));
  o = options(8);
  o.accumulate = 2;
  o.flags.pipeline.stages = 1;
  CHECK_THROWS_WITH(examples::join_job(o), Catch::Contains("--accumulate 2 with a pipeline"));
  o.accumulate = 1;
  o.flags.amp = "fp16";
  CHECK_THROWS_WITH(examples::join_job(o), Catch::Contains("--amp fp16 is not supported with a pipeline"));
}
