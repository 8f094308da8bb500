// Scaling projection: how much of a GPU's speed data parallelism keeps at N = 1 ... 256 GPUs, for
// ResNet-50 and BERT-base, simulated from chorus's real DDP buckets.
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
bool load_measured(const nlohmann::json& doc, const char* key, std::vector<BucketTiming>& buckets, double& fwd,
                   double& bwd) {
  if (!doc.contains(key)) return false;
  const auto& m = doc.at(key);
  buckets.clear();
  for (const auto& b : m.at("buckets")) buckets.push_back({b.at("bytes").get<double>(), b.at("ready_fraction").get<double>()});
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
  auto group = distributed::init_process_group(
      {.rank = 0, .world_size = 1,
       .store = std::make_shared<distributed::TCPStore>("127.0.0.1", 0, distributed::TCPStoreOptions{.is_server = true})});

  manual_seed(1);
  std::shared_ptr<nn::Module> resnet = models::resnet50();
  Tensor images = randn({1, 3, 128, 128});
  Tensor labels = randint(0, 1000, {1});
  auto resnet_buckets = measure(resnet, [&](nn::Module& m) { return nn::functional::cross_entropy(m.forward(images), labels); }, group);

  auto bert = std::make_shared<models::BertForPreTraining>(models::BertConfig::named("base"));
  Tensor ids = randint(1000, 30000, {1, 32}, {.dtype = kInt64});
  Tensor next_sentence = randint(0, 2, {1});
  auto bert_buckets = measure(bert, [&](nn::Module&) {
    models::BertOutputs out = bert->forward(ids, Tensor(), Tensor());  // masked-LM + next-sentence, as pretraining
    return nn::functional::cross_entropy(out.prediction_logits.reshape({-1, 30522}), ids.reshape({-1})) +
           nn::functional::cross_entropy(out.seq_relationship_logits, next_sentence);
  }, group);

  const char* source = "given";
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
  }
  const Link links[] = {{"100 Gb/s", 100}, {"400 Gb/s", 400}};
  struct Model {
    const char* name;
    const std::vector<BucketTiming>* buckets;
    double fwd, bwd;
  };
  const Model model_list[] = {{"ResNet-50", &resnet_buckets, resnet_fwd, resnet_bwd},
                              {"BERT-base", &bert_buckets, bert_fwd, bert_bwd}};
  for (const Model& m : model_list) {
    double total = 0;
    for (const auto& b : *m.buckets) total += b.bytes;
    std::printf("\n%s: %zu buckets, %.1f MiB of gradients; GPU forward %.1f ms, backward %.1f ms (%s)\n", m.name,
                m.buckets->size(), total / 1048576.0, m.fwd, m.bwd, source);
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
  distributed::destroy_process_group();
  return 0;
}
