// Per-step training time (forward, backward, SGD-momentum step) of chorus against libtorch 1.13
// (Debian libtorch-dev, PyTorch's C++ API) on the same models, in the same run, with the same
// thread count: (a) an MLP 784-512-256-10 at batch 128; (b) a small ResNet (3x3 stem 3->32 + BN +
// ReLU; basic residual blocks at 32, 64 (stride 2) and 128 (stride 2) channels with 1x1 projection
// shortcuts; global average pooling; linear to 10) at batch 32 of 3x32x32. Median of the timed
// steps after warm-up; prints the ratio chorus / libtorch (below 1: chorus is faster).
//
//   bazel run -c opt //tests/bench:train_step_bench -- [--steps 20] [--warmup 5]
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"

namespace cn = chorus::nn;
namespace CF = chorus::nn::functional;

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

// ------------------------------------------------------------------ timing
struct Case {
  const char* name;
  bool resnet;
  int64_t batch;
};

int main(int argc, char** argv) {
  int steps = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
  }
  const Case cases[] = {{"MLP 784-512-256-10, batch 128", false, 128}, {"small ResNet, batch 32 x 3x32x32", true, 32}};
  std::printf("Training step (forward + backward + SGD momentum), median of %d steps after %d warm-up steps\n\n", steps,
              warmup);
  std::printf("| model | threads | chorus ms | libtorch ms | chorus / libtorch |\n|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    for (int threads : {1, 2}) {
      chorus::set_num_threads(threads);
      torch::set_num_threads(threads);
      // chorus
      chorus::manual_seed(1);
      auto cmodel = c.resnet ? chorus_resnet() : chorus_mlp();
      chorus::optim::SGD copt(cmodel->parameters(), {.lr = 0.01, .momentum = 0.9});
      chorus::Tensor cx = c.resnet ? chorus::randn({c.batch, 3, 32, 32}) : chorus::randn({c.batch, 784});
      chorus::Tensor cy = chorus::randint(0, 10, {c.batch});
      const double tc = chorus::bench::median_time(
          [&] {
            copt.zero_grad();
            CF::cross_entropy(cmodel->forward(cx), cy).backward();
            copt.step();
          },
          warmup, steps);
      // libtorch
      torch::manual_seed(1);
      torch::nn::Sequential tmodel = c.resnet ? torch_resnet() : torch_mlp();
      torch::optim::SGD topt(tmodel->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
      torch::Tensor tx = c.resnet ? torch::randn({c.batch, 3, 32, 32}) : torch::randn({c.batch, 784});
      torch::Tensor ty = torch::randint(0, 10, {c.batch}, torch::kLong);
      const double tt = chorus::bench::median_time(
          [&] {
            topt.zero_grad();
            torch::nn::functional::cross_entropy(tmodel->forward(tx), ty).backward();
            topt.step();
          },
          warmup, steps);
      std::printf("| %s | %d | %.2f | %.2f | %.2f |\n", c.name, threads, tc * 1e3, tt * 1e3, tc / tt);
      std::fflush(stdout);
    }
  }
  return 0;
}
