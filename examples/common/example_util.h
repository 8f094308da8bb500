// What the example programs share: joining the job chorusrun started (or running alone), rank-0
// logging, ETA strings, parameter counts, test-set accuracy summed over ranks, checkpoints of
// model + optimizer + scheduler + generator (+ loss scale), and --amp (mixed precision).
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "data/dataset.h"
#include "distributed/checkpoint_folder.h"
#include "distributed/ddp.h"
#include "distributed/init.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/grad_scaler.h"
#include "optim/optim.h"
#include "tensor/ops.h"

namespace chorus::examples {

struct Job {
  std::shared_ptr<distributed::ProcessGroup> group;  // null when running alone
  int rank = 0;
  int world = 1;

  // Data parallel when launched with a world size above 1 (chorusrun sets WORLD_SIZE, RANK, ...).
  // WORLD_SIZE and RANK are parsed strictly (distributed::env_int): "two", "-2" or "0" and a rank
  // outside the world are errors, not a silent run alone.
  // Under mpirun or srun (Open MPI's or SLURM's variables, distributed::launch_env) too.
  // `device`: the training device; for cuda the group's CUDA backend is NCCL when this binary links
  // it (//distributed:nccl), else Gloo staging through host memory; sim tensors go through Gloo on
  // the communication stream.
  static Job join(Device device = Device::cpu()) {
    Job job;
    const distributed::LaunchEnv launch = distributed::launch_env();
    if (launch.launcher.empty()) return job;
    if (launch.world_size == 1) return job;  // launch_env checked the rank is 0
    {
      distributed::InitOptions init;
      if (device.is_cuda() && distributed::has_device_backend("nccl")) init.backend = "cpu:gloo,cuda:nccl";
      job.group = distributed::init_process_group(init);
      job.rank = job.group->rank();
      job.world = job.group->size();
    }
    return job;
  }

  // Prints a line on rank 0 only, flushed at once (progress under chorusrun arrives line by line).
  void log(const std::string& line) const {
    if (rank != 0) return;
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }

  // Rank 0 hosts the store: every rank waits for the others before the group goes away.
  void finish() {
    if (!group) return;
    group->barrier()->wait();
    distributed::destroy_process_group();
    group.reset();
  }
};

inline std::string eta_str(double seconds) {
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02d}s", s / 60, s % 60) : fmt::format("{}s", s);
}

inline int64_t count_parameters(nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

// --device cpu|cuda|cuda:N|sim|sim:N|auto, as the examples share it.
inline CLI::Option* add_device_option(CLI::App& app, std::string& device) {
  return app.add_option("--device", device,
                        "where to train: cpu, cuda (cuda:N), sim (the simulated CUDA-like device) or auto (cuda when a "
                        "GPU is present, else cpu)");
}

// The device --device names. auto: cuda when a GPU is present, else the CPU. A bare "cuda" is this
// process's GPU under chorusrun (LOCAL_RANK modulo the GPUs), which becomes the current device.
// chorus::Error for cuda without a GPU, naming what is available instead.
inline Device training_device(const std::string& flag) {
  const int gpus = device_count(DeviceType::CUDA);
  const int local_rank = std::max(0, distributed::launch_env().local_rank);
  Device d;
  if (flag == "auto") {
    d = gpus > 0 ? Device::cuda(local_rank % gpus) : Device::cpu();
  } else {
    d = Device::parse(flag);
    if (d.is_cuda() && gpus == 0) {
      fail("--device {}: this machine has no CUDA device; expected cpu or sim here (sim runs the device code paths "
           "on the CPU)",
           flag);
    }
    if (d.is_cuda() && flag == "cuda") d = Device::cuda(local_rank % gpus);
    if (d.is_cuda() && d.index >= gpus) fail("--device {}: this machine has {} CUDA devices (0 to {})", flag, gpus, gpus - 1);
  }
  if (!d.is_cpu()) set_device(d);
  return d;
}

// Rank 0 writes the Chrome trace of DDP's latest iteration to `path` and says so; nothing without
// DDP or without a path.
inline void write_trace(const distributed::DistributedDataParallel* ddp, const std::string& path, const Job& job) {
  if (!ddp || path.empty() || job.rank != 0) return;
  ddp->write_chrome_trace(path);
  job.log(fmt::format("wrote the Chrome trace of one iteration to {}", path));
}

// Correct predictions and count over this rank's strided share (every world-th example) of the
// first `limit` examples of `test` (0: all), summed over ranks; the model is in eval mode meanwhile.
// `device`: where the model is (batches are moved there).
inline std::pair<int64_t, int64_t> classification_accuracy(nn::Module& model, const data::Dataset& test, int64_t limit,
                                                            const Job& job, Device device = Device::cpu()) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, count = 0;
  std::vector<int64_t> indices;
  const int64_t n = limit > 0 ? std::min(limit, test.size()) : test.size();
  for (int64_t i = job.rank; i < n; i += job.world) indices.push_back(i);
  for (size_t start = 0; start < indices.size(); start += 250) {
    std::vector<int64_t> chunk(indices.begin() + start, indices.begin() + std::min(indices.size(), start + 250));
    data::Batch b = test.get_batch(chunk);
    correct += model.forward(b.data.to(device)).argmax(1).to(kCPU).eq(b.target).sum().item<int64_t>();
    count += b.size();
  }
  model.train();
  if (job.group) {
    Tensor t = tensor<int64_t>({correct, count});
    job.group->allreduce({t})->wait();
    correct = t[0].item<int64_t>();
    count = t[1].item<int64_t>();
  }
  return {correct, count};
}

// --resume [auto], as the examples share it: the bare flag resumes from --checkpoint-dir's
// checkpoint (which must exist); `--resume auto` resumes when one exists and starts afresh
// otherwise, which is what a job restarted by chorusrun --max-restarts wants. `resume` holds "no",
// "always" or "auto".
inline CLI::Option* add_resume_option(CLI::App& app, std::string& resume) {
  return app
      .add_option("--resume", resume,
                  "continue from the checkpoint in --checkpoint-dir (bare: it must exist; `--resume auto`: when one "
                  "exists, as after chorusrun --max-restarts)")
      ->expected(0, 1)
      ->default_str("always")
      ->check(CLI::IsMember({"always", "auto"}));
}

// Whether this run resumes from `checkpoint_path` under --resume's value.
inline bool should_resume(const std::string& resume, const std::string& checkpoint_path) {
  if (resume == "always") return true;  // a missing file is load_checkpoint's clear error
  return resume == "auto" && !checkpoint_path.empty() && std::filesystem::exists(checkpoint_path);
}

// should_resume, decided by every rank of `group` together (null: running alone). Each rank looks
// for the checkpoint on its own file system; when some find it and others do not (a
// --checkpoint-dir that is not one folder shared by every node, or a file system that has not yet
// seen the file), every rank fails naming the ranks that found none, rather than replicas training
// from different states or hanging in a checkpoint's collectives.
inline bool agree_to_resume(const std::string& program, const std::string& resume, const std::string& checkpoint_path,
                            distributed::ProcessGroup* group) {
  const bool mine = should_resume(resume, checkpoint_path);
  if (group == nullptr || group->size() == 1) return mine;
  const int world = group->size();
  Tensor found = zeros({world}, {.dtype = kFloat64});
  if (mine) found.data_ptr<double>()[group->rank()] = 1;
  group->allreduce({found})->wait();
  std::vector<int> without;
  for (int r = 0; r < world; ++r)
    if (found.data_ptr<double>()[r] == 0) without.push_back(r);
  if (without.empty()) return true;
  if (static_cast<int>(without.size()) == world) return false;
  fail("{}: --resume auto: rank(s) {} of {} find no checkpoint at {} while the others do; every rank must see the "
       "same --checkpoint-dir (one folder shared by every node)",
       program, fmt::join(without, ", "), world, checkpoint_path);
}

// Runs `fn` on every rank of `group` (null: alone); an error on one rank is raised on every rank
// (naming the cause on the rank that had it), so a load that fails on one rank does not leave the
// others training into a collective it never joins.
inline void on_every_rank(distributed::ProcessGroup* group, const std::string& program, const std::string& what,
                          const std::function<void()>& fn) {
  if (group == nullptr || group->size() == 1) {
    fn();
    return;
  }
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
  }
  distributed::agree_on_failure(*group, error, program, what);
}

// --amp none|bf16|fp16, as the examples share it: the forward pass and loss under autocast in
// bfloat16 or float16 (float32 master weights and gradients), and with fp16 a GradScaler around the
// backward and the optimizer step (a step whose gradients overflowed is skipped).
//
//   examples::MixedPrecision amp(f.amp, DeviceType::CPU);
//   Tensor loss;
//   { auto scope = amp.autocast(); loss = loss_fn(model->forward(x), y); }
//   amp.backward(loss);
//   amp.unscale(opt);  clip...;  amp.step(opt);
class MixedPrecision {
 public:
  MixedPrecision(const std::string& mode, DeviceType device) : mode_(mode), device_(device) {
    if (mode != "none" && mode != "bf16" && mode != "fp16") {
      fail("--amp {}: expected none, bf16 or fp16", mode);
    }
    if (mode == "fp16") scaler_.emplace();
  }
  const std::string& mode() const { return mode_; }
  bool enabled() const { return mode_ != "none"; }
  // The autocast scope for a forward pass and its loss (nothing for none).
  std::optional<autocast::AutocastGuard> autocast() const {
    if (!enabled()) return std::nullopt;
    return std::optional<autocast::AutocastGuard>(std::in_place, device_, mode_ == "fp16" ? kFloat16 : kBFloat16);
  }
  // loss.backward(), the loss scaled first with fp16.
  void backward(const Tensor& loss) const { (scaler_ ? scaler_->scale(loss) : loss).backward(); }
  // The true gradients in .grad (before clipping); a no-op without a scaler.
  void unscale(optim::Optimizer& opt) {
    if (scaler_) scaler_->unscale_(opt);
  }
  // The optimizer step (skipped when an fp16 gradient overflowed) and the scale's update; returns
  // whether the optimizer stepped.
  bool step(optim::Optimizer& opt) {
    if (!scaler_) {
      opt.step();
      return true;
    }
    const bool stepped = scaler_->step(opt);
    scaler_->update();
    skipped_ += stepped ? 0 : 1;
    return stepped;
  }
  optim::GradScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const optim::GradScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  int64_t skipped_steps() const { return skipped_; }

 private:
  std::string mode_;
  DeviceType device_;
  std::optional<optim::GradScaler> scaler_;
  int64_t skipped_ = 0;
};

inline CLI::Option* add_amp_option(CLI::App& app, std::string& amp) {
  return app
      .add_option("--amp", amp,
                  "mixed precision: bf16 or fp16 autocast of the forward pass (float32 master weights; fp16 with "
                  "dynamic loss scaling), or none")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
}

// Training state, written atomically by rank 0 (every rank holds the same after a synced step).
// `scaler`: the loss scale of --amp fp16, restored by load_checkpoint.
inline void save_checkpoint(const std::string& path, nn::Module& model, const optim::Optimizer& opt,
                            const optim::LRScheduler& sched, int64_t epochs_done, int64_t step, nn::Metadata extra,
                            const optim::GradScaler* scaler = nullptr) {
  nn::Checkpoint c;
  c.model = model.state_dict();
  c.optimizer = opt.state_dict();
  c.scheduler = sched.state_dict();
  if (scaler) c.grad_scaler = scaler->state_dict();
  c.epoch = epochs_done;
  c.step = step;
  c.capture_rng();
  c.extra = std::move(extra);
  c.save(path);
}

// Restores what save_checkpoint wrote (generator included) and returns it for its step and extras.
// Each key of `expect` must have the same value in the checkpoint's extras (e.g. the model's
// name), checked before any state is loaded, so resuming with other flags fails with a clear
// message instead of a shape mismatch.
// With `scaler`, its state comes from the checkpoint when the checkpoint has one (a run that
// switches to --amp fp16 on resume starts from the default scale).
inline nn::Checkpoint load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                                      optim::LRScheduler& sched, const nn::Metadata& expect = {},
                                      optim::GradScaler* scaler = nullptr) {
  nn::Checkpoint c = nn::Checkpoint::load(path);
  for (const auto& [key, value] : expect) {
    auto it = c.extra.find(key);
    if (it == c.extra.end()) fail("the checkpoint {} does not say which {} it was written with", path, key);
    if (it->second != value) {
      fail("the checkpoint {} was written with {} {}, not the {} asked for now", path, key, it->second, value);
    }
  }
  model.load_state_dict(c.model);
  opt.load_state_dict(c.optimizer);
  sched.load_state_dict(c.scheduler);
  if (scaler && !c.grad_scaler.empty()) scaler->load_state_dict(c.grad_scaler);
  c.restore_rng();
  return c;
}

}  // namespace chorus::examples
