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
// batches the interrupted run would have seen. chorus has no CUDA backend yet, so this runs on the
// CPU.
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "data/data.h"
#include "distributed/ddp.h"
#include "distributed/sync_batchnorm.h"
#include "examples/common/example_util.h"
#include "examples/common/pipeline_flags.h"
#include "examples/models/resnet.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/optim.h"
#include "tensor/ops.h"

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
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int64_t max_steps = 0;
  int64_t test_limit = 0;
  std::string resume = "no";  // no, always (the bare flag), auto (when a checkpoint exists)
  int threads = 0;
  std::string data_dir;
  std::string trace;
  double log_every_s = 10;
  int workers = 1;
  std::string amp = "none";  // none, bf16, fp16
  bool channels_last = false;
  std::string device = "auto";
  Device on = Device::cpu();  // --device, resolved
  examples::PipelineFlags pipeline;
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

std::shared_ptr<distributed::DistributedDataParallel> wrap(const std::shared_ptr<models::ResNet>& net,
                                                           examples::Job& job, const Flags& f) {
  if (!job.group) return nullptr;
  if (f.sync_bn) {
    const int64_t converted = distributed::convert_sync_batchnorm(*net, job.group);
    job.log(fmt::format("SyncBatchNorm: {} BatchNorm layers take statistics over all {} processes", converted, job.world));
  }
  return std::make_shared<distributed::DistributedDataParallel>(net, job.group);
}

// --synthetic: random ImageNet-shaped batches, median step time after warm-up.
nlohmann::json run_synthetic(const Flags& f, examples::Job& job, int64_t local_batch) {
  manual_seed(f.seed);
  auto net = make_model(f, false, 3, 1000);
  net->to(f.on);
  if (f.channels_last) net->to(MemoryFormat::ChannelsLast);
  auto ddp = wrap(net, job, f);
  std::shared_ptr<nn::Module> model = ddp ? std::static_pointer_cast<nn::Module>(ddp) : net;
  // Goyal et al.'s linear scaling (lr 0.1 per 256 images): the same random batch every step at
  // lr 0.1 and batch 8 diverges, and a throughput run should still train sanely.
  optim::SGD opt(net->parameters(), {.lr = f.lr * static_cast<double>(f.batch_size) / 256.0, .momentum = 0.9,
                                     .weight_decay = f.weight_decay});
  Tensor x = randn({local_batch, 3, f.image_size, f.image_size}).to(f.on);
  if (f.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  Tensor y = randint(0, 1000, {local_batch}).to(f.on);
  examples::MixedPrecision amp(f.amp, f.on.type);
  job.log(fmt::format("synthetic {} at {}x{}: {} parameters, world size {}, batch {} ({} per process), {} threads per process",
                      f.arch, f.image_size, f.image_size, examples::count_parameters(*net), job.world, f.batch_size,
                      local_batch, get_num_threads()));
  std::vector<double> times;
  double loss_value = 0;
  for (int64_t i = 0; i < f.warmup + f.steps; ++i) {
    const auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss;
    {
      auto scope = amp.autocast();
      loss = F::cross_entropy(model->forward(x), y);
    }
    amp.backward(loss);
    amp.step(opt);
    loss_value = loss.item<float>();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= f.warmup) times.push_back(dt);
    job.log(fmt::format("step {}/{}{} {:.3f} s loss {:.4f}", i + 1, f.warmup + f.steps, i < f.warmup ? " (warm-up)" : "",
                        dt, loss_value));
    if (i == f.warmup) examples::write_trace(ddp.get(), f.trace, job);
  }
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0 : times[times.size() / 2];
  return {{"mode", "synthetic"},
          {"arch", f.arch},
          {"amp", f.amp},
          {"image_size", f.image_size},
          {"median_step_s", median},
          {"images_per_s", median > 0 ? f.batch_size / median : 0.0},
          {"loss", loss_value}};
}

nlohmann::json run_fashion_mnist(const Flags& f, examples::Job& job, int64_t local_batch) {
  const std::string root = (f.data_dir.empty() ? data::default_data_dir() : f.data_dir) + "/fashion-mnist";
  auto train = std::make_shared<data::FashionMNIST>(root, data::Split::Train);
  auto test = std::make_shared<data::FashionMNIST>(root, data::Split::Test);
  auto sampler = std::make_shared<data::DistributedSampler>(train->size(), job.world, job.rank, true, f.seed);
  data::DataLoader loader(train, {.batch_size = local_batch, .drop_last = true, .num_workers = f.workers, .sampler = sampler});

  manual_seed(f.seed);
  auto net = make_model(f, true, 1, 10);
  net->to(f.on);
  if (f.channels_last) net->to(MemoryFormat::ChannelsLast);
  auto ddp = wrap(net, job, f);
  std::shared_ptr<nn::Module> model = ddp ? std::static_pointer_cast<nn::Module>(ddp) : net;
  optim::SGD opt(net->parameters(), {.lr = f.lr, .momentum = 0.9, .weight_decay = f.weight_decay, .nesterov = true});
  const int64_t steps_per_epoch = loader.size();
  const int64_t total_steps = steps_per_epoch * f.epochs;
  optim::WarmupDecayLR sched(opt, std::min<int64_t>(200, total_steps / 10), total_steps, optim::WarmupDecayLR::Decay::Cosine);
  examples::MixedPrecision amp(f.amp, f.on.type);

  int64_t step = 0;
  const std::string ckpt_path = f.checkpoint_dir.empty() ? "" : f.checkpoint_dir + "/checkpoint.safetensors";
  if (examples::should_resume(f.resume, ckpt_path)) {
    step = examples::load_checkpoint(ckpt_path, *net, opt, sched, {{"arch", f.arch}}, amp.scaler()).step;
    job.log(fmt::format("resumed from {} at step {} (epoch {}, batch {})", ckpt_path, step, step / steps_per_epoch + 1,
                        step % steps_per_epoch));
  }
  if (!f.checkpoint_dir.empty() && job.rank == 0) std::filesystem::create_directories(f.checkpoint_dir);
  auto save = [&](int64_t epochs_done) {
    if (ckpt_path.empty() || job.rank != 0) return;
    examples::save_checkpoint(ckpt_path, *net, opt, sched, epochs_done, step,
                              {{"arch", f.arch}, {"dataset", "fashion-mnist"}, {"amp", f.amp}}, amp.scaler());
    job.log(fmt::format("saved {} at step {}", ckpt_path, step));
  };

  job.log(fmt::format("training {} on Fashion-MNIST ({} train / {} test), {} parameters, world size {}, batch {} ({} per "
                      "process), {} steps, {} threads per process",
                      f.arch, train->size(), test->size(), examples::count_parameters(*net), job.world, f.batch_size,
                      local_batch, total_steps, get_num_threads()));

  double epoch_loss_sum = 0, last_loss = 0;
  int64_t epoch_loss_n = 0, samples = 0;
  const auto t_train = Clock::now();
  auto t_log = t_train;
  bool traced = false;
  std::vector<double> test_accuracy;
  const int64_t stop_step = f.max_steps > 0 ? std::min(total_steps, f.max_steps) : total_steps;
  for (int epoch = static_cast<int>(step / steps_per_epoch); epoch < f.epochs && step < stop_step; ++epoch) {
    loader.set_epoch(epoch);
    loader.skip_batches(step - epoch * steps_per_epoch);
    epoch_loss_sum = 0;
    epoch_loss_n = 0;
    int64_t correct = 0, seen = 0;
    for (data::Batch& b : loader) {
      if (f.augment) augment(b.data, f.shift, f.seed, job.rank, step);
      opt.zero_grad();
      const Tensor data = b.data.to(f.on), target = b.target.to(f.on);
      Tensor logits, loss;
      {
        auto scope = amp.autocast();
        logits = model->forward(f.channels_last ? data.contiguous(MemoryFormat::ChannelsLast) : data);
        loss = F::cross_entropy(logits, target);
      }
      amp.backward(loss);
      amp.step(opt);
      sched.step();
      ++step;
      last_loss = loss.item<float>();
      epoch_loss_sum += last_loss;
      ++epoch_loss_n;
      {
        NoGradGuard no_grad;
        correct += logits.argmax(1).eq(target).sum().item<int64_t>();
      }
      seen += b.size();
      samples += b.size() * job.world;
      if (epoch_loss_n == 3 && !traced) {  // the third step of this run (resumed or not)
        examples::write_trace(ddp.get(), f.trace, job);
        traced = true;
      }
      const int64_t in_epoch = step - epoch * steps_per_epoch;
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - t_log).count() >= f.log_every_s || in_epoch == steps_per_epoch) {
        t_log = now;
        const double rate = samples / std::max(std::chrono::duration<double>(now - t_train).count(), 1e-9);
        job.log(fmt::format("epoch {}/{} step {}/{} loss {:.4f} acc {:.2f}% lr {:.4f} {:.1f} img/s ETA {}", epoch + 1,
                            f.epochs, in_epoch, steps_per_epoch, epoch_loss_sum / epoch_loss_n, 100.0 * correct / seen,
                            opt.param_groups()[0].lr(), rate,
                            examples::eta_str(static_cast<double>(total_steps - step) * f.batch_size / std::max(rate, 1e-9))));
      }
      if (f.checkpoint_every > 0 && step % f.checkpoint_every == 0 && in_epoch != steps_per_epoch) save(epoch);
      if (step == stop_step) break;
    }
    if (step - epoch * steps_per_epoch < steps_per_epoch) break;  // stopped by --max-steps
    auto [test_correct, test_count] = examples::classification_accuracy(*net, *test, f.test_limit, job, f.on);
    test_accuracy.push_back(static_cast<double>(test_correct) / std::max<int64_t>(test_count, 1));
    job.log(fmt::format("epoch {} done: train loss {:.4f}, test accuracy {:.2f}% ({}/{})", epoch + 1,
                        epoch_loss_sum / std::max<int64_t>(epoch_loss_n, 1), 100.0 * test_accuracy.back(), test_correct,
                        test_count));
    save(epoch + 1);
  }
  const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
  if (test_accuracy.empty()) {  // resumed after the last step: evaluate what was loaded
    auto [test_correct, test_count] = examples::classification_accuracy(*net, *test, f.test_limit, job, f.on);
    test_accuracy.push_back(static_cast<double>(test_correct) / std::max<int64_t>(test_count, 1));
  }
  return {{"mode", "fashion-mnist"},
          {"arch", f.arch},
          {"amp", f.amp},
          {"skipped_steps", amp.skipped_steps()},
          {"loss_scale", amp.scaler() ? amp.scaler()->get_scale() : 1.0},
          {"test_accuracy", test_accuracy.back()},
          {"test_accuracy_per_epoch", test_accuracy},
          {"train_loss", epoch_loss_n ? epoch_loss_sum / epoch_loss_n : 0.0},
          {"last_batch_loss", last_loss},
          {"epochs", f.epochs},
          {"steps", step},
          {"images_per_s", samples / std::max(train_s, 1e-9)},
          {"train_s", train_s}};
}

// Fashion-MNIST through a pipeline (--pipeline-stages, --replicas, ...): ResNet::pipeline_blocks()
// cut into stages, every rank reading the whole global batch (augmented alike on every rank), test
// accuracy measured through the stages (eval_step). BatchNorm normalizes over each micro-batch's
// rows on its replica, and its running statistics are updated once per micro-batch
// (docs/pipeline.md): a pipelined ResNet trains close to, not exactly as, one process.
nlohmann::json run_fashion_mnist_pipelined(const Flags& f, examples::Job& job) {
  namespace pp = distributed::pipeline;
  const std::string root = (f.data_dir.empty() ? data::default_data_dir() : f.data_dir) + "/fashion-mnist";
  auto train = std::make_shared<data::FashionMNIST>(root, data::Split::Train);
  auto test = std::make_shared<data::FashionMNIST>(root, data::Split::Test);
  auto sampler = std::make_shared<data::DistributedSampler>(train->size(), 1, 0, true, f.seed);
  data::DataLoader loader(train, {.batch_size = f.batch_size, .drop_last = true, .num_workers = f.workers, .sampler = sampler});

  manual_seed(f.seed);
  auto net = make_model(f, true, 1, 10);
  net->to(f.on);
  if (f.channels_last) net->to(MemoryFormat::ChannelsLast);
  const int64_t parameters = examples::count_parameters(*net);
  pp::BlockModel blocks = net->pipeline_blocks();
  net.reset();
  examples::PipelinedModel piped =
      examples::make_pipelined_model("resnet", f.pipeline, f.amp, std::move(blocks), job, f.batch_size, 0, 0.0);
  const pp::PipelinePlan& plan = piped.plan;
  pp::PipelineStage& stage = *piped.stage;
  optim::SGD opt(stage.parameters(), {.lr = f.lr, .momentum = 0.9, .weight_decay = f.weight_decay, .nesterov = true});
  const int64_t steps_per_epoch = loader.size();
  const int64_t total_steps = steps_per_epoch * f.epochs;
  optim::WarmupDecayLR sched(opt, std::min<int64_t>(200, total_steps / 10), total_steps, optim::WarmupDecayLR::Decay::Cosine);

  int64_t step = 0;
  const std::string ckpt_path = f.checkpoint_dir.empty() ? "" : pp::pipeline_checkpoint_manifest(f.checkpoint_dir);
  if (examples::should_resume(f.resume, ckpt_path)) {
    step = stage.load_checkpoint(f.checkpoint_dir, opt, &sched, {{"arch", f.arch}}).step;
    job.log(fmt::format("resumed from {} at step {}", ckpt_path, step));
  }
  auto save = [&](int64_t epochs_done) {
    if (ckpt_path.empty()) return;
    stage.save_checkpoint(f.checkpoint_dir, opt, &sched, epochs_done, step, {{"arch", f.arch}, {"dataset", "fashion-mnist"}});
    job.log(fmt::format("saved {} at step {}", ckpt_path, step));
  };
  job.log(fmt::format("training {} on Fashion-MNIST ({} train / {} test), {} parameters, pipeline: {}, world size {}, batch "
                      "{}, {} steps, {} threads per process",
                      f.arch, train->size(), test->size(), parameters, examples::describe(plan), job.world,
                      f.batch_size, total_steps, get_num_threads()));
  // Test accuracy through the stages: the last stage counts its rows' correct predictions in the loss.
  auto accuracy = [&] {
    const int64_t n = (f.test_limit > 0 ? std::min(f.test_limit, test->size()) : test->size()) / f.batch_size * f.batch_size;
    int64_t correct = 0;
    auto counting = [&](const TensorList& out, const TensorList& y) {
      NoGradGuard no_grad;
      correct += out[0].argmax(1).eq(y[0]).sum().item<int64_t>();
      return F::cross_entropy(out[0], y[0]);
    };
    for (int64_t start = 0; start < n; start += f.batch_size) {
      std::vector<int64_t> rows(static_cast<size_t>(f.batch_size));
      std::iota(rows.begin(), rows.end(), start);
      data::Batch b = test->get_batch(rows);
      Tensor x = f.channels_last ? b.data.to(f.on).contiguous(MemoryFormat::ChannelsLast) : b.data;
      stage.eval_step({x}, {b.target}, counting);
    }
    Tensor t = tensor<double>({static_cast<double>(correct)});
    job.group->allreduce({t})->wait();
    return t.item<double>() / std::max<int64_t>(n, 1);
  };

  auto loss_fn = [](const TensorList& out, const TensorList& y) { return F::cross_entropy(out[0], y[0]); };
  double epoch_loss_sum = 0, last_loss = 0;
  int64_t epoch_loss_n = 0, samples = 0;
  std::vector<double> test_accuracy;
  const auto t_train = Clock::now();
  auto t_log = t_train;
  const int64_t stop_step = f.max_steps > 0 ? std::min(total_steps, f.max_steps) : total_steps;
  for (int epoch = static_cast<int>(step / steps_per_epoch); epoch < f.epochs && step < stop_step; ++epoch) {
    loader.set_epoch(epoch);
    loader.skip_batches(step - epoch * steps_per_epoch);
    epoch_loss_sum = 0;
    epoch_loss_n = 0;
    for (data::Batch& b : loader) {
      if (f.augment) augment(b.data, f.shift, f.seed, 0, step);  // the same augmentation on every rank
      Tensor x = f.channels_last ? b.data.to(f.on).contiguous(MemoryFormat::ChannelsLast) : b.data;
      last_loss = stage.train_step({x}, {b.target}, loss_fn, opt).loss;
      sched.step();
      ++step;
      epoch_loss_sum += last_loss;
      ++epoch_loss_n;
      samples += b.size();
      const int64_t in_epoch = step - epoch * steps_per_epoch;
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - t_log).count() >= f.log_every_s || in_epoch == steps_per_epoch) {
        t_log = now;
        const double rate = samples / std::max(std::chrono::duration<double>(now - t_train).count(), 1e-9);
        job.log(fmt::format("epoch {}/{} step {}/{} loss {:.4f} lr {:.4f} {:.1f} img/s", epoch + 1, f.epochs, in_epoch,
                            steps_per_epoch, epoch_loss_sum / epoch_loss_n, opt.param_groups()[0].lr(), rate));
      }
      if (f.checkpoint_every > 0 && step % f.checkpoint_every == 0 && in_epoch != steps_per_epoch) save(epoch);
      if (step == stop_step) break;
    }
    if (step - epoch * steps_per_epoch < steps_per_epoch) break;  // stopped by --max-steps
    test_accuracy.push_back(accuracy());
    job.log(fmt::format("epoch {} done: train loss {:.4f}, test accuracy {:.2f}%", epoch + 1,
                        epoch_loss_sum / std::max<int64_t>(epoch_loss_n, 1), 100.0 * test_accuracy.back()));
    save(epoch + 1);
  }
  const double train_s = std::chrono::duration<double>(Clock::now() - t_train).count();
  if (test_accuracy.empty()) test_accuracy.push_back(accuracy());
  return {{"mode", "fashion-mnist"},
          {"arch", f.arch},
          {"amp", f.amp},
          {"pipeline", examples::describe(plan)},
          {"recompute", f.pipeline.recompute},
          {"test_accuracy", test_accuracy.back()},
          {"test_accuracy_per_epoch", test_accuracy},
          {"train_loss", epoch_loss_n ? epoch_loss_sum / epoch_loss_n : 0.0},
          {"last_batch_loss", last_loss},
          {"epochs", f.epochs},
          {"steps", step},
          {"images_per_s", samples / std::max(train_s, 1e-9)},
          {"train_s", train_s}};
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
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "write checkpoint.safetensors here");
  app.add_option("--checkpoint-every", f.checkpoint_every, "also checkpoint every N steps (0: at epoch ends only)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", f.max_steps, "stop after this many steps, as if interrupted (the schedule still spans "
                 "--epochs; 0: no limit)")->check(CLI::NonNegativeNumber);
  app.add_option("--test-limit", f.test_limit, "evaluate on the first N test images only (0: all 10,000)")
      ->check(CLI::NonNegativeNumber);
  examples::add_resume_option(app, f.resume);
  app.add_option("--threads", f.threads, "CPU threads per process (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--data-dir", f.data_dir, "folder holding fashion-mnist/ (default: $CHORUS_DATA_DIR or ~/.cache/chorus/data)");
  app.add_option("--trace", f.trace, "write a Chrome trace of one DDP iteration to this file");
  app.add_option("--log-every", f.log_every_s, "seconds between progress lines");
  app.add_option("--workers", f.workers, "DataLoader worker threads")->check(CLI::Range(0, 256));
  examples::add_amp_option(app, f.amp);
  examples::add_device_option(app, f.device);
  examples::add_pipeline_options(app, f.pipeline);
  CLI11_PARSE(app, argc, argv);
  if (f.synthetic && app.count("--arch") == 0) f.arch = "resnet50";

  try {
    const auto t_start = Clock::now();
    if (f.threads > 0) set_num_threads(f.threads);
    if (f.resume != "no" && f.checkpoint_dir.empty()) fail("resnet: --resume needs --checkpoint-dir");
    if (f.synthetic && (f.resume != "no" || !f.checkpoint_dir.empty())) fail("resnet: --synthetic does not checkpoint");
    f.on = examples::training_device(f.device);
    examples::Job job = examples::Job::join(f.on);
    const bool pipelined = f.pipeline.enabled();
    if (pipelined) {
      if (f.synthetic) fail("resnet: --synthetic times data-parallel steps; it takes no pipeline flags");
      if (f.sync_bn) fail("resnet: --sync-bn with a pipeline: BatchNorm there normalizes each micro-batch (docs/pipeline.md)");
      if (f.pipeline.recompute) {
        fail("resnet: --recompute would run each BatchNorm twice in training mode, updating its running statistics "
             "twice per micro-batch; not supported");
      }
      examples::join_pipeline("resnet", f.amp, job);
    } else if (f.batch_size % job.world != 0) {
      fail("resnet: --batch-size {} must be divisible by the {} processes", f.batch_size, job.world);
    }
    const int64_t local_batch = f.batch_size / job.world;
    nlohmann::json summary = pipelined     ? run_fashion_mnist_pipelined(f, job)
                             : f.synthetic ? run_synthetic(f, job, local_batch)
                                           : run_fashion_mnist(f, job, local_batch);
    summary["batch_size"] = f.batch_size;
    summary["world_size"] = job.world;
    summary["threads_per_process"] = get_num_threads();
    summary["device"] = f.on.str();
    summary["wall_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
    job.log(nlohmann::json{{"summary", summary}}.dump());
    job.finish();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet: error: %s\n", e.what());
    return 1;
  }
}
