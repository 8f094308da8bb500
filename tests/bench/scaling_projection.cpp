// Scaling projection: how much of a GPU's speed data parallelism keeps at N = 1 ... 256 GPUs, for
// ResNet-50, BERT-base and GPT-2 124M, simulated from chorus's real DDP buckets: first DDP over a
// flat ring (with and without overlap), then each way chorus offers to communicate (the flat ring,
// the hierarchical allreduce, PowerSGD over either, ZeRO-1, SHARD_GRAD_OP, FULL_SHARD; the model is
// tests/bench/ddp_projection.h, its assumptions in docs/scaling.md).
//
// Measured here, on this machine: one DDP iteration (world size 1) of each model, which gives the
// bucket layout chorus really uses (sizes, order after the first-iteration rebuild) and when, as a
// fraction of backward, each bucket's last gradient arrives. Given (flags): the forward and
// backward time of one iteration on the target GPU, which scale those fractions to milliseconds
// (defaults: ResNet-50 batch 64 and BERT-base batch 32 x 128 in mixed precision on a V100-class
// GPU; replace them with measured figures when a GPU is available). Ring allreduce of S bytes over
// N GPUs costs 2(N-1)/N * S / B + 2(N-1) * latency, with B the slowest link's bandwidth: NVLink inside a
// node of 8, then 100 or 400 Gb/s between nodes. With overlap a bucket's allreduce starts when its
// gradients are ready and the previous one has finished; without, all of them start after backward.
//
// With --measured FILE (written by tests/bench:ddp_gpu_bench on a GPU), the bucket layout, ready
// points and forward/backward times all come from that GPU run's device events instead.
//
//   bazel run -c opt //tests/bench:scaling_projection -- [--resnet-fwd-ms 45 --resnet-bwd-ms 90 ...]
//   bazel run -c opt //tests/bench:scaling_projection -- --measured /path/to/ddp_gpu_spans.json
//
// Without GPT-2 in the measured file (ddp_gpu_bench measures it since 2026-11-28), GPT-2's
// forward and backward are BERT-base's scaled by the ratio of their FLOPs (batch 8 x 1024 against
// BERT's 16 x 128). Other flags: --nics-per-node 8, --nvlink-gbs 130 (GB/s per GPU inside a node),
// --hbm-gbs 2500 (PowerSGD's arithmetic is memory-bound), --powersgd-rank 4.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/ddp.h"
#include "distributed/init.h"
#include "tests/bench/ddp_projection.h"
#include "examples/models/bert.h"
#include "examples/models/gpt.h"
#include "examples/models/resnet.h"
#include "tensor/ops.h"

using namespace chorus;

namespace {

using bench::BucketTiming;

// One measured DDP iteration (the second: buckets are rebuilt after the first).
std::vector<BucketTiming> measure(const std::shared_ptr<nn::Module>& model, const std::function<Tensor(nn::Module&)>& loss_of,
                                  const std::shared_ptr<distributed::ProcessGroup>& group) {
  distributed::DistributedDataParallel ddp(model, group);
  for (int it = 0; it < 2; ++it) {
    model->zero_grad();
    ddp.forward([&] { return loss_of(*model); }).backward();
  }
  return bench::bucket_timings(ddp);
}

// Forward FLOPs of a transformer step: 2 per matrix weight per token, and attention's QK^T and AV
// (4 T d per token per layer).
double transformer_forward_flops(double matmul_weights, double layers, double seq, double width, double batch) {
  return batch * seq * (2.0 * matmul_weights + 4.0 * layers * seq * width);
}

struct Link {
  const char* name;
  double inter_node_gbps;  // gigabits per second between nodes
};

// Per-GPU efficiency = single-GPU iteration time / N-GPU iteration time (same per-GPU batch).
double efficiency(const std::vector<BucketTiming>& buckets, double fwd_ms, double bwd_ms, int n, double node_gbps,
                  bool overlap) {
  if (n == 1) return 1.0;
  const double nvlink_bytes_per_ms = 130e9 / 1e3;  // ~130 GB/s ring bandwidth per GPU inside a node
  const double link_bytes_per_ms = n <= 8 ? nvlink_bytes_per_ms : node_gbps * 1e9 / 8 / 1e3;
  const double latency_ms = n <= 8 ? 0.005 : 0.010;
  return (fwd_ms + bwd_ms) /
         bench::iteration_time(buckets, fwd_ms, bwd_ms, n, link_bytes_per_ms, 2.0 * (n - 1) * latency_ms, overlap);
}

double flag(int argc, char** argv, const char* name, double fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name)) return std::atof(argv[i + 1]);
  return fallback;
}

// A model's buckets and times from ddp_gpu_bench's JSON.
// The parameters' shapes come from this machine's run of the same model (the same bucket layout).
bool load_measured(const nlohmann::json& doc, const char* key, std::vector<BucketTiming>& buckets, double& fwd,
                   double& bwd) {
  if (!doc.contains(key)) return false;
  const auto& m = doc.at(key);
  const std::vector<BucketTiming> here = buckets;
  buckets.clear();
  for (const auto& b : m.at("buckets")) {
    BucketTiming t{b.at("bytes").get<double>(), b.at("ready_fraction").get<double>(), {}, 4};
    const size_t i = buckets.size();
    if (i < here.size() && here[i].bytes == t.bytes) t.shapes = here[i].shapes;
    else std::fprintf(stderr, "scaling_projection: %s bucket %zu: %.0f bytes there, not this run's layout (PowerSGD sends it whole)\n", key, i, t.bytes);
    buckets.push_back(std::move(t));
  }
  fwd = m.at("forward_ms").get<double>();
  bwd = m.at("backward_ms").get<double>();
  return true;
}

const char* measured_path(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--measured")) return argv[i + 1];
  return nullptr;
}
}  // namespace

int main(int argc, char** argv) {
  double resnet_fwd = flag(argc, argv, "--resnet-fwd-ms", 45), resnet_bwd = flag(argc, argv, "--resnet-bwd-ms", 90);
  double bert_fwd = flag(argc, argv, "--bert-fwd-ms", 55), bert_bwd = flag(argc, argv, "--bert-bwd-ms", 110);
  const int nics = static_cast<int>(flag(argc, argv, "--nics-per-node", 8));
  const double nvlink_gbs = flag(argc, argv, "--nvlink-gbs", 130), hbm_gbs = flag(argc, argv, "--hbm-gbs", 2500);
  const int psgd_rank = static_cast<int>(flag(argc, argv, "--powersgd-rank", 4));
  auto group = distributed::init_process_group(
      {.rank = 0, .world_size = 1,
       .store = std::make_shared<distributed::TCPStore>("127.0.0.1", 0, distributed::TCPStoreOptions{.is_server = true})});

  manual_seed(1);
  std::shared_ptr<nn::Module> resnet = models::resnet50();
  Tensor images = randn({1, 3, 128, 128});
  Tensor labels = randint(0, 1000, {1});
  auto resnet_buckets = measure(resnet, [&](nn::Module& m) { return nn::functional::cross_entropy(m.forward(images), labels); }, group);
  resnet.reset();

  auto bert = std::make_shared<models::BertForPreTraining>(models::BertConfig::named("base"));
  Tensor ids = randint(1000, 30000, {1, 32}, {.dtype = kInt64});
  Tensor next_sentence = randint(0, 2, {1});
  auto bert_buckets = measure(bert, [&](nn::Module&) {
    models::BertOutputs out = bert->forward(ids, Tensor(), Tensor());  // masked-LM + next-sentence, as pretraining
    return nn::functional::cross_entropy(out.prediction_logits.reshape({-1, 30522}), ids.reshape({-1})) +
           nn::functional::cross_entropy(out.seq_relationship_logits, next_sentence);
  }, group);
  bert.reset();

  auto gpt = std::make_shared<models::GPT2LMHeadModel>(models::GPTConfig::named("gpt2"));
  Tensor tokens = randint(0, 50257, {1, 129}, {.dtype = kInt64});
  auto gpt_buckets = measure(gpt, [&](nn::Module&) { return gpt->loss(tokens.narrow(1, 0, 128), tokens.narrow(1, 1, 128)); }, group);
  gpt.reset();

  // GPT-2 124M at batch 8 x 1024 against BERT-base at 16 x 128 (its measured batch): matrix
  // weights of the layers (12 d^2 each) and heads (BERT: transform d^2 + decoder d x 30522; GPT-2:
  // the tied d x 50257).
  const double d = 768, layer_weights = 12 * 12 * d * d;
  const double flop_ratio = transformer_forward_flops(layer_weights + d * 50257, 12, 1023, d, 8) /
                            transformer_forward_flops(layer_weights + d * d + d * 30522, 12, 128, d, 16);
  const char* source = "given";
  std::string gpt_source;
  double gpt_fwd = bert_fwd * flop_ratio, gpt_bwd = bert_bwd * flop_ratio;
  if (const char* path = measured_path(argc, argv)) {
    std::ifstream in(path);
    if (!in) {
      std::fprintf(stderr, "scaling_projection: cannot read --measured %s\n", path);
      return 2;
    }
    const nlohmann::json doc = nlohmann::json::parse(in);
    const bool r = load_measured(doc, "resnet50", resnet_buckets, resnet_fwd, resnet_bwd);
    const bool b = load_measured(doc, "bert_base", bert_buckets, bert_fwd, bert_bwd);
    if (!r || !b) {
      std::fprintf(stderr, "scaling_projection: %s lacks %s (expected ddp_gpu_bench's resnet50 and bert_base)\n", path,
                   r ? "bert_base" : "resnet50");
      return 2;
    }
    source = "measured on a GPU by ddp_gpu_bench";
    if (load_measured(doc, "gpt2", gpt_buckets, gpt_fwd, gpt_bwd)) {
      gpt_source = source;
    } else {
      gpt_fwd = bert_fwd * flop_ratio;
      gpt_bwd = bert_bwd * flop_ratio;
    }
  }
  if (gpt_source.empty()) {
    char text[160];
    std::snprintf(text, sizeof(text), "BERT-base's %s times x %.2f, the ratio of their FLOPs at batch 8 x 1024 and 16 x 128",
                  source, flop_ratio);
    gpt_source = text;
  }
  const Link links[] = {{"100 Gb/s", 100}, {"400 Gb/s", 400}};
  struct Model {
    const char* name;
    const std::vector<BucketTiming>* buckets;
    double fwd, bwd;
    std::string source;
  };
  const Model model_list[] = {{"ResNet-50", &resnet_buckets, resnet_fwd, resnet_bwd, source},
                              {"BERT-base", &bert_buckets, bert_fwd, bert_bwd, source},
                              {"GPT-2 124M", &gpt_buckets, gpt_fwd, gpt_bwd, gpt_source}};
  for (const Model& m : model_list) {
    double total = 0;
    for (const auto& b : *m.buckets) total += b.bytes;
    std::printf("\n%s: %zu buckets, %.1f MiB of gradients; GPU forward %.1f ms, backward %.1f ms (%s)\n", m.name,
                m.buckets->size(), total / 1048576.0, m.fwd, m.bwd, m.source.c_str());
    std::printf("bucket MiB and ready point (fraction of backward, measured): ");
    for (const auto& b : *m.buckets) std::printf("%.1f@%.2f ", b.bytes / 1048576.0, b.ready_fraction);
    std::printf("\n\n| GPUs | %s overlap | %s no overlap | %s overlap | %s no overlap |\n|---|---|---|---|---|\n",
                links[0].name, links[0].name, links[1].name, links[1].name);
    for (int n : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      std::printf("| %d |", n);
      for (const Link& l : links) {
        std::printf(" %.1f%% | %.1f%% |", 100 * efficiency(*m.buckets, m.fwd, m.bwd, n, l.inter_node_gbps, true),
                    100 * efficiency(*m.buckets, m.fwd, m.bwd, n, l.inter_node_gbps, false));
      }
      std::printf("\n");
    }
  }

  // Each way to communicate, per GPU, with overlap where chorus overlaps.
  std::printf("\n## Each way to communicate: per-GPU efficiency (nodes of 8 GPUs, NVLink %.0f GB/s per GPU, 5 us a "
              "step; %d NIC(s) per node, 10 us a step; PowerSGD rank %d, its arithmetic at %.0f GB/s)\n",
              nvlink_gbs, nics, psgd_rank, hbm_gbs);
  for (const Model& m : model_list) {
    const std::vector<BucketTiming>& buckets = *m.buckets;
    double total = 0, psgd_sent = 0;
    for (const auto& b : buckets) {
      total += b.bytes;
      const bench::PowerSGDTraffic t = bench::powersgd_traffic(b, psgd_rank);
      psgd_sent += t.exact_bytes + t.p_bytes + t.q_bytes;
    }
    std::printf("\n%s (%.1f MiB of gradients; PowerSGD rank %d sends %.2f MiB of them, %.0fx less)\n", m.name,
                total / 1048576.0, psgd_rank, psgd_sent / 1048576.0, total / psgd_sent);
    for (const Link& l : links) {
      std::printf("\n%s between nodes\n\n| GPUs | DDP, flat ring | DDP, hierarchical | PowerSGD, flat | PowerSGD, "
                  "hierarchical | ZeRO-1 | SHARD_GRAD_OP | FULL_SHARD |\n|---|---|---|---|---|---|---|---|\n",
                  l.name);
      for (int n : {8, 16, 32, 64, 128, 256}) {
        bench::Cluster c;
        c.gpus = n;
        c.nics_per_node = nics;
        c.intra_bytes_per_unit = nvlink_gbs * 1e9 / 1e3;  // per ms
        c.intra_step = 0.005;
        c.nic_bytes_per_unit = l.inter_node_gbps * 1e9 / 8 / 1e3;
        c.inter_step = 0.010;
        const double memory = hbm_gbs * 1e9 / 1e3;
        auto flat = [&](double bytes) { return bench::flat_allreduce(c, bytes); };
        auto hier = [&](double bytes) { return bench::hierarchical_allreduce(c, bytes); };
        const double one = m.fwd + m.bwd;
        const double t[] = {
            bench::ddp_iteration(buckets, m.fwd, m.bwd, [&](const BucketTiming& b) { return flat(b.bytes); }),
            bench::ddp_iteration(buckets, m.fwd, m.bwd, [&](const BucketTiming& b) { return hier(b.bytes); }),
            bench::blocking_hook_iteration(buckets, m.fwd, m.bwd,
                                           [&](const BucketTiming& b) { return bench::powersgd_bucket(b, psgd_rank, flat, memory); }),
            bench::blocking_hook_iteration(buckets, m.fwd, m.bwd,
                                           [&](const BucketTiming& b) { return bench::powersgd_bucket(b, psgd_rank, hier, memory); }),
            bench::zero1_iteration(buckets, m.fwd, m.bwd, c),
            bench::fsdp_iteration(buckets, m.fwd, m.bwd, c, false),
            bench::fsdp_iteration(buckets, m.fwd, m.bwd, c, true),
        };
        std::printf("| %d |", n);
        for (double x : t) std::printf(" %.1f%% |", 100 * one / x);
        std::printf("\n");
      }
    }
  }
  distributed::destroy_process_group();
  return 0;
}
