// The divergence check the examples run before every checkpoint save (issue 35): a training whose
// loss went non-finite, or whose mean loss since the last save grew past --max-loss-growth times
// the run's reference loss, must not replace the last good checkpoint with its weights.
//
// The rule, checked at each save over the steps since the previous one (the interval):
//   - any loss of a step the optimizer applied is NaN or infinite, or
//   - the interval's mean loss > max_loss_growth x max(reference, 1).
// The reference is the untrained model's loss: the first step's loss of the run that started from
// scratch (mean over the ranks), written into every checkpoint as `loss_reference` and read back
// on resume, so a resumed run whose weights are finite garbage (loss 3.6e34) is compared with the
// loss the training began at, not with its own first loss. A checkpoint without the key (written
// before this check, or by another program) makes this run's first loss the reference. The floor
// of 1 keeps a run that starts near 0 (fine-tuning on data the model knows) from tripping on
// ordinary noise. The default growth, 10, is Megatron-LM's spiky-loss factor; a cross-entropy
// that trains normally stays below its first value.
//
// When the rule fires, nothing is written: the last good checkpoint stays as it was (its bytes),
// rank 0 prints what was found (step, loss, threshold, the checkpoint kept), and every rank throws
// TrainingDiverged, which the examples' main turns into exit code 76 (kDivergedExitCode), so
// chorusrun --max-restarts starts the job again from the good checkpoint. The verdict is made
// from values every rank shares: the ranks' losses are gathered at each save (one small
// allreduce), so no rank saves or waits in a collective while the others stop.
//
// A step that --amp fp16's GradScaler skipped (its gradients overflowed) changed no weight: its
// loss, infinite or not, does not count.
//
// Test only: CHORUS_TEST_LOSS_FROM_STEP="STEP:LOSS[:RANK]" makes the check see LOSS (e.g. 1e30 or
// nan) instead of the real loss from step STEP on (on rank RANK only, if given); training itself is
// unchanged. //tests/examples:divergence_test uses it.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "nn/serialize.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::examples {

// chorus's own exit codes: 75 a silent rank (distributed/heartbeat.h), 76 a diverged training.
inline constexpr int kDivergedExitCode = 76;

// Thrown on every rank when a save was refused; rank 0 has printed why.
class TrainingDiverged : public Error {
 public:
  using Error::Error;
};

inline CLI::Option* add_max_loss_growth_option(CLI::App& app, double& growth) {
  return app
      .add_option("--max-loss-growth", growth,
                  "refuse to overwrite the last good checkpoint (exit code 76) when a loss since the last save was "
                  "NaN/inf or their mean exceeds this many times the untrained model's first loss (at least 1); 0 "
                  "turns the check off")
      ->check(CLI::NonNegativeNumber);
}

struct LossGuardOptions {
  std::string program;         // names the example in the message
  double max_loss_growth = 10;  // 0: the check is off
  int rank = 0;
};

class LossGuard {
 public:
  explicit LossGuard(LossGuardOptions o) : o_(std::move(o)) {
    if (o_.max_loss_growth > 0 && o_.max_loss_growth < 1) {
      fail("{}: --max-loss-growth {} would refuse a loss lower than the first one; expected 0 (off) or at least 1",
           o_.program, o_.max_loss_growth);
    }
    if (const char* v = std::getenv("CHORUS_TEST_LOSS_FROM_STEP")) parse_injection(v);
  }

  bool enabled() const { return o_.max_loss_growth > 0; }

  // After loading a checkpoint written at `step`: its reference loss, if it has one.
  void resumed(const nn::Metadata& extra, int64_t step, const std::string& path) {
    last_save_step_ = step;
    auto it = extra.find(kReferenceKey);
    if (it == extra.end()) return;
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0' || !std::isfinite(v)) {
      fail("the checkpoint {} has {} '{}', expected a finite number", path, kReferenceKey, it->second);
    }
    reference_ = v;
  }

  // One optimizer step's loss: this rank's share or the global mean, as the example has it.
  // `applied`: false when the GradScaler skipped the step (it then does not count).
  void observe(int64_t step, double loss, bool applied = true) {
    if (inject_step_ >= 0 && step >= inject_step_ && (inject_rank_ < 0 || inject_rank_ == o_.rank)) loss = inject_loss_;
    if (!applied) return;
    if (!first_loss_ && std::isfinite(loss)) first_loss_ = loss;
    if (!std::isfinite(loss)) {
      if (nonfinite_n_++ == 0) {
        nonfinite_step_ = step;
        nonfinite_loss_ = loss;
      }
      return;
    }
    if (n_ == 0) first_step_ = step;
    sum_ += loss;
    ++n_;
    if (n_ == 1 || loss > worst_loss_) {
      worst_loss_ = loss;
      worst_step_ = step;
    }
  }

  // Before the save of `step` to `checkpoint` (every rank calls it, at the same step; `group` null
  // when alone): throws TrainingDiverged when the save must not happen, else starts a new interval.
  void check(int64_t step, const std::string& checkpoint, distributed::ProcessGroup* group) {
    if (!enabled()) return;
    Interval all = gather(group);
    if (!reference_ && all.first_loss_n > 0) reference_ = all.first_loss_sum / all.first_loss_n;
    const std::string kept = kept_message(checkpoint);
    std::string found;
    if (all.nonfinite_n > 0) {
      found = fmt::format("the loss was {} at step {} ({} {} with a non-finite loss since the save at step {})",
                          all.nonfinite_loss, all.nonfinite_step, all.nonfinite_n, all.nonfinite_n == 1 ? "step" : "steps",
                          last_save_step_);
    } else if (all.n > 0 && reference_) {
      const double threshold = o_.max_loss_growth * std::max(*reference_, 1.0);
      const double mean = all.sum / all.n;
      if (mean > threshold) {
        found = fmt::format(
            "the mean loss of steps {}-{} is {:.6g} (highest {:.6g} at step {}), above the threshold {:.6g} = "
            "--max-loss-growth {:g} x the reference loss {:.6g} (the untrained model's first loss{})",
            all.first_step, step, mean, all.worst_loss, all.worst_step, threshold, o_.max_loss_growth, *reference_,
            *reference_ < 1 ? ", counted as 1" : "");
      }
    }
    if (!found.empty()) {
      const std::string message = fmt::format(
          "training diverged before the checkpoint of step {}: {}; not saved: {}. Restart from it (chorusrun "
          "--max-restarts does, --resume auto), e.g. with a lower learning rate; --max-loss-growth 0 turns this "
          "check off",
          step, found, kept);
      if (o_.rank == 0) {
        std::fprintf(stderr, "%s: %s\n", o_.program.c_str(), message.c_str());
        std::fflush(stderr);
      }
      throw TrainingDiverged(message);
    }
    sum_ = 0;
    n_ = 0;
    nonfinite_n_ = 0;
    last_save_step_ = step;
  }

  // What a checkpoint records of the check: the reference loss, once known.
  nn::Metadata metadata() const {
    if (!reference_) return {};
    return {{kReferenceKey, fmt::format("{:.17g}", *reference_)}};
  }

 private:
  static constexpr const char* kReferenceKey = "loss_reference";

  // The interval over all ranks (sums and counts summed, first and worst steps over the ranks).
  struct Interval {
    double sum = 0, n = 0, nonfinite_n = 0;
    double nonfinite_step = 0, nonfinite_loss = 0;
    double first_step = 0, worst_loss = 0, worst_step = 0;
    double first_loss_sum = 0, first_loss_n = 0;
  };

  // Every rank's values side by side through one allreduce (each rank fills its own slot, the others
  // add zeros: exact), so that every rank reaches the same verdict from the same numbers.
  Interval gather(distributed::ProcessGroup* group) const {
    constexpr int kWidth = 10;
    const int world = group ? group->size() : 1, me = group ? group->rank() : 0;
    std::vector<double> slots(static_cast<size_t>(kWidth * world), 0.0);
    double* mine = slots.data() + kWidth * me;
    const double mine_values[kWidth] = {sum_,
                                        static_cast<double>(n_),
                                        static_cast<double>(nonfinite_n_),
                                        static_cast<double>(nonfinite_step_),
                                        nonfinite_loss_,
                                        static_cast<double>(first_step_),
                                        worst_loss_,
                                        static_cast<double>(worst_step_),
                                        first_loss_.value_or(0.0),
                                        first_loss_ ? 1.0 : 0.0};
    std::copy(mine_values, mine_values + kWidth, mine);
    if (group && world > 1) {
      Tensor t = tensor<double>(slots);
      group->allreduce({t})->wait();
      const double* p = t.data_ptr<double>();
      slots.assign(p, p + slots.size());
    }
    Interval all;
    bool any_finite = false, any_nonfinite = false;
    for (int r = 0; r < world; ++r) {
      const double* s = slots.data() + kWidth * r;
      all.sum += s[0];
      all.n += s[1];
      if (s[1] > 0) {
        if (!any_finite || s[5] < all.first_step) all.first_step = s[5];
        if (!any_finite || s[6] > all.worst_loss) {
          all.worst_loss = s[6];
          all.worst_step = s[7];
        }
        any_finite = true;
      }
      if (s[2] > 0) {
        all.nonfinite_n += s[2];
        if (!any_nonfinite || s[3] < all.nonfinite_step) {
          all.nonfinite_step = s[3];
          all.nonfinite_loss = s[4];
        }
        any_nonfinite = true;
      }
      all.first_loss_sum += s[8];
      all.first_loss_n += s[9];
    }
    return all;
  }

  std::string kept_message(const std::string& checkpoint) const {
    if (std::filesystem::exists(checkpoint)) {
      return fmt::format("the last good checkpoint {} ({}) is kept as it was", checkpoint,
                         last_save_step_ > 0 ? fmt::format("step {}", last_save_step_) : std::string("this run's start"));
    }
    return fmt::format("no checkpoint was written at {} (none saved yet)", checkpoint);
  }

  void parse_injection(const std::string& v) {
    // STEP:LOSS[:RANK]
    const size_t a = v.find(':');
    if (a == std::string::npos) fail("CHORUS_TEST_LOSS_FROM_STEP={}: expected STEP:LOSS[:RANK]", v);
    const size_t b = v.find(':', a + 1);
    try {
      inject_step_ = std::stoll(v.substr(0, a));
      inject_loss_ = std::stod(v.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1));
      if (b != std::string::npos) inject_rank_ = std::stoi(v.substr(b + 1));
    } catch (const std::exception&) {
      fail("CHORUS_TEST_LOSS_FROM_STEP={}: expected STEP:LOSS[:RANK]", v);
    }
  }

  LossGuardOptions o_;
  std::optional<double> reference_;
  std::optional<double> first_loss_;  // this rank's first counted finite loss in this run
  double sum_ = 0;                    // finite losses of the interval
  int64_t n_ = 0;
  int64_t first_step_ = 0;
  double worst_loss_ = 0;
  int64_t worst_step_ = 0;
  int64_t nonfinite_n_ = 0;
  int64_t nonfinite_step_ = 0;
  double nonfinite_loss_ = 0;
  int64_t last_save_step_ = 0;
  int64_t inject_step_ = -1;
  double inject_loss_ = 0;
  int inject_rank_ = -1;
};

}  // namespace chorus::examples
