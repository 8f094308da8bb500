// Link calibration through the ProcessGroup (see calibration.h).
#include "distributed/pipeline/planner/calibration.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "distributed/reducer.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::distributed::pipeline::planner {

namespace {

using Clock = std::chrono::steady_clock;

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void check_options(const CalibrationOptions& o, const std::vector<int64_t>& sizes) {
  if (sizes.size() < 2 || o.repeats < 1 || o.warmup < 0)
    fail("calibration: got {} sizes, {} repeats, {} warm-up runs; expected at least 2 sizes, 1 repeat, 0 warm-up",
         sizes.size(), o.repeats, o.warmup);
  for (int64_t s : sizes)
    if (s < 4 || s % 4 != 0) fail("calibration: got a size of {} bytes, expected a positive multiple of 4", s);
}

// Every rank ends with rank `root`'s values.
std::vector<double> share(ProcessGroup& group, const std::vector<double>& values, int root) {
  Tensor t = zeros({static_cast<int64_t>(values.size())}, {.dtype = kFloat64});
  if (group.rank() == root) std::copy(values.begin(), values.end(), t.data_ptr<double>());
  group.broadcast({t}, root)->wait();
  return {t.data_ptr<double>(), t.data_ptr<double>() + values.size()};
}

LinkFit make_fit(std::vector<LinkSample> samples, double latency_ms, double ms_per_byte) {
  LinkFit fit;
  fit.samples = std::move(samples);
  fit.latency_us = latency_ms * 1e3;
  fit.bytes_per_s = 1e3 / ms_per_byte;
  return fit;
}

// Ring form: ms = 2 (r-1) lat + 2 (r-1)/r * bytes / bw, so in the fitted line x0 = 2 (r-1) lat and
// x1 = 2 (r-1)/r / bw.
LinkFit ring_fit(std::vector<LinkSample> samples, int r) {
  const auto [x0, x1] = fit_line(samples);
  const double steps = 2.0 * (r - 1);
  return make_fit(std::move(samples), x0 / steps, x1 * r / steps);
}

}  // namespace

std::pair<double, double> fit_line(const std::vector<LinkSample>& samples) {
  std::set<int64_t> sizes;
  for (const LinkSample& s : samples) sizes.insert(s.bytes);
  if (sizes.size() < 2) fail("calibration: got {} distinct message sizes, expected at least 2 to fit", sizes.size());
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const LinkSample& s : samples) {
    const double x = static_cast<double>(s.bytes);
    n += 1, sx += x, sy += s.ms, sxx += x * x, sxy += x * s.ms;
  }
  double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  double intercept = (sy - slope * sx) / n;
  if (intercept < 0) intercept = 0, slope = sxy / sxx;
  if (!(slope > 0)) {
    // Noise larger than the size's effect (latency-bound messages): all latency, and a bandwidth
    // that makes the largest message cost a thousandth of the mean time on top.
    intercept = sy / n;
    slope = intercept / 1e3 / static_cast<double>(*sizes.rbegin());
  }
  return {intercept, slope};
}

// Computes (float32 matrix products, as training would) for at least `ms`; returns the ms spent.
double compute_for(double ms) {
  static thread_local Tensor a = randn({128, 128}), b = randn({128, 128});
  const auto t0 = Clock::now();
  double spent = 0;
  while (spent < ms) {
    a = matmul(a, b).mul_(1.0 / 12);
    spent = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  return spent;
}

LinkFit measure_point_to_point(ProcessGroup& group, int a, int b, const CalibrationOptions& options) {
  check_options(options, options.sizes_bytes);
  if (a == b || a < 0 || b < 0 || a >= group.size() || b >= group.size())
    fail("calibration: got ranks {} and {} of a group of {}, expected two different ranks of it", a, b, group.size());
  std::vector<double> medians;
  for (int64_t bytes : options.sizes_bytes) {
    Tensor buffer = randn({bytes / 4}), incoming = empty({bytes / 4});
    std::vector<double> times;
    group.barrier()->wait();
    const bool streaming = options.compute_between_ms > 0;
    const int self = group.rank(), peer = self == a ? b : a;
    for (int run = 0; run < options.warmup + options.repeats; ++run) {
      if (streaming && (self == a || self == b)) {
        // Both ranks: compute, then exchange a message each way (as neighbouring stages do).
        const auto t0 = Clock::now();
        const double computed = compute_for(options.compute_between_ms);
        auto sent = group.send(buffer, peer, 7);
        group.recv(incoming, peer, 7)->wait();
        sent->wait();
        const double total = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (run >= options.warmup) times.push_back(total - computed);
      } else if (self == a) {
        const auto t0 = Clock::now();
        group.send(buffer, b, 7)->wait();
        group.recv(buffer, b, 8)->wait();
        if (run >= options.warmup)
          times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / 2);
      } else if (self == b) {
        group.recv(buffer, a, 7)->wait();
        group.send(buffer, a, 8)->wait();
      }
    }
    group.barrier()->wait();
    // Streaming: the mean, because a pipeline pays every message and these costs are bimodal on a
    // busy machine (a core free at once, or after another thread's time slice). Idle: the median.
    medians.push_back(group.rank() == a ? (streaming ? mean(times) : median(times)) : 0.0);
  }
  medians = share(group, medians, a);
  std::vector<LinkSample> samples;
  for (size_t i = 0; i < medians.size(); ++i) samples.push_back({options.sizes_bytes[i], medians[i]});
  const auto [latency_ms, ms_per_byte] = fit_line(samples);
  return make_fit(std::move(samples), latency_ms, ms_per_byte);
}

LinkFit measure_allreduce(ProcessGroup& group, const CalibrationOptions& options) {
  check_options(options, options.allreduce_sizes_bytes);
  const int r = group.size();
  if (r < 2) fail("calibration: an allreduce needs at least 2 ranks, got a group of {}", r);
  std::vector<LinkSample> samples;
  for (int64_t bytes : options.allreduce_sizes_bytes) {
    Tensor buffer = randn({bytes / 4});
    std::vector<double> times;
    for (int run = 0; run < options.warmup + options.repeats; ++run) {
      group.barrier()->wait();
      const auto t0 = Clock::now();
      group.allreduce({buffer})->wait();
      if (run >= options.warmup) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    // The slowest rank's mean (a training step pays each bucket's allreduce; see the streaming case).
    Tensor mine = full({1}, mean(times), {.dtype = kFloat64});
    group.allreduce({mine}, ReduceOp::Max)->wait();
    samples.push_back({bytes, mine.item<double>()});
  }
  return ring_fit(std::move(samples), r);
}

LinkFit measure_ddp_allreduce(const std::shared_ptr<ProcessGroup>& group, const CalibrationOptions& options) {
  check_options(options, options.allreduce_sizes_bytes);
  const int r = group->size();
  if (r < 2) fail("calibration: an allreduce needs at least 2 ranks, got a group of {}", r);
  std::vector<LinkSample> samples;
  for (int64_t bytes : options.allreduce_sizes_bytes) {
    // loss = sum(w * c): its backward writes w's gradient (c) in one pass, so what DDP adds stands
    // out against a small, steady remainder.
    Tensor w = randn({bytes / 4}).requires_grad_(true), c = randn({bytes / 4});
    // One parameter: one bucket of exactly `bytes` (a parameter above the cap gets its own bucket).
    Reducer reducer({w}, {"calibration"}, group, ReducerOptions{.bucket_cap_bytes = bytes, .first_bucket_cap_bytes = bytes});
    auto step_ms = [&](bool ddp) {
      w.mutable_grad() = Tensor();  // as zero_grad(set_to_none): the gradient is written, not added
      group->barrier()->wait();
      const auto t0 = Clock::now();
      if (ddp) reducer.prepare_for_forward();
      Tensor loss = (w * c).sum();
      if (ddp) reducer.prepare_for_backward({loss});
      loss.backward();
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    std::vector<double> with, without;
    for (int run = 0; run < options.warmup + options.repeats; ++run) {
      const double a = step_ms(true), b = step_ms(false);
      if (run >= options.warmup) with.push_back(a), without.push_back(b);
    }
    Tensor mine = full({1}, std::max(0.0, mean(with) - mean(without)), {.dtype = kFloat64});
    group->allreduce({mine}, ReduceOp::Max)->wait();
    samples.push_back({bytes, mine.item<double>()});
  }
  return ring_fit(std::move(samples), r);
}

}  // namespace chorus::distributed::pipeline::planner
