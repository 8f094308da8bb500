// The DDP iteration model of scaling_projection, shared with ddp_bench's `link` mode (which checks it
// against real communication): each bucket's ring allreduce takes 2(N-1)/N * bytes / bandwidth plus a
// fixed cost, starts when its last gradient is ready (with overlap; after backward without) and
// after the previous bucket, and the iteration is forward + max(backward, last allreduce end).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "distributed/ddp.h"

namespace chorus::bench {

struct BucketTiming {
  double bytes;
  double ready_fraction;  // when its last gradient arrived, as a fraction of backward
};

// The buckets of `ddp`'s latest iteration: sizes and ready points from its recorded spans.
inline std::vector<BucketTiming> bucket_timings(distributed::DistributedDataParallel& ddp) {
  const distributed::IterationStats& st = ddp.stats().back();
  const double fwd_us = st.forward_ms * 1e3, bwd_us = st.backward_ms * 1e3;
  std::vector<BucketTiming> out;
  for (const auto& b : ddp.reducer().buckets()) {
    const std::string want = "backward: bucket " + std::to_string(b.index) + " gradients";
    double ready = bwd_us;
    for (const auto& span : st.spans)
      if (span.name == want) ready = span.end_us - fwd_us;
    out.push_back({static_cast<double>(b.buffer.nbytes()), std::clamp(ready / std::max(bwd_us, 1.0), 0.0, 1.0)});
  }
  return out;
}

// One iteration's predicted time over n processes (same units as fwd and bwd; bytes_per_unit is
// the ring's bandwidth in bytes per that unit, fixed the cost of one collective beside its bytes).
inline double iteration_time(const std::vector<BucketTiming>& buckets, double fwd, double bwd, int n,
                             double bytes_per_unit, double fixed, bool overlap = true) {
  if (n == 1) return fwd + bwd;
  double comm_end = 0, total_comm = 0;
  for (const BucketTiming& b : buckets) {
    const double t = 2.0 * (n - 1) / n * b.bytes / bytes_per_unit + fixed;
    total_comm += t;
    comm_end = std::max(comm_end, overlap ? b.ready_fraction * bwd : bwd) + t;
  }
  return fwd + (overlap ? std::max(bwd, comm_end) : bwd + total_comm);
}

}  // namespace chorus::bench
