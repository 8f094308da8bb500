// Trains an MLP or a small CNN on MNIST or Fashion-MNIST, on one process or data-parallel under
// chorusrun:
//
//   bazel-bin/examples/mnist/mnist --model cnn --epochs 3
//   bazel-bin/distributed/launcher/chorusrun --nproc-per-node 2 bazel-bin/examples/mnist/mnist
//
// --batch-size is the global batch: under N processes each takes batch/N of it from its
// DistributedSampler shard, so the same flags train the same way at any world size. Rank 0 prints a
// progress line every few seconds, writes checkpoints (--checkpoint-dir, --resume) and, at the end,
// one JSON line {"summary": {...}}.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/data.h"
#include "distributed/ddp.h"
#include "distributed/init.h"
#include "examples/common/example_util.h"
#include "examples/common/loss_guard.h"
#include "examples/common/tensorboard_log.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "utils/cli.h"

using namespace chorus;
namespace F = chorus::nn::functional;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::string dataset = "mnist";
  std::string model = "cnn";
  int epochs = 3;
  int64_t batch_size = 64;
  double lr = -1;  // per optimizer default below
  std::string optimizer = "adam";
  uint64_t seed = 1;
  std::string checkpoint_dir;
  std::string resume = "no";  // no, always (the bare flag), auto (when a checkpoint exists)
  int64_t checkpoint_every = 0;  // steps between mid-epoch checkpoints (0: at epoch ends only)
  int threads = 0;
  std::string data_dir;
  std::string trace;
  std::string tensorboard;  // --tensorboard DIR
  double log_every_s = 5;
  int workers = 1;
  std::string device = "auto";
  std::string amp = "none";  // none, bf16, fp16
  int64_t max_steps = 0;     // stop after this many steps (0: all epochs)
  int64_t test_limit = 0;    // evaluate on the first N test images (0: all)
  double max_loss_growth = 10;  // the divergence check before each save (loss_guard.h; 0: off)
};

std::shared_ptr<nn::Sequential> make_model(const std::string& kind) {
  auto net = std::make_shared<nn::Sequential>();
  if (kind == "mlp") {
    net->push_back(std::make_shared<nn::Flatten>());
    net->push_back(std::make_shared<nn::Linear>(784, 512));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Linear>(512, 256));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Linear>(256, 10));
  } else if (kind == "cnn") {
    // Two conv-BN-ReLU blocks with 2x2 max pooling (28 -> 14 -> 7), then a linear head.
    net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(1, 32, 3).padding(1).bias(false)));
    net->push_back(std::make_shared<nn::BatchNorm2d>(32));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::MaxPool2d>(2));
    net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)));
    net->push_back(std::make_shared<nn::BatchNorm2d>(64));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::MaxPool2d>(2));
    net->push_back(std::make_shared<nn::Flatten>());
    net->push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 10));
  } else {
    fail("mnist: --model must be mlp or cnn, got '{}'", kind);
  }
  return net;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Flags& f, const std::vector<Tensor>& params) {
  if (f.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = f.lr > 0 ? f.lr : 0.05, .momentum = 0.9,
                                                                  .weight_decay = 5e-4, .nesterov = true});
  }
  if (f.optimizer == "adam") return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = f.lr > 0 ? f.lr : 2e-3});
  if (f.optimizer == "adamw") {
    optim::AdamOptions o = optim::AdamW::default_options();
    o.lr = f.lr > 0 ? f.lr : 2e-3;
    return std::make_unique<optim::AdamW>(params, o);
  }
  fail("mnist: --optimizer must be sgd, adam or adamw, got '{}'", f.optimizer);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Train an MLP or CNN on MNIST / Fashion-MNIST with chorus (run under chorusrun for DDP)"};
  app.add_option("--dataset", f.dataset, "mnist or fashion-mnist")->check(CLI::IsMember({"mnist", "fashion-mnist"}));
  app.add_option("--model", f.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--epochs", f.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", f.batch_size, "global batch size (split across processes)")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "peak learning rate (default: 0.05 for sgd, 2e-3 for adam/adamw)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", f.optimizer, "sgd (nesterov momentum 0.9), adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--seed", f.seed, "seed of initialization and shuffling");
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "write checkpoint.safetensors here after each epoch");
  examples::add_resume_option(app, f.resume);
  examples::add_max_loss_growth_option(app, f.max_loss_growth);
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "also checkpoint every this many steps inside an epoch (resume continues at that step exactly)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", f.threads, "CPU threads per process (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data-dir", f.data_dir, "folder holding mnist/ and fashion-mnist/ (default: $CHORUS_DATA_DIR or ~/.cache/chorus/data)");
  app.add_option("--trace", f.trace, "write a Chrome trace of one DDP iteration to this file");
  app.add_option("--log-every", f.log_every_s, "seconds between progress lines");
  app.add_option("--tensorboard", f.tensorboard,
                 "write TensorBoard event files here (rank 0's batch loss and accuracy, learning rate, samples/s, "
                 "test accuracy; per rank in DIR/rank<r>: step time and DDP's timings); tools/plot.py DIR draws them");
  app.add_option("--workers", f.workers, "DataLoader worker threads")->check(CLI::Range(0, 256));
  examples::add_device_option(app, f.device);
  examples::add_amp_option(app, f.amp);
  app.add_option("--test-limit", f.test_limit, "evaluate on the first N test images only (0: all 10,000)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", f.max_steps, "stop after this many steps, as if interrupted (0: train all epochs)")
      ->check(CLI::NonNegativeNumber);
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t_start = Clock::now();
    if (f.threads > 0) set_num_threads(f.threads);
    if (f.resume != "no" && f.checkpoint_dir.empty()) fail("mnist: --resume needs --checkpoint-dir");

    const Device device = examples::training_device(f.device);
    examples::Job job = examples::Job::join(device);
    const int rank = job.rank, world = job.world;
    const auto& group = job.group;
    if (f.batch_size % world != 0) fail("mnist: --batch-size {} must be divisible by the {} processes", f.batch_size, world);
    const int64_t local_batch = f.batch_size / world;
    auto log = [&job](const std::string& line) { job.log(line); };

    const std::string root = (f.data_dir.empty() ? data::default_data_dir() : f.data_dir) + "/" + f.dataset;
    std::shared_ptr<data::Dataset> train, test;
    if (f.dataset == "mnist") {
      train = std::make_shared<data::MNIST>(root, data::Split::Train);
      test = std::make_shared<data::MNIST>(root, data::Split::Test);
    } else {
      train = std::make_shared<data::FashionMNIST>(root, data::Split::Train);
      test = std::make_shared<data::FashionMNIST>(root, data::Split::Test);
    }
    auto sampler = std::make_shared<data::DistributedSampler>(train->size(), world, rank, true, f.seed);
    data::DataLoader loader(train, {.batch_size = local_batch, .drop_last = true, .num_workers = f.workers,
                                    .sampler = sampler});

    manual_seed(f.seed);
    auto net = make_model(f.model);
    net->to(device);
    std::shared_ptr<nn::Module> model = net;
    std::shared_ptr<distributed::DistributedDataParallel> ddp;
    if (group) {
      ddp = std::make_shared<distributed::DistributedDataParallel>(net, group);
      model = ddp;
    }
    auto opt = make_optimizer(f, net->parameters());
    examples::MixedPrecision amp(f.amp, device.type);
    examples::TensorBoardLog tensorboard(f.tensorboard, job);
    const int64_t steps_per_epoch = loader.size();
    const int64_t total_steps = steps_per_epoch * f.epochs;
    optim::WarmupDecayLR sched(*opt, std::min<int64_t>(100, total_steps / 10), total_steps,
                               optim::WarmupDecayLR::Decay::Cosine);

    examples::LossGuard guard({.program = "mnist", .max_loss_growth = f.max_loss_growth, .rank = rank});
    int start_epoch = 0;
    int64_t step = 0, skip_in_epoch = 0;
    const std::string ckpt_path = f.checkpoint_dir.empty() ? "" : f.checkpoint_dir + "/checkpoint.safetensors";
    if (examples::agree_to_resume("mnist", f.resume, ckpt_path, job.group.get())) {
      nn::Checkpoint c;
      examples::on_every_rank(job.group.get(), "mnist", fmt::format("loading the checkpoint {}", ckpt_path), [&] {
        c = examples::load_checkpoint(ckpt_path, *net, *opt, sched, {{"dataset", f.dataset}, {"model", f.model}},
                                      amp.scaler());
      });
      start_epoch = static_cast<int>(c.epoch);
      step = c.step;
      guard.resumed(c.extra, step, ckpt_path);
      // A mid-epoch checkpoint (--checkpoint-every): that epoch again, its first steps skipped (the
      // sampler's order depends only on the seed and the epoch, so the same batches follow).
      if (c.extra.count("step_in_epoch")) skip_in_epoch = nn::metadata_int(c.extra, "step_in_epoch", ckpt_path);
      if (skip_in_epoch < 0 || skip_in_epoch >= steps_per_epoch)
        fail("mnist: the checkpoint {} says step {} of an epoch of {} steps", ckpt_path, skip_in_epoch, steps_per_epoch);
      log(fmt::format("resumed from {} at epoch {}, step {}{}", ckpt_path, start_epoch, step,
                      std::getenv("CHORUS_RESTART_COUNT") ? fmt::format(" (restart {})", std::getenv("CHORUS_RESTART_COUNT")) : ""));
    }
    if (!f.checkpoint_dir.empty() && rank == 0) std::filesystem::create_directories(f.checkpoint_dir);

    log(fmt::format("training {} on {} ({} train / {} test), {} parameters, world size {}, batch {} ({} per process), "
                    "{} threads per process",
                    f.model, f.dataset, train->size(), test->size(),
                    examples::count_parameters(*net),
                    world, f.batch_size, local_batch, get_num_threads()));

    double last_loss = 0, epoch_loss_sum = 0, first_loss = -1;
    int64_t epoch_loss_n = 0, samples = 0;
    const auto t_train = Clock::now();
    auto t_log = t_train;
    bool traced = false;
    for (int epoch = start_epoch; epoch < f.epochs; ++epoch) {
      loader.set_epoch(epoch);
      epoch_loss_sum = 0;
      epoch_loss_n = 0;
      int64_t correct = 0, seen = 0, in_epoch = 0;
      for (data::Batch& b : loader) {
        if (epoch == start_epoch && in_epoch < skip_in_epoch) {
          ++in_epoch;  // trained before the checkpoint this run resumed from
          continue;
        }
        const auto step_started = Clock::now();
        const double lr = opt->param_groups()[0].lr();
        opt->zero_grad();
        const Tensor data = b.data.to(device), target = b.target.to(device);
        Tensor logits, loss;
        {
          auto scope = amp.autocast();
          logits = model->forward(data);
          loss = F::cross_entropy(logits, target);
        }
        amp.backward(loss);
        const bool applied = amp.step(*opt);  // false: --amp fp16 skipped the step
        sched.step();
        ++step;
        ++in_epoch;
        last_loss = loss.item<float>();
        guard.observe(step, last_loss, applied);  // this rank's share; check() combines the ranks
        if (first_loss < 0) first_loss = last_loss;
        epoch_loss_sum += last_loss;
        ++epoch_loss_n;
        int64_t batch_correct = 0;
        {
          NoGradGuard no_grad;
          batch_correct = logits.argmax(1).eq(target).sum().item<int64_t>();
          correct += batch_correct;
        }
        seen += b.size();
        if (tensorboard.enabled()) {
          const double seconds = std::chrono::duration<double>(Clock::now() - step_started).count();
          tensorboard.scalar("train/loss", last_loss, step);  // rank 0's share of the batch
          tensorboard.scalar("train/accuracy", static_cast<double>(batch_correct) / b.size(), step);
          tensorboard.scalar("train/lr", lr, step);
          tensorboard.scalar("train/samples_per_s", static_cast<double>(f.batch_size) / seconds, step);
          tensorboard.rank_scalar("train/step_ms", seconds * 1e3, step);
          tensorboard.ddp_iteration(ddp.get(), step);
        }
        samples += b.size() * world;
        if (!traced && step >= 3) {
          examples::write_trace(ddp.get(), f.trace, job);
          traced = true;
        }
        if (f.checkpoint_every > 0 && in_epoch % f.checkpoint_every == 0 && in_epoch < steps_per_epoch &&
            !ckpt_path.empty()) {
          guard.check(step, ckpt_path, group.get());  // every rank: all stop or none does
          if (rank == 0) {
            nn::Metadata extra = guard.metadata();
            extra.insert({{"dataset", f.dataset}, {"model", f.model}, {"step_in_epoch", std::to_string(in_epoch)}});
            examples::save_checkpoint(ckpt_path, *net, *opt, sched, epoch, step, extra, amp.scaler());
            log(fmt::format("saved {} at epoch {} step {}", ckpt_path, epoch + 1, in_epoch));
          }
        }
        const auto now = Clock::now();
        if (std::chrono::duration<double>(now - t_log).count() >= f.log_every_s || in_epoch == steps_per_epoch) {
          t_log = now;
          const double elapsed = std::chrono::duration<double>(now - t_train).count();
          const double rate = samples / std::max(elapsed, 1e-9);
          const double left = static_cast<double>(total_steps - step) * f.batch_size / std::max(rate, 1e-9);
          log(fmt::format("epoch {}/{} step {}/{} loss {:.4f} acc {:.2f}% {:.0f} samples/s ETA {}", epoch + 1, f.epochs,
                          in_epoch, steps_per_epoch, epoch_loss_sum / epoch_loss_n, 100.0 * correct / seen, rate,
                          examples::eta_str(left)));
        }
        if (f.max_steps > 0 && step >= f.max_steps) break;
      }
      if (f.max_steps > 0 && step >= f.max_steps) break;  // as if interrupted: no epoch-end checkpoint
      auto [test_correct, test_count] = examples::classification_accuracy(*net, *test, f.test_limit, job, device);
      log(fmt::format("epoch {} done: train loss {:.4f}, test accuracy {:.2f}% ({}/{})", epoch + 1,
                      epoch_loss_sum / std::max<int64_t>(epoch_loss_n, 1), 100.0 * test_correct / test_count,
                      test_correct, test_count));
      tensorboard.scalar("test/accuracy", static_cast<double>(test_correct) / std::max<int64_t>(test_count, 1), step);
      if (!ckpt_path.empty()) {
        guard.check(step, ckpt_path, group.get());  // every rank: all stop or none does
        if (rank == 0) {
          nn::Metadata extra = guard.metadata();
          extra.insert({{"dataset", f.dataset}, {"model", f.model}});
          examples::save_checkpoint(ckpt_path, *net, *opt, sched, epoch + 1, step, extra, amp.scaler());
          log(fmt::format("saved {}", ckpt_path));
        }
      }
    }
    const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
    auto [test_correct, test_count] = examples::classification_accuracy(*net, *test, f.test_limit, job, device);
    nlohmann::json summary = {
        {"dataset", f.dataset},
        {"model", f.model},
        {"optimizer", f.optimizer},
        {"test_accuracy", static_cast<double>(test_correct) / std::max<int64_t>(test_count, 1)},
        {"test_images", test_count},
        {"train_loss", epoch_loss_n ? epoch_loss_sum / epoch_loss_n : 0.0},
        {"first_batch_loss", first_loss},
        {"last_batch_loss", last_loss},
        {"epochs", f.epochs},
        {"steps", step},
        {"batch_size", f.batch_size},
        {"samples_per_s", samples / std::max(train_s, 1e-9)},
        {"wall_s", std::chrono::duration<double>(Clock::now() - t_start).count()},
        {"world_size", world},
        {"threads_per_process", get_num_threads()},
        {"device", device.str()},
        {"amp", f.amp},
        {"skipped_steps", amp.skipped_steps()},
    };
    log(nlohmann::json{{"summary", summary}}.dump());
    job.finish();
    return 0;
  } catch (const examples::TrainingDiverged&) {
    return examples::kDivergedExitCode;  // rank 0 said why; the last good checkpoint is untouched
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist: error: %s\n", e.what());
    return 1;
  }
}
