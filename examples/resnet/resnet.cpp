// Trains ResNet-18/34/50 (torchvision's architecture and names) on Fashion-MNIST, on one process or
// data-parallel under chorusrun, or measures training throughput on synthetic ImageNet-shaped
// batches:
//
//   bazel-bin/distributed/launcher/chorusrun --nproc-per-node 2 bazel-bin/examples/resnet/resnet
//   bazel-bin/examples/resnet/resnet --synthetic --arch resnet50 --batch-size 8 --steps 10
//
// Fashion-MNIST (1x28x28) uses the small-input stem (3x3 stride 1) with the stem's max pooling, SGD
// with Nesterov momentum, a linear warm-up and cosine decay, random horizontal flips (and, with
// --shift, random shifts). --batch-size is the global batch: each of N processes takes batch/N from its
// DistributedSampler shard. Rank 0 prints progress lines, writes a checkpoint every
// --checkpoint-every steps (and at each epoch's end), and ends with one JSON line
// {"summary": {...}}. --resume continues from the checkpoint, mid-epoch included, on the same
// batches the interrupted run would have seen. --device cuda or sim trains on a device; the pipeline
// flags (examples/common/pipeline_flags.h) cut the model into stages instead of DDP.
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "data/data.h"
#include "distributed/sync_batchnorm.h"
#include "examples/common/trainer.h"
#include "examples/models/resnet.h"
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
  std::string arch = "resnet18";
  bool synthetic = false;
  int64_t image_size = 224;  // --synthetic
  int64_t steps = 20;        // --synthetic: timed steps (after --warmup)
  int64_t warmup = 3;
  int epochs = 5;
  int64_t batch_size = 128;
  double lr = 0.1;
  double weight_decay = 5e-4;
  bool augment = true;
  int64_t shift = 0;
  bool sync_bn = false;
  uint64_t seed = 1;
  int64_t checkpoint_every = 0;
  int64_t max_steps = 0;
  int64_t test_limit = 0;
  int workers = 1;
  bool channels_last = false;
  examples::CommonFlags common;  // device, threads, data, amp, checkpoints, trace, logging, pipeline
};

std::shared_ptr<models::ResNet> make_model(const Flags& f, bool small_input, int64_t in_channels, int64_t classes) {
  models::ResNetOptions o{.num_classes = classes, .in_channels = in_channels, .small_input = small_input};
  if (small_input) o.stem_max_pool = true;
  if (f.arch == "resnet18") return models::resnet18(o);
  if (f.arch == "resnet34") return models::resnet34(o);
  return models::resnet50(o);
}

// In place on a batch [B, C, H, W]: each image flipped left-right with probability 1/2 and shifted by
// up to `shift` pixels in each direction (vacated pixels take the image's border value, the
// normalized background). Random bits come from Philox keyed by (seed, rank) at counter `step`, so a
// resumed run augments exactly as the uninterrupted one.
void augment(Tensor& batch, int64_t shift, uint64_t seed, int rank, int64_t step) {
  const int64_t n = batch.size(0), c = batch.size(1), h = batch.size(2), w = batch.size(3);
  Tensor src = batch.clone();
  const float* in = src.data_ptr<float>();
  float* out = batch.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const auto bits = Generator::philox(seed * 1000003ull + static_cast<uint64_t>(rank), static_cast<uint64_t>(step) * 1048576ull + i);
    const bool flip = bits[0] & 1;
    const int64_t dy = static_cast<int64_t>(bits[1] % (2 * shift + 1)) - shift;
    const int64_t dx = static_cast<int64_t>(bits[2] % (2 * shift + 1)) - shift;
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* s = in + (i * c + ch) * h * w;
      float* d = out + (i * c + ch) * h * w;
      for (int64_t y = 0; y < h; ++y) {
        const int64_t sy = std::clamp<int64_t>(y + dy, 0, h - 1);
        for (int64_t x = 0; x < w; ++x) {
          int64_t sx = std::clamp<int64_t>(x + dx, 0, w - 1);
          if (flip) sx = w - 1 - sx;
          d[y * w + x] = s[sy * w + sx];
        }
      }
    }
  }
}

// The trainer of `net` (on o.device; channels-last with --channels-last): data parallel (BatchNorm
// over all processes with --sync-bn) or pipelined. Its loss counts each training batch's correct
// predictions into *correct (data parallel; a pipeline computes the loss on its last stage only).
examples::Trainer make_trainer(const Flags& f, const examples::TrainerOptions& o, examples::Job& job,
                               std::shared_ptr<models::ResNet>& net, int64_t* correct) {
  if (f.sync_bn && job.group) {
    const int64_t converted = distributed::convert_sync_batchnorm(*net, job.group);
    job.log(fmt::format("SyncBatchNorm: {} BatchNorm layers take statistics over all {} processes", converted, job.world));
  }
  // Null once a pipeline or FullyShardedDataParallel holds the blocks.
  models::ResNet* whole = examples::keeps_whole_model(o.flags) ? net.get() : nullptr;
  examples::Task task{.forward = [whole](const TensorList& in) { return TensorList{whole->forward(in[0])}; },
                      .loss = [correct](const TensorList& out, const TensorList& y) {
                        if (autograd::GradMode::is_enabled()) {  // training, not evaluation
                          NoGradGuard no_grad;
                          *correct += out[0].argmax(1).eq(y[0]).sum().item<int64_t>();
                        }
                        return F::cross_entropy(out[0], y[0]);
                      }};
  return examples::Trainer(o, job, net, std::move(task));
}

// --synthetic: random ImageNet-shaped batches, median step time after warm-up.
nlohmann::json run_synthetic(const Flags& f, const examples::TrainerOptions& o, examples::Job& job) {
  const int64_t local_batch = examples::micro_batch_size(o, job);
  manual_seed(f.seed);
  auto net = make_model(f, false, 3, 1000);
  net->to(o.device);
  if (f.channels_last) net->to(MemoryFormat::ChannelsLast);
  const int64_t parameters = examples::count_parameters(*net);
  int64_t correct = 0;
  examples::Trainer trainer = make_trainer(f, o, job, net, &correct);
  // Goyal et al.'s linear scaling (lr 0.1 per 256 images): the same random batch every step at
  // lr 0.1 and batch 8 diverges, and a throughput run should still train sanely.
  const optim::SGDOptions sgd{.lr = f.lr * static_cast<double>(f.batch_size) / 256.0, .momentum = 0.9,
                              .weight_decay = f.weight_decay};
  auto opt = trainer.make_optimizer(optim::single_group(trainer.parameters()), [sgd](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::SGD>(std::move(g), sgd);
  });
  trainer.start(*opt, nullptr);
  Tensor x = randn({local_batch, 3, f.image_size, f.image_size}).to(o.device);
  if (f.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  Tensor y = randint(0, 1000, {local_batch}).to(o.device);
  job.log(fmt::format("synthetic {} at {}x{}: {} parameters, world size {}, batch {} ({} per process), {} threads per process",
                      f.arch, f.image_size, f.image_size, parameters, job.world, f.batch_size, local_batch,
                      get_num_threads()));
  std::vector<double> times;
  double loss_value = 0;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i) {
    const auto t0 = Clock::now();
    loss_value = trainer.step({{{x}, {y}}});
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= f.warmup) times.push_back(dt);
    job.log(fmt::format("step {}/{}{} {:.3f} s loss {:.4f}", i + 1, f.warmup + f.steps, i < f.warmup ? " (warm-up)" : "",
                        dt, loss_value));
  }
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0 : times[times.size() / 2];
  nlohmann::json summary = trainer.summary();
  summary.update({{"mode", "synthetic"},
                  {"arch", f.arch},
                  {"image_size", f.image_size},
                  {"median_step_s", median},
                  {"images_per_s", median > 0 ? f.batch_size / median : 0.0},
                  {"loss", loss_value}});
  return summary;
}

// Fashion-MNIST, data-parallel or through a pipeline (--pipeline-stages, --replicas, ...):
// pipelined, ResNet::pipeline_blocks() are cut into stages, every rank reads the whole global batch
// (augmented alike on every rank) and test accuracy is measured through the stages (eval_step).
// BatchNorm there normalizes over each micro-batch's rows on its replica, and its running
// statistics are updated once per micro-batch (docs/pipeline.md): a pipelined ResNet trains close
// to, not exactly as, one process.
nlohmann::json run_fashion_mnist(const Flags& f, const examples::TrainerOptions& o, examples::Job& job) {
  const bool pipelined = o.flags.pipeline.enabled();
  const std::string root = o.flags.data_root() + "/fashion-mnist";
  auto train = std::make_shared<data::FashionMNIST>(root, data::Split::Train);
  auto test = std::make_shared<data::FashionMNIST>(root, data::Split::Test);
  data::DataLoader loader(train, {.batch_size = examples::micro_batch_size(o, job),
                                  .drop_last = true,
                                  .num_workers = f.workers,
                                  .sampler = examples::training_sampler(o, job, train->size(), f.seed)});

  manual_seed(f.seed);
  auto net = make_model(f, true, 1, 10);
  net->to(o.device);
  if (f.channels_last) net->to(MemoryFormat::ChannelsLast);
  const int64_t parameters = examples::count_parameters(*net);
  int64_t correct = 0;
  examples::Trainer trainer = make_trainer(f, o, job, net, &correct);
  const optim::SGDOptions sgd{.lr = f.lr, .momentum = 0.9, .weight_decay = f.weight_decay, .nesterov = true};
  auto opt = trainer.make_optimizer(optim::single_group(trainer.parameters()), [sgd](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::SGD>(std::move(g), sgd);
  });
  const int64_t steps_per_epoch = loader.size();
  const int64_t total_steps = steps_per_epoch * f.epochs;
  optim::WarmupDecayLR sched(*opt, std::min<int64_t>(200, total_steps / 10), total_steps, optim::WarmupDecayLR::Decay::Cosine);
  int64_t step = trainer.start(*opt, &sched);
  auto save = [&](int64_t epochs_done) { trainer.save(epochs_done, step, {{"dataset", "fashion-mnist"}}); };
  auto lists = [&](const data::Batch& b) {
    return examples::Lists{{f.channels_last ? b.data.to(o.device).contiguous(MemoryFormat::ChannelsLast) : b.data},
                           {b.target}};
  };
  // Test accuracy (correct, count), data-parallel or through the stages.
  auto accuracy = [&] {
    const std::vector<double> sums =
        trainer.evaluate(*test, f.test_limit, 250, 2, lists, [](const TensorList& out, const TensorList& y) {
          return std::vector<double>{static_cast<double>(out[0].argmax(1).eq(y[0]).sum().item<int64_t>()),
                                     static_cast<double>(y[0].numel())};
        });
    return std::pair<int64_t, int64_t>(static_cast<int64_t>(sums[0]), static_cast<int64_t>(sums[1]));
  };
  job.log(fmt::format("training {} on Fashion-MNIST ({} train / {} test), {} parameters, {}, batch {}{}, {} steps, {} threads "
                      "per process",
                      f.arch, train->size(), test->size(), parameters,
                      pipelined ? "pipeline: " + examples::describe(trainer.plan()) + fmt::format(", world size {}", job.world)
                                : fmt::format("world size {}", job.world),
                      f.batch_size, pipelined ? "" : fmt::format(" ({} per process)", f.batch_size / job.world),
                      total_steps, get_num_threads()));

  double epoch_loss_sum = 0, last_loss = 0;
  int64_t epoch_loss_n = 0, samples = 0;
  const auto t_train = Clock::now();
  auto t_log = t_train;
  std::vector<double> test_accuracy;
  const int64_t stop_step = f.max_steps > 0 ? std::min(total_steps, f.max_steps) : total_steps;
  for (int epoch = static_cast<int>(step / steps_per_epoch); epoch < f.epochs && step < stop_step; ++epoch) {
    loader.set_epoch(epoch);
    loader.skip_batches(step - epoch * steps_per_epoch);
    epoch_loss_sum = 0;
    epoch_loss_n = 0;
    correct = 0;
    int64_t seen = 0;
    for (data::Batch& b : loader) {
      // Pipelined, every rank augments the global batch alike.
      if (f.augment) augment(b.data, f.shift, f.seed, pipelined ? 0 : job.rank, step);
      last_loss = trainer.step({lists(b)});
      sched.step();
      ++step;
      epoch_loss_sum += last_loss;
      ++epoch_loss_n;
      seen += b.size();
      samples += b.size() * (pipelined ? 1 : job.world);
      const int64_t in_epoch = step - epoch * steps_per_epoch;
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - t_log).count() >= o.flags.log_every_s || in_epoch == steps_per_epoch) {
        t_log = now;
        const double rate = samples / std::max(std::chrono::duration<double>(now - t_train).count(), 1e-9);
        job.log(fmt::format("epoch {}/{} step {}/{} loss {:.4f}{} lr {:.4f} {:.1f} img/s ETA {}", epoch + 1, f.epochs,
                            in_epoch, steps_per_epoch, epoch_loss_sum / epoch_loss_n,
                            pipelined ? "" : fmt::format(" acc {:.2f}%", 100.0 * correct / seen),
                            opt->param_groups()[0].lr(), rate,
                            examples::eta_str(static_cast<double>(total_steps - step) * f.batch_size / std::max(rate, 1e-9))));
      }
      if (f.checkpoint_every > 0 && step % f.checkpoint_every == 0 && in_epoch != steps_per_epoch) save(epoch);
      if (step == stop_step) break;
    }
    if (step - epoch * steps_per_epoch < steps_per_epoch) break;  // stopped by --max-steps
    auto [test_correct, test_count] = accuracy();
    test_accuracy.push_back(static_cast<double>(test_correct) / std::max<int64_t>(test_count, 1));
    job.log(fmt::format("epoch {} done: train loss {:.4f}, test accuracy {:.2f}% ({}/{})", epoch + 1,
                        epoch_loss_sum / std::max<int64_t>(epoch_loss_n, 1), 100.0 * test_accuracy.back(), test_correct,
                        test_count));
    trainer.tensorboard().scalar("test/accuracy", test_accuracy.back(), step);
    trainer.tensorboard().scalar("train/epoch_loss", epoch_loss_sum / std::max<int64_t>(epoch_loss_n, 1), step);
    save(epoch + 1);
  }
  const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
  if (test_accuracy.empty()) {  // stopped by --max-steps, or resumed after the last step
    auto [test_correct, test_count] = accuracy();
    test_accuracy.push_back(static_cast<double>(test_correct) / std::max<int64_t>(test_count, 1));
  }
  nlohmann::json summary = trainer.summary();
  summary.update({{"mode", "fashion-mnist"},
                  {"arch", f.arch},
                  {"test_accuracy", test_accuracy.back()},
                  {"test_accuracy_per_epoch", test_accuracy},
                  {"train_loss", epoch_loss_n ? epoch_loss_sum / epoch_loss_n : 0.0},
                  {"last_batch_loss", last_loss},
                  {"epochs", f.epochs},
                  {"steps", step},
                  {"images_per_s", samples / std::max(train_s, 1e-9)},
                  {"train_s", train_s}});
  return summary;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Train ResNet on Fashion-MNIST, or time it on synthetic ImageNet batches (run under chorusrun for DDP)"};
  app.add_option("--arch", f.arch, "resnet18, resnet34 or resnet50 (default: resnet18; resnet50 with --synthetic)")
      ->check(CLI::IsMember({"resnet18", "resnet34", "resnet50"}));
  app.add_flag("--synthetic", f.synthetic, "time training steps on random 3xSxS batches with 1000 classes");
  app.add_option("--image-size", f.image_size, "--synthetic: image side S")->check(CLI::Range(32, 1024));
  app.add_option("--steps", f.steps, "--synthetic: timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", f.warmup, "--synthetic: untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", f.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", f.batch_size, "global batch size (split across processes)")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "peak learning rate (SGD, Nesterov momentum 0.9)")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", f.weight_decay, "L2 weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--augment", f.augment, "random horizontal flips, and shifts of up to --shift pixels (true/false)");
  app.add_option("--shift", f.shift, "largest random shift in pixels with --augment (0: flips only)")->check(CLI::Range(0, 8));
  app.add_flag("--channels-last", f.channels_last,
               "NHWC memory for the model's convolution weights and the images (PyTorch's channels_last)");
  app.add_flag("--sync-bn", f.sync_bn, "BatchNorm statistics over all processes (SyncBatchNorm)");
  app.add_option("--seed", f.seed, "seed of initialization, shuffling and augmentation");
  app.add_option("--checkpoint-every", f.checkpoint_every, "also checkpoint every N steps (0: at epoch ends only)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", f.max_steps, "stop after this many steps, as if interrupted (the schedule still spans "
                 "--epochs; 0: no limit)")->check(CLI::NonNegativeNumber);
  app.add_option("--test-limit", f.test_limit, "evaluate on the first N test images only (0: all 10,000)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--workers", f.workers, "DataLoader worker threads")->check(CLI::Range(0, 256));
  examples::add_common_options(app, f.common, "fashion-mnist/");
  chorus::cli::refuse_non_finite(app);
  CLI11_PARSE(app, argc, argv);
  if (f.synthetic && app.count("--arch") == 0) f.arch = "resnet50";

  try {
    const auto t_start = Clock::now();
    if (f.synthetic && (f.common.resume != "no" || !f.common.checkpoint_dir.empty())) {
      fail("resnet: --synthetic does not checkpoint");
    }
    const examples::PipelineFlags& pipeline = f.common.pipeline;
    if (pipeline.enabled()) {
      if (f.synthetic) fail("resnet: --synthetic times data-parallel steps; it takes no pipeline flags");
      if (f.sync_bn) fail("resnet: --sync-bn with a pipeline: BatchNorm there normalizes each micro-batch (docs/pipeline.md)");
      if (pipeline.recompute) {
        fail("resnet: --recompute would run each BatchNorm twice in training mode, updating its running statistics "
             "twice per micro-batch; not supported");
      }
    }
    examples::TrainerOptions o;
    o.program = "resnet";
    o.global_batch = f.batch_size;
    o.identity = {{"arch", f.arch}};
    o.flags = f.common;
    examples::Job job = examples::join_job(o);
    nlohmann::json summary = f.synthetic ? run_synthetic(f, o, job) : run_fashion_mnist(f, o, job);
    summary["batch_size"] = f.batch_size;
    summary["wall_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
    job.log(nlohmann::json{{"summary", summary}}.dump());
    job.finish();
    return 0;
  } catch (const examples::TrainingDiverged&) {
    return examples::kDivergedExitCode;  // rank 0 said why; the last good checkpoint is untouched
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet: error: %s\n", e.what());
    return 1;
  }
}
