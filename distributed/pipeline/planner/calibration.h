// Measures the links a plan's cost model needs, on the cluster itself and through the same
// ProcessGroup the pipeline runtime uses (so the figures include what the runtime pays per message:
// the backend's hand-off to its threads, its socket or NCCL path, the memory copies), and fits the
// model's per-message form to them:
//   point-to-point, one direction:   t(bytes) = latency + bytes / bandwidth
//   ring allreduce over r ranks:      t(bytes) = 2 (r - 1) latency + 2 (r - 1) / r * bytes / bandwidth
// (cost_model.h's [Latency model]). The `calibrate` tool runs these under chorusrun and writes the
// cluster JSON (cluster.h) for the `plan` tool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "distributed/process_group.h"

namespace chorus::distributed::pipeline::planner {

struct LinkSample {
  int64_t bytes = 0;
  double ms = 0;  // over the repeats: the median of an idle ping-pong, else the mean (calibration.cpp)
};

struct LinkFit {
  double latency_us = 0;
  double bytes_per_s = 0;
  std::vector<LinkSample> samples;
  // Predicted ms of a message of `bytes` (point to point) under the fit.
  double point_to_point_ms(double bytes) const { return latency_us / 1e3 + bytes / bytes_per_s * 1e3; }
};

struct CalibrationOptions {
  std::vector<int64_t> sizes_bytes = {4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20};  // point to point
  // The allreduce at the sizes DDP's buckets have (its first bucket is 1 MiB, the others up to
  // 25 MiB): the cost model charges the fitted latency once per bucket (cost_model.h), and a
  // backend's allreduce can change algorithm with the size (Gloo's below ~64 KiB is much quicker
  // per message than above), so the fit is made where the buckets are.
  std::vector<int64_t> allreduce_sizes_bytes = {1 << 20, 4 << 20, 16 << 20, 25 << 20};
  int warmup = 3;
  int repeats = 30;
  // > 0: time messages as a pipeline exchanges them while it computes, not as an idle ping-pong:
  // both ranks repeatedly compute for this long (a float32 matrix product), send to each other and
  // receive; a message's cost is each round's time beyond the computation. Where communication does
  // not run beside computation (a CPU machine whose cores all train), that includes waiting for a
  // core and the transport thread's cycles taken from the computation, which an idle ping-pong
  // hides (docs/pipeline.md, "Predictions against measurements").
  double compute_between_ms = 0;
};

// One-direction time between global ranks a and b: a ping-pong (a sends, b returns the same bytes)
// timed on a, halved, median of the repeats (or with compute_between_ms, see there: the mean).
// Every rank of `group` must call it (those other than
// a and b only wait at the barriers). The result is meaningful on rank a (others get a's figures by
// a broadcast, so every rank returns the same fit).
LinkFit measure_point_to_point(ProcessGroup& group, int a, int b, const CalibrationOptions& options = {});

// The allreduce of float32 tensors of each size over the whole group, mean of the repeats (the
// slowest rank's), fitted to the ring form with r = group.size() (so the fitted bandwidth is the
// one the cost model's allreduce term expects). Every rank calls it; every rank gets the same fit.
LinkFit measure_allreduce(ProcessGroup& group, const CalibrationOptions& options = {});

// What a DDP bucket of each size costs a training step, fitted to the same ring form: the backward
// of one parameter of that size through DDP's Reducer (gradient copied into its bucket and divided
// by the world size, the allreduce, the average copied back into .grad), minus the same backward
// without the Reducer; the slowest rank's mean difference. This is what the cost model's
// allreduce term stands for (a replicated stage's gradients are reduced by that Reducer), so the
// `calibrate` tool writes this fit, not measure_allreduce's, into the cluster JSON. Every rank calls
// it; every rank gets the same fit.
LinkFit measure_ddp_allreduce(const std::shared_ptr<ProcessGroup>& group, const CalibrationOptions& options = {});

// Least squares of ms = x0 + x1 * bytes over the samples, returned as (x0 ms, x1 ms per byte); a
// negative intercept is clamped to 0 (and the slope refitted through the origin). chorus::Error for
// fewer than two distinct sizes.
std::pair<double, double> fit_line(const std::vector<LinkSample>& samples);

}  // namespace chorus::distributed::pipeline::planner
