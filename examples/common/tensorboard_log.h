// --tensorboard DIR for the example programs: what a training run writes for TensorBoard (or
// tools/plot.py) through chorus::utils::SummaryWriter, laid out for a job of several processes.
//
//   DIR/            rank 0: the job's values, one per step or evaluation (loss, learning rate,
//                   throughput, gradient norm, test accuracy, ...)
//   DIR/rank<r>/    every rank r, only in a job of several processes: what differs between ranks
//                   (its step time, DDP's forward / backward / communication / overlap per
//                   iteration); alone, these go to DIR itself.
//
// Without --tensorboard every call does nothing. docs/tensorboard.md shows a run's curves.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "distributed/ddp.h"
#include "examples/common/example_util.h"
#include "utils/summary_writer.h"

namespace chorus::examples {

class TensorBoardLog {
 public:
  TensorBoardLog() = default;
  // `dir` empty: off. Otherwise rank 0 opens DIR (created with its parents; an unwritable one is a
  // chorus::Error naming it) and, with several processes, every rank DIR/rank<r>.
  TensorBoardLog(const std::string& dir, const Job& job) {
    if (dir.empty()) return;
    if (job.rank == 0) job_writer_ = std::make_unique<utils::SummaryWriter>(dir);
    if (job.world > 1) rank_writer_ = std::make_unique<utils::SummaryWriter>(dir + "/rank" + std::to_string(job.rank));
  }

  bool enabled() const { return job_writer_ || rank_writer_; }

  // A value of the whole job (the same on every rank, or rank 0's to report): rank 0 writes it.
  void scalar(const std::string& tag, double value, int64_t step) {
    if (job_writer_) job_writer_->add_scalar(tag, value, step);
  }
  // A value of this rank.
  void rank_scalar(const std::string& tag, double value, int64_t step) {
    if (utils::SummaryWriter* w = rank_writer_ ? rank_writer_.get() : job_writer_.get()) w->add_scalar(tag, value, step);
  }
  void text(const std::string& tag, const std::string& text, int64_t step) {
    if (job_writer_) job_writer_->add_text(tag, text, step);
  }

  // DDP's timings of its latest recorded iteration (the Reducer records the first 10 and every
  // 100th: reading them on a device waits for that iteration's events, so only those steps log),
  // per rank: forward, backward, communication and the part of it hidden behind backward.
  void ddp_iteration(distributed::DistributedDataParallel* ddp, int64_t step) {
    if (!enabled() || ddp == nullptr) return;
    const auto& stats = ddp->stats();
    if (stats.empty() || stats.back().iteration == last_ddp_iteration_) return;
    const distributed::IterationStats& s = stats.back();
    last_ddp_iteration_ = s.iteration;
    rank_scalar("ddp/forward_ms", s.forward_ms, step);
    rank_scalar("ddp/backward_ms", s.backward_ms, step);
    rank_scalar("ddp/communication_ms", s.communication_ms, step);
    rank_scalar("ddp/overlapped_ms", s.overlapped_ms, step);
    if (s.communication_ms > 0) rank_scalar("ddp/overlap_fraction", s.overlapped_ms / s.communication_ms, step);
  }

  void flush() {
    if (job_writer_) job_writer_->flush();
    if (rank_writer_) rank_writer_->flush();
  }

 private:
  std::unique_ptr<utils::SummaryWriter> job_writer_;   // rank 0: DIR
  std::unique_ptr<utils::SummaryWriter> rank_writer_;  // several processes: DIR/rank<r>
  int64_t last_ddp_iteration_ = -1;
};

}  // namespace chorus::examples
