// Per-step training time (forward, backward, SGD-momentum step) of chorus against libtorch 1.13
// (Debian libtorch-dev, PyTorch's C++ API) on the same models, in the same run, with the same
// thread count: (a) an MLP 784-512-256-10 at batch 128; (b) a small ResNet (3x3 stem 3->32 + BN +
// ReLU; basic residual blocks at 32, 64 (stride 2) and 128 (stride 2) channels with 1x1 projection
// shortcuts; global average pooling; linear to 10) at batch 32 of 3x32x32. Median of the timed
// steps after warm-up, chorus's and libtorch's steps in alternation; prints the median of the
// per-round ratios chorus / libtorch (below 1: chorus is faster; bench::paired_median_times). Then the
// models of examples/: (c) ResNet-18 (torchvision's, 1000 classes) at batch 16 of 3x64x64; (d)
// BERT-mini masked-LM at batch 8 of 128 tokens with AdamW.
//
//   bazel run -c opt //tests/bench:train_step_bench -- [--steps 20] [--warmup 5]
//   ... -- --channels-last: ResNet-18 in NCHW and channels-last, chorus and libtorch (only that table)
//   ... -- --check: ResNet-18 batch 8 and BERT-mini batch 8 at 1 thread only (tools/bench_check.sh)
//   ... -- --fused-attention-ab: chorus's BERT steps with the fused CPU attention against the composite
//   ... -- --resnet-only: the ResNet-18 rows only (batch 8, 16, 32 at 1 and 2 threads); with
//   CHORUS_ONEDNN_WINOGRAD=0 chorus's convolutions stay direct ([Winograd convolutions])
#include <torch/nn.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "examples/models/bert.h"
#include "examples/models/resnet.h"
#include "kernels/cpu/capability.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/libtorch_peer.h"

namespace cn = chorus::nn;
namespace CF = chorus::nn::functional;
using chorus::bench::peer_threads;

// ------------------------------------------------------------------ chorus models
struct ChorusBlock : cn::Module {
  std::shared_ptr<cn::Conv2d> conv1, conv2, proj;
  std::shared_ptr<cn::BatchNorm2d> bn1, bn2, proj_bn;
  ChorusBlock(int64_t in, int64_t out, int64_t stride) : cn::Module("BasicBlock") {
    conv1 = register_module("conv1", std::make_shared<cn::Conv2d>(cn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", std::make_shared<cn::BatchNorm2d>(out));
    conv2 = register_module("conv2", std::make_shared<cn::Conv2d>(cn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", std::make_shared<cn::BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      proj = register_module("proj", std::make_shared<cn::Conv2d>(cn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      proj_bn = register_module("proj_bn", std::make_shared<cn::BatchNorm2d>(out));
    }
  }
  chorus::Tensor forward(const chorus::Tensor& x) override {
    chorus::Tensor h = CF::relu(bn1->forward(conv1->forward(x)));
    h = bn2->forward(conv2->forward(h));
    chorus::Tensor s = proj ? proj_bn->forward(proj->forward(x)) : x;
    return CF::relu(h + s);
  }
};

std::shared_ptr<cn::Sequential> chorus_resnet() {
  auto net = std::make_shared<cn::Sequential>();
  net->push_back(std::make_shared<cn::Conv2d>(cn::Conv2dOptions(3, 32, 3).padding(1).bias(false)));
  net->push_back(std::make_shared<cn::BatchNorm2d>(32));
  net->push_back(std::make_shared<cn::ReLU>());
  net->push_back(std::make_shared<ChorusBlock>(32, 32, 1));
  net->push_back(std::make_shared<ChorusBlock>(32, 64, 2));
  net->push_back(std::make_shared<ChorusBlock>(64, 128, 2));
  net->push_back(std::make_shared<cn::AdaptiveAvgPool2d>(1));
  net->push_back(std::make_shared<cn::Flatten>());
  net->push_back(std::make_shared<cn::Linear>(128, 10));
  return net;
}

std::shared_ptr<cn::Sequential> chorus_mlp() {
  auto net = std::make_shared<cn::Sequential>();
  net->push_back(std::make_shared<cn::Linear>(784, 512));
  net->push_back(std::make_shared<cn::ReLU>());
  net->push_back(std::make_shared<cn::Linear>(512, 256));
  net->push_back(std::make_shared<cn::ReLU>());
  net->push_back(std::make_shared<cn::Linear>(256, 10));
  return net;
}

// ------------------------------------------------------------------ libtorch models
struct TorchBlockImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, proj{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, proj_bn{nullptr};
  TorchBlockImpl(int64_t in, int64_t out, int64_t stride) {
    namespace tn = torch::nn;
    conv1 = register_module("conv1", tn::Conv2d(tn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", tn::BatchNorm2d(out));
    conv2 = register_module("conv2", tn::Conv2d(tn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", tn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      proj = register_module("proj", tn::Conv2d(tn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      proj_bn = register_module("proj_bn", tn::BatchNorm2d(out));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn1->forward(conv1->forward(x)));
    h = bn2->forward(conv2->forward(h));
    torch::Tensor s = proj ? proj_bn->forward(proj->forward(x)) : x;
    return torch::relu(h + s);
  }
};
TORCH_MODULE(TorchBlock);

torch::nn::Sequential torch_resnet() {
  namespace tn = torch::nn;
  return tn::Sequential(tn::Conv2d(tn::Conv2dOptions(3, 32, 3).padding(1).bias(false)), tn::BatchNorm2d(32), tn::ReLU(),
                        TorchBlock(32, 32, 1), TorchBlock(32, 64, 2), TorchBlock(64, 128, 2),
                        tn::AdaptiveAvgPool2d(tn::AdaptiveAvgPool2dOptions({1, 1})), tn::Flatten(), tn::Linear(128, 10));
}

torch::nn::Sequential torch_mlp() {
  namespace tn = torch::nn;
  return tn::Sequential(tn::Linear(784, 512), tn::ReLU(), tn::Linear(512, 256), tn::ReLU(), tn::Linear(256, 10));
}

torch::nn::Sequential torch_resnet18() {
  namespace tn = torch::nn;
  tn::Sequential net(tn::Conv2d(tn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)), tn::BatchNorm2d(64),
                     tn::ReLU(), tn::MaxPool2d(tn::MaxPool2dOptions(3).stride(2).padding(1)));
  int64_t in = 64;
  for (int64_t planes : {64, 128, 256, 512}) {
    net->push_back(TorchBlock(in, planes, planes == 64 ? 1 : 2));
    net->push_back(TorchBlock(planes, planes, 1));
    in = planes;
  }
  net->push_back(tn::AdaptiveAvgPool2d(tn::AdaptiveAvgPool2dOptions({1, 1})));
  net->push_back(tn::Flatten());
  net->push_back(tn::Linear(512, 1000));
  return net;
}

// BERT-mini for masked-LM pretraining in libtorch, as examples/models/bert.h: post-norm layers, erf
// GELU, LayerNorm eps 1e-12, dropout 0.1, tied decoder; the head runs on the masked positions only
// (chorus's masked_lm_loss does the same), so both sides do the same arithmetic.
struct TorchBertLayerImpl : torch::nn::Module {
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr}, up{nullptr}, down{nullptr};
  torch::nn::LayerNorm n1{nullptr}, n2{nullptr};
  int64_t heads;
  TorchBertLayerImpl(int64_t h, int64_t heads_) : heads(heads_) {
    namespace tn = torch::nn;
    q = register_module("q", tn::Linear(h, h));
    k = register_module("k", tn::Linear(h, h));
    v = register_module("v", tn::Linear(h, h));
    o = register_module("o", tn::Linear(h, h));
    up = register_module("up", tn::Linear(h, 4 * h));
    down = register_module("down", tn::Linear(4 * h, h));
    n1 = register_module("n1", tn::LayerNorm(tn::LayerNormOptions({h}).eps(1e-12)));
    n2 = register_module("n2", tn::LayerNorm(tn::LayerNormOptions({h}).eps(1e-12)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    namespace tf = torch::nn::functional;
    const int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = h / heads;
    auto split = [&](const torch::Tensor& y) { return y.view({b, t, heads, d}).transpose(1, 2); };
    torch::Tensor scores = torch::matmul(split(q(x)), split(k(x)).transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
    torch::Tensor probs = tf::dropout(scores.softmax(-1), tf::DropoutFuncOptions().p(0.1).training(is_training()));
    torch::Tensor ctx = torch::matmul(probs, split(v(x))).transpose(1, 2).reshape({b, t, h});
    torch::Tensor a = n1(x + tf::dropout(o(ctx), tf::DropoutFuncOptions().p(0.1).training(is_training())));
    torch::Tensor f = down(torch::gelu(up(a)));
    return n2(a + tf::dropout(f, tf::DropoutFuncOptions().p(0.1).training(is_training())));
  }
};
TORCH_MODULE(TorchBertLayer);

struct TorchBertImpl : torch::nn::Module {
  torch::nn::Embedding word{nullptr}, pos{nullptr}, type{nullptr};
  torch::nn::LayerNorm emb_norm{nullptr}, head_norm{nullptr};
  torch::nn::ModuleList layers;
  torch::nn::Linear head{nullptr};
  torch::Tensor decoder_bias;
  TorchBertImpl(int64_t vocab, int64_t h, int64_t n_layers, int64_t heads) {
    namespace tn = torch::nn;
    word = register_module("word", tn::Embedding(vocab, h));
    pos = register_module("pos", tn::Embedding(512, h));
    type = register_module("type", tn::Embedding(2, h));
    emb_norm = register_module("emb_norm", tn::LayerNorm(tn::LayerNormOptions({h}).eps(1e-12)));
    layers = register_module("layers", tn::ModuleList());
    for (int64_t i = 0; i < n_layers; ++i) layers->push_back(TorchBertLayer(h, heads));
    head = register_module("head", tn::Linear(h, h));
    head_norm = register_module("head_norm", tn::LayerNorm(tn::LayerNormOptions({h}).eps(1e-12)));
    decoder_bias = register_parameter("decoder_bias", torch::zeros({vocab}));
    for (auto& p : parameters()) {
      if (p.dim() == 2) torch::nn::init::normal_(p, 0.0, 0.02);
    }
  }
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& targets) {
    namespace tf = torch::nn::functional;
    const int64_t t = ids.size(1);
    torch::Tensor x = word(ids) + pos(torch::arange(t)).unsqueeze(0) + type(torch::zeros_like(ids));
    x = tf::dropout(emb_norm(x), tf::DropoutFuncOptions().p(0.1).training(is_training()));
    for (auto& layer : *layers) x = layer->as<TorchBertLayer>()->forward(x);
    torch::Tensor picked = x.reshape({-1, x.size(2)}).index_select(0, positions);
    torch::Tensor z = head_norm(torch::gelu(head(picked)));
    return tf::cross_entropy(torch::matmul(z, word->weight.t()) + decoder_bias, targets);
  }
};
TORCH_MODULE(TorchBert);

// ------------------------------------------------------------------ timing
// The issue-6 models: ResNet-18 (torchvision's, 1000 classes) at batch 8, 16 and 32 of 3x64x64 with
// SGD momentum, and BERT masked-LM (128 tokens, 14% predicted) with AdamW: mini at batch 8 and 16,
// small (4 layers, hidden 512) at batch 8.
void resnet18_step(int64_t batch, int threads, int steps, int warmup) {
  chorus::manual_seed(1);
  auto cmodel = chorus::models::resnet18();
  chorus::optim::SGD copt(cmodel->parameters(), {.lr = 0.01, .momentum = 0.9});
  chorus::Tensor cx = chorus::randn({batch, 3, 64, 64});
  chorus::Tensor cy = chorus::randint(0, 1000, {batch});
  torch::manual_seed(1);
  torch::nn::Sequential tmodel = torch_resnet18();
  torch::optim::SGD topt(tmodel->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::Tensor tx = torch::randn({batch, 3, 64, 64});
  torch::Tensor ty = torch::randint(0, 1000, {batch}, torch::kLong);
  const chorus::bench::PairedTimes t = chorus::bench::paired_median_times(
      [&] {
        copt.zero_grad();
        CF::cross_entropy(cmodel->forward(cx), cy).backward();
        copt.step();
      },
      [&] {
        topt.zero_grad();
        torch::nn::functional::cross_entropy(tmodel->forward(tx), ty).backward();
        topt.step();
      },
      warmup, steps);
  std::printf("| ResNet-18, batch %lld x 3x64x64 | %d | %.2f | %.2f | %.2f |\n", static_cast<long long>(batch), threads,
              t.a * 1e3, t.b * 1e3, t.ratio);
  std::fflush(stdout);
}

void bert_step(const std::string& size, int64_t b, int threads, int steps, int warmup) {
  // The same token ids and masked positions for both.
  const int64_t t = 128, vocab = 30522;
  chorus::manual_seed(2);
  chorus::Tensor ids = chorus::randint(999, vocab, {b, t});
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < b * t; ++i) {
    if (i % 7 == 3) positions.push_back(i);  // 14% of the tokens
  }
  chorus::Tensor labels = chorus::full({b, t}, int64_t{-100}, chorus::TensorOptions{.dtype = chorus::kInt64});
  for (int64_t i : positions) labels.reshape({-1})[i].fill_(ids.reshape({-1})[i].item<int64_t>());
  const chorus::models::BertConfig config = chorus::models::BertConfig::named(size);
  chorus::models::BertForPreTraining cmodel(config);
  chorus::optim::AdamW copt(cmodel.parameters());
  torch::manual_seed(2);
  torch::Tensor tids = torch::from_blob(ids.data_ptr<int64_t>(), {b, t}, torch::kLong).clone();
  torch::Tensor tpos = torch::tensor(positions, torch::kLong);
  torch::Tensor ttargets = tids.reshape({-1}).index_select(0, tpos);
  TorchBert tmodel(vocab, config.hidden_size, config.num_hidden_layers, config.num_attention_heads);
  torch::optim::AdamW topt(tmodel->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  const chorus::bench::PairedTimes tp = chorus::bench::paired_median_times(
      [&] {
        copt.zero_grad();
        cmodel.masked_lm_loss(ids, chorus::Tensor(), labels).backward();
        copt.step();
      },
      [&] {
        topt.zero_grad();
        tmodel->loss(tids, tpos, ttargets).backward();
        topt.step();
      },
      warmup, steps);
  std::printf("| BERT-%s masked LM, batch %lld x 128 tokens | %d | %.2f | %.2f | %.2f |\n", size.c_str(),
              static_cast<long long>(b), threads, tp.a * 1e3, tp.b * 1e3, tp.ratio);
  std::fflush(stdout);
}

// --fused-attention-ab: chorus's BERT-mini and BERT-small steps (batch 8, 1 and 2 threads) with the
// fused CPU attention ([Fused CPU attention], nn/functional/attention.cpp) against the same model
// with the composite (CHORUS_FUSED_ATTENTION=0, read at each call), in alternation: one model, one
// process, so the ratio is the fusion's alone.
void fused_attention_ab(int steps, int warmup) {
  std::printf("| model | threads | fused ms | composite ms | fused / composite |\n|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    chorus::set_num_threads(threads);
    for (const char* size : {"mini", "small"}) {
      const int64_t b = 8, t = 128, vocab = 30522;
      chorus::manual_seed(2);
      chorus::Tensor ids = chorus::randint(999, vocab, {b, t});
      chorus::Tensor labels = chorus::full({b, t}, int64_t{-100}, chorus::TensorOptions{.dtype = chorus::kInt64});
      for (int64_t i = 3; i < b * t; i += 7) labels.reshape({-1})[i].fill_(ids.reshape({-1})[i].item<int64_t>());
      chorus::models::BertForPreTraining model(chorus::models::BertConfig::named(size));
      chorus::optim::AdamW opt(model.parameters());
      auto step = [&](const char* fused) {
        setenv("CHORUS_FUSED_ATTENTION", fused, 1);
        opt.zero_grad();
        model.masked_lm_loss(ids, chorus::Tensor(), labels).backward();
        opt.step();
      };
      const chorus::bench::PairedTimes tp =
          chorus::bench::paired_median_times([&] { step("1"); }, [&] { step("0"); }, warmup, steps);
      std::printf("| BERT-%s masked LM, batch 8 x 128 tokens | %d | %.2f | %.2f | %.3f |\n", size, threads, tp.a * 1e3,
                  tp.b * 1e3, tp.ratio);
      std::fflush(stdout);
    }
  }
  unsetenv("CHORUS_FUSED_ATTENTION");
}

// --channels-last: ResNet-18 (torchvision's, 1000 classes) training steps at batch 16 of 3x64x64 in
// NCHW and in channels-last (model and images), chorus beside libtorch, at 1 and 2 threads.
void resnet18_layouts(int steps, int warmup) {
  std::printf("| ResNet-18, batch 16 x 3x64x64 | threads | chorus NCHW ms | chorus channels-last ms | libtorch NCHW ms "
              "| libtorch channels-last ms | chorus CL / libtorch CL |\n|---|---|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    chorus::set_num_threads(threads);
    peer_threads(threads);
    double tc[2], tt[2];
    for (int cl = 0; cl < 2; ++cl) {
      chorus::manual_seed(1);
      auto cmodel = chorus::models::resnet18();
      chorus::Tensor cx = chorus::randn({16, 3, 64, 64});
      if (cl) {
        cmodel->to(chorus::MemoryFormat::ChannelsLast);
        cx = cx.contiguous(chorus::MemoryFormat::ChannelsLast);
      }
      chorus::optim::SGD copt(cmodel->parameters(), {.lr = 0.01, .momentum = 0.9});
      chorus::Tensor cy = chorus::randint(0, 1000, {16});
      tc[cl] = chorus::bench::median_time(
          [&] {
            copt.zero_grad();
            CF::cross_entropy(cmodel->forward(cx), cy).backward();
            copt.step();
          },
          warmup, steps);
      torch::manual_seed(1);
      torch::nn::Sequential tmodel = torch_resnet18();
      torch::Tensor tx = torch::randn({16, 3, 64, 64});
      if (cl) {
        tmodel->to(torch::kCPU, torch::kFloat32);
        for (auto& p : tmodel->parameters()) {
          if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
        }
        tx = tx.contiguous(torch::MemoryFormat::ChannelsLast);
      }
      torch::optim::SGD topt(tmodel->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
      torch::Tensor ty = torch::randint(0, 1000, {16}, torch::kLong);
      tt[cl] = chorus::bench::median_time(
          [&] {
            topt.zero_grad();
            torch::nn::functional::cross_entropy(tmodel->forward(tx), ty).backward();
            topt.step();
          },
          warmup, steps);
    }
    std::printf("| ResNet-18, batch 16 x 3x64x64 | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", threads, tc[0] * 1e3,
                tc[1] * 1e3, tt[0] * 1e3, tt[1] * 1e3, tc[1] / tt[1]);
    std::fflush(stdout);
  }
}

// --only mlp|small-resnet|resnet18|bert: the table's rows of one model (empty: every row).
std::string g_only;
bool wanted(const char* model) { return g_only.empty() || g_only == model; }

void models_step(int steps, int warmup) {
  for (int threads : {1, 2}) {
    chorus::set_num_threads(threads);
    peer_threads(threads);
    if (wanted("resnet18"))
      for (int64_t batch : {8, 16, 32}) resnet18_step(batch, threads, steps, warmup);
    if (!wanted("bert")) continue;
    bert_step("mini", 8, threads, steps, warmup);
    bert_step("mini", 16, threads, steps, warmup);
    bert_step("small", 8, threads, steps, warmup);
  }
}

struct Case {
  const char* name;
  bool resnet;
  int64_t batch;
};

// --profile bert|resnet18 [--steps N] [--threads T]: chorus's step alone, N times at T threads (1
// by default), then the last loss and a parameter checksum (two runs must agree bit for bit);
// torch-bert|torch-resnet18: libtorch's step alone (peak memory: /usr/bin/time -v); for perf record
// (docs/benchmarks.md's profiles): `perf record -g bazel-bin/tests/bench/train_step_bench --profile bert`.
// The last step's loss and a checksum of every parameter, printed with all digits: two runs at one
// thread count must print the same (results are bit-identical across runs).
int report(double loss, const std::vector<chorus::Tensor>& params) {
  // Summed in place in double, in order: no temporaries, so the peak memory measured around a
  // --profile run is the training's (a float64 copy of every parameter would add its own).
  double sum = 0, abs_sum = 0;
  for (const chorus::Tensor& p : params) {
    const chorus::Tensor c = p.detach().contiguous();
    const float* d = c.data_ptr<float>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      sum += d[i];
      abs_sum += std::fabs(static_cast<double>(d[i]));
    }
  }
  std::printf("last loss %.17g, parameter sum %.17g, |parameter| sum %.17g\n", loss, sum, abs_sum);
  return 0;
}

int profile(const std::string& which, int steps, int threads) {
  chorus::set_num_threads(threads);
  chorus::manual_seed(1);
  // SGD-momentum classifiers: ResNet-18 (1000 classes, batch 16 of 3x64x64), the small ResNet
  // (batch 32 of 3x32x32) and the MLP (batch 128 of 784), as in the timed tables.
  auto sgd_profile = [&](const std::shared_ptr<chorus::nn::Module>& model, const chorus::Tensor& x,
                         const chorus::Tensor& y) {
    chorus::optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
    double last = 0;
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      chorus::Tensor loss = CF::cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();
      last = loss.item<double>();
    }
    return report(last, model->parameters());
  };
  if (which == "resnet18" || which == "resnet18-channels-last") {
    auto model = chorus::models::resnet18();
    chorus::Tensor x = chorus::randn({16, 3, 64, 64}), y = chorus::randint(0, 1000, {16});
    if (which == "resnet18-channels-last") {
      model->to(chorus::MemoryFormat::ChannelsLast);
      x = x.contiguous(chorus::MemoryFormat::ChannelsLast);
    }
    return sgd_profile(model, x, y);
  }
  if (which == "small-resnet") {
    auto model = chorus_resnet();
    chorus::Tensor x = chorus::randn({32, 3, 32, 32}), y = chorus::randint(0, 10, {32});
    return sgd_profile(model, x, y);
  }
  if (which == "mlp") {
    auto model = chorus_mlp();
    chorus::Tensor x = chorus::randn({128, 784}), y = chorus::randint(0, 10, {128});
    return sgd_profile(model, x, y);
  }
  if (which == "torch-small-resnet" || which == "torch-mlp") {
    const bool resnet = which == "torch-small-resnet";
    peer_threads(threads);
    torch::manual_seed(1);
    torch::nn::Sequential model = resnet ? torch_resnet() : torch_mlp();
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    torch::Tensor x = resnet ? torch::randn({32, 3, 32, 32}) : torch::randn({128, 784});
    torch::Tensor y = torch::randint(0, 10, {resnet ? 32 : 128}, torch::kLong);
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      opt.step();
    }
    return 0;
  }
  if (which == "bert") {
    const int64_t b = 8, t = 128, vocab = 30522;
    chorus::Tensor ids = chorus::randint(999, vocab, {b, t});
    chorus::Tensor labels = chorus::full({b, t}, int64_t{-100}, chorus::TensorOptions{.dtype = chorus::kInt64});
    for (int64_t i = 3; i < b * t; i += 7) labels.reshape({-1})[i].fill_(ids.reshape({-1})[i].item<int64_t>());
    chorus::models::BertForPreTraining model(chorus::models::BertConfig::named("mini"));
    chorus::optim::AdamW opt(model.parameters());
    double last = 0;
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      chorus::Tensor loss = model.masked_lm_loss(ids, chorus::Tensor(), labels);
      loss.backward();
      opt.step();
      last = loss.item<double>();
    }
    return report(last, model.parameters());
  }
  // libtorch's side alone (for its peak memory under /usr/bin/time -v).
  if (which == "torch-resnet18") {
    peer_threads(threads);
    torch::manual_seed(1);
    torch::nn::Sequential model = torch_resnet18();
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    torch::Tensor x = torch::randn({16, 3, 64, 64}), y = torch::randint(0, 1000, {16}, torch::kLong);
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      opt.step();
    }
    return 0;
  }
  if (which == "torch-bert") {
    peer_threads(threads);
    torch::manual_seed(2);
    const int64_t b = 8, t = 128, vocab = 30522;
    torch::Tensor ids = torch::randint(999, vocab, {b, t}, torch::kLong);
    std::vector<int64_t> positions;
    for (int64_t i = 3; i < b * t; i += 7) positions.push_back(i);
    torch::Tensor pos = torch::tensor(positions, torch::kLong), targets = ids.reshape({-1}).index_select(0, pos);
    TorchBert model(vocab, 256, 4, 4);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      model->loss(ids, pos, targets).backward();
      opt.step();
    }
    return 0;
  }
  std::fprintf(stderr, "train_step_bench --profile: expected bert, resnet18, resnet18-channels-last, small-resnet, mlp or torch-<one of them>, got '%s'\n",
               which.c_str());
  return 2;
}

int usage(const char* bad) {
  if (bad != nullptr) std::fprintf(stderr, "train_step_bench: unknown or incomplete argument '%s'\n", bad);
  std::fprintf(bad ? stderr : stdout,
               "usage: train_step_bench [--steps N] [--warmup N] [--threads T] [--cpu-loops avx2|avx512]\n"
               "                        [--profile MODEL | --channels-last | --check | --resnet-only |\n"
               "                         --fused-attention-ab |\n"
               "                         --only mlp|small-resnet|resnet18|bert]\n");
  return bad ? 2 : 0;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return usage(nullptr);
    const bool takes_value = a == "--steps" || a == "--warmup" || a == "--threads" || a == "--cpu-loops" ||
                             a == "--profile" || a == "--only";
    if (takes_value && i + 1 < argc) {
      ++i;
      continue;
    }
    if (a != "--channels-last" && a != "--check" && a != "--resnet-only" && a != "--fused-attention-ab") {
      return usage(argv[i]);
    }
  }
  int steps = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
  }
  int threads = 1;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  // --cpu-loops avx2|avx512: the variant of chorus's own vector loops only (kernels/cpu/capability.h),
  // leaving oneDNN uncapped. (CHORUS_CPU_CAPABILITY caps oneDNN too, and libtorch here loads the same
  // libdnnl, so it would cap libtorch's convolutions as well.)
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--cpu-loops")) {
      const std::string v = argv[i + 1];
      if (v != "avx2" && v != "avx512") {
        std::fprintf(stderr, "train_step_bench --cpu-loops: expected avx2 or avx512, got '%s'\n", v.c_str());
        return 2;
      }
      chorus::kernels::cpu::set_cpu_capability(v == "avx512" ? chorus::kernels::cpu::CpuCapability::kAvx512
                                                             : chorus::kernels::cpu::CpuCapability::kAvx2);
    }
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--profile")) return profile(argv[i + 1], steps, threads);
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--only")) {
      g_only = argv[i + 1];
      if (g_only != "mlp" && g_only != "small-resnet" && g_only != "resnet18" && g_only != "bert") {
        std::fprintf(stderr, "train_step_bench --only: expected mlp, small-resnet, resnet18 or bert, got '%s'\n",
                     g_only.c_str());
        return 2;
      }
    }
  peer_threads(1);  // says which BLAS libtorch runs (and warns of a capped one) before any table
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--channels-last")) {
      resnet18_layouts(steps, warmup);
      return 0;
    }
    if (!std::strcmp(argv[i], "--fused-attention-ab")) {
      fused_attention_ab(steps, warmup);
      return 0;
    }
    // --check: the two rows tools/bench_check.sh compares with docs/benchmarks.md (1 thread).
    if (!std::strcmp(argv[i], "--resnet-only")) {
      for (int th : {1, 2}) {
        chorus::set_num_threads(th);
        peer_threads(th);
        for (int b : {8, 16, 32}) resnet18_step(b, th, steps, warmup);
      }
      return 0;
    }
    if (!std::strcmp(argv[i], "--check")) {
      chorus::set_num_threads(1);
      peer_threads(1);
      std::printf("| model | threads | chorus ms | libtorch ms | chorus / libtorch |\n|---|---|---|---|---|\n");
      resnet18_step(8, 1, steps, warmup);
      bert_step("mini", 8, 1, steps, warmup);
      return 0;
    }
  }
  const Case cases[] = {{"MLP 784-512-256-10, batch 128", false, 128}, {"small ResNet, batch 32 x 3x32x32", true, 32}};
  std::printf("Training step (forward + backward + SGD momentum; BERT: AdamW), chorus and libtorch in alternation "
              "(bench::paired_median_times): median of %d steps each after at least %d warm-up steps and %.0f s; the "
              "ratio is the median over pairs of rounds (one in each order) of chorus's time / libtorch's\n\n",
              steps + steps % 2, warmup, chorus::bench::kMinWarmupS);
  std::printf("| model | threads | chorus ms | libtorch ms | chorus / libtorch |\n|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    if (!wanted(c.resnet ? "small-resnet" : "mlp")) continue;
    for (int threads : {1, 2}) {
      chorus::set_num_threads(threads);
      peer_threads(threads);
      // chorus
      chorus::manual_seed(1);
      auto cmodel = c.resnet ? chorus_resnet() : chorus_mlp();
      chorus::optim::SGD copt(cmodel->parameters(), {.lr = 0.01, .momentum = 0.9});
      chorus::Tensor cx = c.resnet ? chorus::randn({c.batch, 3, 32, 32}) : chorus::randn({c.batch, 784});
      chorus::Tensor cy = chorus::randint(0, 10, {c.batch});
      // libtorch
      torch::manual_seed(1);
      torch::nn::Sequential tmodel = c.resnet ? torch_resnet() : torch_mlp();
      torch::optim::SGD topt(tmodel->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
      torch::Tensor tx = c.resnet ? torch::randn({c.batch, 3, 32, 32}) : torch::randn({c.batch, 784});
      torch::Tensor ty = torch::randint(0, 10, {c.batch}, torch::kLong);
      const chorus::bench::PairedTimes t = chorus::bench::paired_median_times(
          [&] {
            copt.zero_grad();
            CF::cross_entropy(cmodel->forward(cx), cy).backward();
            copt.step();
          },
          [&] {
            topt.zero_grad();
            torch::nn::functional::cross_entropy(tmodel->forward(tx), ty).backward();
            topt.step();
          },
          warmup, steps);
      std::printf("| %s | %d | %.2f | %.2f | %.2f |\n", c.name, threads, t.a * 1e3, t.b * 1e3, t.ratio);
      std::fflush(stdout);
    }
  }
  models_step(steps, warmup);
  return 0;
}
