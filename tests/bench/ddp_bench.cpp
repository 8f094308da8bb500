// DDP benchmarks (tables; not pass/fail). Modes:
//
//   ddp_bench overhead            one process: DDP at world size 1 against plain training of the
//                                 same model, step time (forward + backward + SGD step)
//   chorusrun --nproc-per-node 2 ddp_bench overlap
//                                 backward + gradient sync with 25 MiB buckets (allreduce overlapping
//                                 backward) against one bucket reduced after backward, same run
//   chorusrun --nproc-per-node N ddp_bench allreduce
//                                 Gloo allreduce of float32 buffers from 1 KiB to 64 MiB: time,
//                                 algbw = bytes / time, busbw = algbw * 2 (N - 1) / N (nccl-tests)
//
//   chorusrun --nnodes N ... ddp_bench link STEPS GBPS
//                                 one process per host over a link of GBPS gigabits per second
//                                 (tools/shaped_links.sh shapes one with tc): a ResNet-18 DDP step
//                                 measured, and predicted by scaling_projection's model from this
//                                 run's own compute times, bucket layout and bucket ready points;
//                                 CHORUS_BENCH_LOCAL=L with --nproc-per-node L: the hierarchical
//                                 allreduce too
//
// tools/bench_ddp.sh runs the first three.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "distributed/ddp.h"
#include "distributed/hierarchical.h"
#include "distributed/round_robin.h"
#include "distributed/init.h"
#include "examples/models/resnet.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/ddp_projection.h"

using namespace chorus;
namespace F = chorus::nn::functional;

namespace {

// An MLP of `layers` hidden layers of `width`: many parameters (gradients) per unit of compute.
std::shared_ptr<nn::Sequential> mlp(int64_t in, int64_t width, int layers) {
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>();
  int64_t d = in;
  for (int i = 0; i < layers; ++i) {
    net->push_back(std::make_shared<nn::Linear>(d, width));
    net->push_back(std::make_shared<nn::ReLU>());
    d = width;
  }
  net->push_back(std::make_shared<nn::Linear>(d, 10));
  return net;
}

int64_t param_bytes(nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel() * 4;
  return n;
}

void overhead(int steps) {
  auto group = distributed::init_process_group(
      {.init_method = "tcp://127.0.0.1:0", .rank = 0, .world_size = 1,
       .store = std::make_shared<distributed::TCPStore>("127.0.0.1", 0, distributed::TCPStoreOptions{.is_server = true})});
  std::printf("DDP at world size 1 against plain training, step = forward + backward + SGD step, median of %d\n\n", steps);
  std::printf("| model | threads | plain ms | DDP ms | DDP / plain |\n|---|---|---|---|---|\n");
  struct M {
    const char* name;
    int64_t in, width;
    int layers;
    int64_t batch;
  };
  for (M m : {M{"MLP 784-1024x4-10, batch 64", 784, 1024, 4, 64}, M{"MLP 256-256x8-10, batch 32", 256, 256, 8, 32}}) {
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor x = randn({m.batch, m.in});
      Tensor y = randint(0, 10, {m.batch});
      auto plain = mlp(m.in, m.width, m.layers);
      optim::SGD po(plain->parameters(), {.lr = 0.01, .momentum = 0.9});
      auto wrapped = mlp(m.in, m.width, m.layers);
      distributed::DistributedDataParallel ddp(wrapped, group);
      optim::SGD dopt(wrapped->parameters(), {.lr = 0.01, .momentum = 0.9});
      // Interleave the two so drifts in machine speed hit both alike.
      double tp = 0, td = 0;
      for (int round = 0; round < 3; ++round) {
        tp += bench::median_time([&] { po.zero_grad(); F::cross_entropy(plain->forward(x), y).backward(); po.step(); }, 3, steps);
        td += bench::median_time([&] { dopt.zero_grad(); F::cross_entropy(ddp.forward(x), y).backward(); dopt.step(); }, 3, steps);
      }
      std::printf("| %s | %d | %.3f | %.3f | %.3f |\n", m.name, threads, tp / 3 * 1e3, td / 3 * 1e3, td / tp);
      std::fflush(stdout);
    }
  }
  distributed::destroy_process_group();
}

void overlap(int steps) {
  auto group = distributed::init_process_group();
  const int rank = group->rank(), world = group->size();
  auto model25 = mlp(1024, 2048, 6), model1 = mlp(1024, 2048, 6);
  distributed::DistributedDataParallel bucketed(model25, group, {.bucket_cap_mb = 25});
  distributed::DistributedDataParallel single(model1, group, {.bucket_cap_mb = 1e6, .first_bucket_cap_mb = 1e6});
  manual_seed(5 + rank);
  Tensor x = randn({32, 1024});
  Tensor y = randint(0, 10, {32});
  double t25 = 0, t1 = 0, comm25 = 0, ovl25 = 0, comm1 = 0;
  for (int round = 0; round < 3; ++round) {
    t25 += bench::median_time([&] { model25->zero_grad(); F::cross_entropy(bucketed.forward(x), y).backward(); }, 3, steps);
    t1 += bench::median_time([&] { model1->zero_grad(); F::cross_entropy(single.forward(x), y).backward(); }, 3, steps);
  }
  for (const auto& s : bucketed.stats()) comm25 += s.communication_ms, ovl25 += s.overlapped_ms;
  for (const auto& s : single.stats()) comm1 += s.communication_ms;
  if (rank == 0) {
    std::printf("Overlap: %d ranks, MLP 1024-2048x6-10 (%.1f MiB of float32 gradients), batch 32 per rank, "
                "forward + backward + sync, median of %d (x3 rounds)\n\n",
                world, param_bytes(*model25) / 1048576.0, steps);
    std::printf("| buckets | count | step ms | mean comm ms | mean comm overlapped with backward ms |\n|---|---|---|---|---|\n");
    std::printf("| 25 MiB (first 1 MiB) | %zu | %.2f | %.2f | %.2f |\n", bucketed.reducer().buckets().size(), t25 / 3 * 1e3,
                comm25 / bucketed.stats().size(), ovl25 / bucketed.stats().size());
    std::printf("| one bucket after backward | %zu | %.2f | %.2f | 0 |\n", single.reducer().buckets().size(), t1 / 3 * 1e3,
                comm1 / single.stats().size());
    std::printf("\nspeed-up from overlap: %.3f\n", t1 / t25);
  }
  group->barrier()->wait();
  distributed::destroy_process_group();
}

void allreduce(int reps) {
  auto group = distributed::init_process_group();
  const int world = group->size();
  if (group->rank() == 0) {
    std::printf("Gloo allreduce (sum) of float32, %d ranks on one machine (loopback TCP), median of %d\n\n", world, reps);
    std::printf("| bytes | time us | algbw GB/s | busbw GB/s |\n|---|---|---|---|\n");
  }
  for (int64_t bytes = 1024; bytes <= (64ll << 20); bytes *= 4) {
    Tensor t = ones({bytes / 4});
    const double s = bench::median_time([&] { group->allreduce({t})->wait(); }, 3, bytes >= (16 << 20) ? 7 : reps);
    const double algbw = static_cast<double>(bytes) / s / 1e9;
    if (group->rank() == 0) {
      std::printf("| %lld | %.1f | %.3f | %.3f |\n", static_cast<long long>(bytes), s * 1e6, algbw,
                  algbw * 2.0 * (world - 1) / world);
      std::fflush(stdout);
    }
  }
  group->barrier()->wait();
  distributed::destroy_process_group();
}

// ResNet-18 (1000 classes) at batch 16 of 3x64x64 per process, SGD momentum: the compute alone
// (forward, then forward + backward, no communication), the DDP step across the link, and what
// scaling_projection's model predicts from those: each bucket's ring allreduce takes
// 2(N-1)/N * bytes / bandwidth + t0 (t0: a 4-byte allreduce, measured), starts when its last
// gradient is ready (its ready point in this run's backward) and after the previous bucket, and the
// step ends at max(backward, last allreduce).
//
// CHORUS_BENCH_LOCAL=L (L processes per host, chorusrun --nproc-per-node L): the same step also
// with the hierarchical allreduce (distributed/hierarchical.h), and its prediction: a reduce-scatter
// and an all-gather inside the host at the rate a 16 MiB allreduce gets there, and an allreduce of
// 1/L of each bucket across the hosts by each local rank, the L of them sharing the host's link.
void link(int steps, double gbps) {
  auto group = distributed::init_process_group();
  const int rank = group->rank(), n = group->size();
  set_num_threads(1);
  manual_seed(11);
  Tensor x = randn({16, 3, 64, 64});
  Tensor y = randint(0, 1000, {16});
  // Compute alone.
  auto plain = models::resnet18();
  const double fwd = bench::median_time([&] { autograd::NoGradGuard g; (void)plain->forward(x); }, 2, steps);
  const double fwd_bwd = bench::median_time([&] { plain->zero_grad(); F::cross_entropy(plain->forward(x), y).backward(); }, 2, steps);
  const double bwd = std::max(0.0, fwd_bwd - fwd);
  // A small allreduce: the fixed cost of one collective; a 16 MiB one: the bandwidth Gloo really
  // gets (a ring moves 2(N-1)/N of it). Every process of `g` at once.
  Tensor tiny = ones({1}), big = ones({4 << 20});
  auto fixed_cost = [&](distributed::ProcessGroup& g) { return bench::median_time([&] { g.allreduce({tiny})->wait(); }, 3, 21); };
  auto rate = [&](distributed::ProcessGroup& g, double t0) {
    const double t16 = bench::median_time([&] { g.allreduce({big})->wait(); }, 1, 5);
    return 2.0 * (g.size() - 1) / g.size() * big.nbytes() / std::max(t16 - t0, 1e-9);
  };
  const double t0 = fixed_cost(*group);
  const double measured_bytes_per_s = rate(*group, t0);
  // The DDP step across the link (the same model, 25 MiB buckets; CHORUS_BENCH_BUCKET_MB and
  // CHORUS_BENCH_GROUPS=k: other buckets, and DDP over k round-robin process groups).
  const char* groups_env = std::getenv("CHORUS_BENCH_GROUPS");
  const char* bucket_env = std::getenv("CHORUS_BENCH_BUCKET_MB");
  const char* local_env = std::getenv("CHORUS_BENCH_LOCAL");
  const int groups = groups_env ? std::max(1, std::atoi(groups_env)) : 1;
  const int local = local_env ? std::max(1, std::atoi(local_env)) : 1;
  distributed::DDPOptions ddp_options;
  if (bucket_env) ddp_options.bucket_cap_mb = std::atof(bucket_env);
  auto model = models::resnet18();
  distributed::DistributedDataParallel ddp(model, groups > 1 ? distributed::round_robin_process_groups(groups) : group,
                                           ddp_options);
  const double measured = bench::median_time([&] { model->zero_grad(); F::cross_entropy(ddp.forward(x), y).backward(); }, 2, steps);
  // Bucket sizes and ready points from the last iteration; the model in seconds.
  const std::vector<bench::BucketTiming> buckets = bench::bucket_timings(ddp);
  double bytes_total = 0;
  std::string layout;
  for (const bench::BucketTiming& b : buckets) {
    bytes_total += b.bytes;
    char item[64];
    std::snprintf(item, sizeof(item), "%s%.1f@%.2f", layout.empty() ? "" : " ", b.bytes / 1048576.0, b.ready_fraction);
    layout += item;
  }
  const double predicted = bench::iteration_time(buckets, fwd, bwd, n, gbps * 1e9 / 8, t0);
  const double predicted_measured_bw = bench::iteration_time(buckets, fwd, bwd, n, measured_bytes_per_s, t0);
  // The hierarchical allreduce: its subgroups' own fixed costs and rates, its step, its prediction.
  struct Hier {
    double intra_t0 = 0, inter_t0 = 0, intra_rate = 0, inter_rate = 0, measured = 0, predicted = 0, predicted_achieved = 0;
  } h;
  if (local > 1) {
    auto groups_h = distributed::HierarchicalGroups::make(local);
    h.intra_t0 = fixed_cost(*groups_h->intra());
    h.inter_t0 = fixed_cost(*groups_h->inter());
    h.intra_rate = rate(*groups_h->intra(), h.intra_t0);
    h.inter_rate = rate(*groups_h->inter(), h.inter_t0);  // every local rank at once: the link shared
    auto hier_model = models::resnet18();
    distributed::DistributedDataParallel hier_ddp(hier_model, group, ddp_options);
    hier_ddp.register_comm_hook(distributed::hierarchical_allreduce_hook(groups_h));
    h.measured = bench::median_time([&] { hier_model->zero_grad(); F::cross_entropy(hier_ddp.forward(x), y).backward(); }, 2, steps);
    const std::vector<bench::BucketTiming> hb = bench::bucket_timings(hier_ddp);
    auto predict = [&](double link_bytes_per_s) {
      bench::Cluster c;
      c.gpus = n;
      c.per_node = local;
      c.nics_per_node = 1;
      c.intra_bytes_per_unit = h.intra_rate;
      c.intra_fixed = h.intra_t0;
      c.nic_bytes_per_unit = link_bytes_per_s;
      c.inter_fixed = h.inter_t0;
      return bench::ddp_iteration(hb, fwd, bwd, [&](const bench::BucketTiming& b) { return bench::hierarchical_allreduce(c, b.bytes); });
    };
    h.predicted = predict(gbps * 1e9 / 8);
    h.predicted_achieved = predict(h.inter_rate * local);  // the model shares one link among the local ranks
  }
  if (rank == 0) {
    std::printf("ResNet-18 b16 x 3x64x64 per process, %d processes (%d per host), link %.3g Gb/s, median of %d, %d process "
                "group(s) round robin, %.3g MiB buckets\n",
                n, local, gbps, steps, groups, ddp_options.bucket_cap_mb);
    std::printf("compute: forward %.1f ms, backward %.1f ms; allreduce: 4 bytes %.2f ms, 16 MiB %.3f Gb/s achieved; "
                "%zu buckets, %.1f MiB (MiB@ready point: %s)\n",
                fwd * 1e3, bwd * 1e3, t0 * 1e3, measured_bytes_per_s * 8 / 1e9, ddp.reducer().buckets().size(),
                bytes_total / 1048576.0, layout.c_str());
    if (local > 1) {
      std::printf("hierarchical: inside a host 4 bytes %.2f ms, 16 MiB %.3f Gb/s; across hosts (each of %d local ranks "
                  "at once) 4 bytes %.2f ms, 16 MiB %.3f Gb/s each\n",
                  h.intra_t0 * 1e3, h.intra_rate * 8 / 1e9, local, h.inter_t0 * 1e3, h.inter_rate * 8 / 1e9);
    }
    std::printf("| link | allreduce | step measured ms | predicted at the link's rate ms | predicted at the achieved rate ms | "
                "efficiency measured | predicted (link rate) | predicted (achieved rate) |\n|---|---|---|---|---|---|---|---|\n");
    auto row = [&](const char* how, double m, double p, double pa) {
      std::printf("| %.3g Gb/s | %s | %.1f | %.1f (%.2fx) | %.1f (%.2fx) | %.1f%% | %.1f%% | %.1f%% |\n", gbps, how, m * 1e3,
                  p * 1e3, p / m, pa * 1e3, pa / m, 100 * fwd_bwd / m, 100 * fwd_bwd / p, 100 * fwd_bwd / pa);
    };
    row("flat ring", measured, predicted, predicted_measured_bw);
    if (local > 1) row("hierarchical", h.measured, h.predicted, h.predicted_achieved);
    std::fflush(stdout);
  }
  group->barrier()->wait();
  distributed::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  try {
    if (mode == "overhead") overhead(steps);
    else if (mode == "overlap") overlap(steps);
    else if (mode == "allreduce") allreduce(steps);
    else if (mode == "link" && argc > 3) link(steps, std::atof(argv[3]));
    else {
      std::fprintf(stderr, "usage: ddp_bench overhead|overlap|allreduce [steps] | link STEPS GBPS\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
