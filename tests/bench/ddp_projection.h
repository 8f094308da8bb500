// The communication model of scaling_projection, shared with ddp_bench's `link` mode (which checks
// it against real communication over shaped links; docs/scaling.md).
//
// Collectives are rings: over n processes at B bytes per unit of time, an allreduce of S bytes takes
// 2(n-1)/n S/B, a reduce-scatter or all-gather (n-1)/n S/B, a (pipelined) broadcast S/B, each plus
// a fixed cost (2(n-1) or n-1 ring steps of latency, or a measured figure). The hierarchical
// allreduce (distributed/hierarchical.h) is a reduce-scatter inside each node of L processes, an
// allreduce of S/L among the M nodes (each local rank its own ring, the node's NICs shared by its L
// processes) and an all-gather inside the node.
//
// The iteration schedules, each in the time units of fwd and bwd:
// - DDP: each bucket's collective starts when its last gradient is ready (with overlap; after
//   backward without) and after the previous bucket; the iteration is forward + max(backward, last
//   collective's end).
// - A blocking hook (chorus's PowerSGD: the hook computes and waits inside backward): forward +
//   backward + every bucket's hook time.
// - ZeRO-1 (optim/ZeroRedundancyOptimizer as chorus runs it): DDP, then one broadcast of each
//   rank's shard of the parameters after the step, one after another.
// - FSDP (SHARD_GRAD_OP and FULL_SHARD): units of the DDP buckets' sizes, each unit's share of
//   forward and backward its bucket's share of backward; one communication channel in the order the
//   collectives are issued: the first unit's all-gather at the start of forward, unit k+1's
//   prefetched when unit k starts computing, a unit computing once its gather is done; in backward
//   FULL_SHARD gathers again the same way and every unit's gradients are reduce-scattered when its
//   backward ends (SHARD_GRAD_OP keeps the gathered parameters, so only the reduce-scatters).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distributed/ddp.h"

namespace chorus::bench {

struct BucketTiming {
  double bytes;
  double ready_fraction;                      // when its last gradient arrived, as a fraction of backward
  std::vector<std::vector<int64_t>> shapes;   // its parameters' shapes (for PowerSGD), when known
  int64_t element_size = 4;
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
    BucketTiming t{static_cast<double>(b.buffer.nbytes()), std::clamp(ready / std::max(bwd_us, 1.0), 0.0, 1.0), {},
                   static_cast<int64_t>(b.buffer.element_size())};
    for (const Tensor& v : b.views) t.shapes.push_back(v.sizes());
    out.push_back(std::move(t));
  }
  return out;
}

// ------------------------------------------------------------------------------ collectives
struct Ring {
  int n = 1;
  double bytes_per_unit = 1;  // each link's bandwidth
  double step = 0;            // latency of one ring step
  double fixed = -1;          // when >= 0: the whole fixed cost of one collective (measured), instead of steps
};

inline double ring_fixed(const Ring& r, int steps) { return r.fixed >= 0 ? r.fixed : steps * r.step; }
inline double ring_allreduce(const Ring& r, double bytes) {
  if (r.n <= 1 || bytes <= 0) return 0;
  return 2.0 * (r.n - 1) / r.n * bytes / r.bytes_per_unit + ring_fixed(r, 2 * (r.n - 1));
}
inline double ring_reduce_scatter(const Ring& r, double bytes) {  // bytes: the whole (unscattered) tensor
  if (r.n <= 1 || bytes <= 0) return 0;
  return 1.0 * (r.n - 1) / r.n * bytes / r.bytes_per_unit + ring_fixed(r, r.n - 1);
}
inline double ring_all_gather(const Ring& r, double bytes) { return ring_reduce_scatter(r, bytes); }
inline double ring_broadcast(const Ring& r, double bytes) {
  if (r.n <= 1 || bytes <= 0) return 0;
  return bytes / r.bytes_per_unit + ring_fixed(r, r.n - 1);
}

// GPUs in nodes: a fast ring inside a node, NICs between nodes.
struct Cluster {
  int gpus = 1;
  int per_node = 8;
  int nics_per_node = 8;
  double intra_bytes_per_unit = 1, intra_step = 0;  // inside a node (NVLink)
  double nic_bytes_per_unit = 1, inter_step = 0;    // one NIC, and one step between nodes
  double intra_fixed = -1, inter_fixed = -1;        // measured fixed costs (ddp_bench link), or -1
};

// The flat ring over every GPU, at its slowest link: inside one node NVLink, else one NIC.
inline Ring flat_ring(const Cluster& c) {
  if (c.gpus <= c.per_node) return {c.gpus, c.intra_bytes_per_unit, c.intra_step, c.intra_fixed};
  return {c.gpus, std::min(c.nic_bytes_per_unit, c.intra_bytes_per_unit), c.inter_step, c.inter_fixed};
}
inline Ring intra_ring(const Cluster& c) { return {std::min(c.gpus, c.per_node), c.intra_bytes_per_unit, c.intra_step, c.intra_fixed}; }
// One local rank's ring across the nodes: the node's NICs shared by its processes.
inline Ring inter_ring(const Cluster& c) {
  const int local = std::min(c.gpus, c.per_node);
  const double share = static_cast<double>(std::min(c.nics_per_node, local)) / local;
  return {std::max(1, c.gpus / local), c.nic_bytes_per_unit * share, c.inter_step, c.inter_fixed};
}
inline double flat_allreduce(const Cluster& c, double bytes) { return ring_allreduce(flat_ring(c), bytes); }
inline double hierarchical_allreduce(const Cluster& c, double bytes) {
  if (c.gpus <= c.per_node) return flat_allreduce(c, bytes);
  const Ring intra = intra_ring(c);
  return ring_reduce_scatter(intra, bytes) + ring_allreduce(inter_ring(c), bytes / intra.n) + ring_all_gather(intra, bytes);
}

// ------------------------------------------------------------------------------ schedules
using BucketCost = std::function<double(const BucketTiming&)>;

inline double ddp_iteration(const std::vector<BucketTiming>& buckets, double fwd, double bwd, const BucketCost& cost,
                            bool overlap = true) {
  double comm_end = 0, total_comm = 0;
  for (const BucketTiming& b : buckets) {
    const double t = cost(b);
    total_comm += t;
    comm_end = std::max(comm_end, overlap ? b.ready_fraction * bwd : bwd) + t;
  }
  return fwd + (overlap ? std::max(bwd, comm_end) : bwd + total_comm);
}

// The flat ring of n processes at bytes_per_unit with a fixed cost per collective (the first model).
inline double iteration_time(const std::vector<BucketTiming>& buckets, double fwd, double bwd, int n,
                             double bytes_per_unit, double fixed, bool overlap = true) {
  if (n == 1) return fwd + bwd;
  const Ring ring{n, bytes_per_unit, 0, fixed};
  return ddp_iteration(buckets, fwd, bwd, [&](const BucketTiming& b) { return ring_allreduce(ring, b.bytes); }, overlap);
}

inline double blocking_hook_iteration(const std::vector<BucketTiming>& buckets, double fwd, double bwd, const BucketCost& cost) {
  double total = fwd + bwd;
  for (const BucketTiming& b : buckets) total += cost(b);
  return total;
}

// PowerSGD's traffic for one bucket at rank r (distributed/powersgd.h's rule: a parameter of 2+
// dimensions, n rows, m = numel / n, is sent as P (n x r) and Q (m x r) when n m > r (n + m) *
// min_rate; the rest exactly, in one buffer).
struct PowerSGDTraffic {
  double exact_bytes = 0, p_bytes = 0, q_bytes = 0, compressed_bytes = 0;
};
inline PowerSGDTraffic powersgd_traffic(const BucketTiming& b, int rank, double min_rate = 2.0) {
  PowerSGDTraffic t;
  double known = 0;
  for (const auto& shape : b.shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    known += static_cast<double>(numel * b.element_size);
    const int64_t n = shape.size() >= 2 ? shape[0] : 0, m = n > 0 ? numel / n : 0;
    if (n > 0 && static_cast<double>(n * m) > static_cast<double>(rank * (n + m)) * min_rate) {
      t.p_bytes += static_cast<double>(n * rank * b.element_size);
      t.q_bytes += static_cast<double>(m * rank * b.element_size);
      t.compressed_bytes += static_cast<double>(numel * b.element_size);
    } else {
      t.exact_bytes += static_cast<double>(numel * b.element_size);
    }
  }
  t.exact_bytes += std::max(0.0, b.bytes - known);  // padding, or shapes unknown: sent as they are
  return t;
}
// One bucket's PowerSGD hook: the exact part, P and Q summed by `allreduce` one after another, and
// its arithmetic as `passes` reads or writes of the compressed matrices at memory_bytes_per_unit
// (M + error, M Q, M^T P, P Q^T, the new error, the copy back: about 11).
inline double powersgd_bucket(const BucketTiming& b, int rank, const std::function<double(double)>& allreduce,
                              double memory_bytes_per_unit, double passes = 11) {
  const PowerSGDTraffic t = powersgd_traffic(b, rank);
  return allreduce(t.exact_bytes) + allreduce(t.p_bytes) + allreduce(t.q_bytes) +
         passes * t.compressed_bytes / memory_bytes_per_unit;
}

inline double zero1_iteration(const std::vector<BucketTiming>& buckets, double fwd, double bwd, const Cluster& c) {
  double bytes = 0;
  for (const BucketTiming& b : buckets) bytes += b.bytes;
  const Ring ring = flat_ring(c);
  const double ddp = ddp_iteration(buckets, fwd, bwd, [&](const BucketTiming& b) { return ring_allreduce(ring, b.bytes); });
  return c.gpus <= 1 ? fwd + bwd : ddp + c.gpus * ring_broadcast(ring, bytes / c.gpus);
}

inline double fsdp_iteration(const std::vector<BucketTiming>& buckets, double fwd, double bwd, const Cluster& c,
                             bool full_shard) {
  if (c.gpus <= 1 || buckets.empty()) return fwd + bwd;
  const Ring ring = flat_ring(c);
  const size_t k = buckets.size();
  std::vector<double> share(k);
  double previous = 0;
  for (size_t i = 0; i < k; ++i) {
    share[i] = std::max(0.0, buckets[i].ready_fraction - previous);
    previous = std::max(previous, buckets[i].ready_fraction);
  }
  share[k - 1] += std::max(0.0, 1.0 - previous);  // the rest of backward (after the last bucket's gradients)
  double channel = 0, clock = 0;
  auto issue = [&](double at, double cost) { return channel = std::max(channel, at) + cost; };
  std::vector<double> gathered(k);
  // Forward: the units in reverse bucket order (buckets fill from the last layers).
  gathered[k - 1] = issue(0, ring_all_gather(ring, buckets[k - 1].bytes));
  for (size_t j = k; j-- > 0;) {
    const double start = std::max(clock, gathered[j]);
    if (j > 0) gathered[j - 1] = issue(start, ring_all_gather(ring, buckets[j - 1].bytes));
    clock = start + share[j] * fwd;
  }
  // Backward: bucket order.
  if (full_shard) gathered[0] = issue(clock, ring_all_gather(ring, buckets[0].bytes));
  for (size_t i = 0; i < k; ++i) {
    const double start = full_shard ? std::max(clock, gathered[i]) : clock;
    if (full_shard && i + 1 < k) gathered[i + 1] = issue(start, ring_all_gather(ring, buckets[i + 1].bytes));
    clock = start + share[i] * bwd;
    issue(clock, ring_reduce_scatter(ring, buckets[i].bytes));
  }
  return std::max(clock, channel);
}

}  // namespace chorus::bench
