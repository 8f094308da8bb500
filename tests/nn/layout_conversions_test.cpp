// The layout-conversion counter (kernels/layout_conversions.h), and what it finds in a channels-last
// ResNet-50 training step at ImageNet's shapes on the sim device: a training step of a channels-last
// model on channels-last input makes no copy that changes a tensor's memory format, in float32 and
// under bfloat16 autocast, exactly as PyTorch's own step (tools/torch_layout_conversions.py counts
// PyTorch's conversions at its dispatcher; the test runs it when python3-torch is there and compares).
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <cmath>
#include <string>

#include <sys/wait.h>

#include "autograd/autocast.h"
#include "examples/models/resnet.h"
#include "kernels/layout_conversions.h"
#include "nn/functional.h"
#include "nn/nn.h"
#include "optim/optimizer.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace F = nn::functional;
namespace lc = layout_conversions;
constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

TEST_CASE("the counter counts copies that change the memory format, and only those", "[layout_conversions]") {
  for (Device device : {Device::cpu(), Device::sim(0)}) {
    INFO("on " << device.str());
    Tensor x = randn({2, 3, 4, 5}).to(device);
    lc::reset();
    Tensor cl = x.contiguous(kCL);
    lc::Stats s = lc::stats();
    REQUIRE(s.count == 1);
    CHECK(s.bytes == 2 * 3 * 4 * 5 * 4);
    REQUIRE(s.kinds.size() == 1);
    CHECK(s.kinds[0].phase == "forward");
    CHECK(s.kinds[0].from == "contiguous");
    CHECK(s.kinds[0].to == "channels_last");
    CHECK(s.kinds[0].sizes == Shape{2, 3, 4, 5});
    CHECK(s.kinds[0].device == device);
    CHECK(s.str() == "1 x forward: float32 [2, 3, 4, 5] on " + device.str() + " contiguous -> channels_last\n");

    Tensor back = cl.contiguous();  // and back: a second kind
    Tensor again = x.contiguous(kCL);
    s = lc::stats();
    CHECK(s.count == 3);
    REQUIRE(s.kinds.size() == 2);
    CHECK(s.kinds[0].count == 2);
    CHECK(s.kinds[1].from == "channels_last");

    lc::reset();
    // Copies within one layout, into or from tensors dense in both layouts, casts that keep the
    // layout, 4-D views that are dense in neither: none of them is a conversion.
    Tensor same = cl.clone();
    Tensor nchw_copy = x.clone();
    Tensor both = randn({2, 3, 1, 1}).to(device);
    Tensor both_cl = both.contiguous(kCL);
    Tensor cast = cl.to(kFloat64);
    Tensor strided = x.transpose(2, 3).contiguous();
    CHECK(lc::stats().count == 0);
    CHECK(same.is_contiguous(kCL));
    CHECK(cast.is_contiguous(kCL));

    // A cast that also changes the layout is one.
    Tensor cast_back = empty({2, 3, 4, 5}, {.dtype = kFloat64, .device = device});
    cast_back.copy_(cl);
    CHECK(lc::stats().count == 1);
  }
}

TEST_CASE("a conversion in the backward pass is named by the node that made it", "[layout_conversions]") {
  Tensor x = randn({2, 3, 8, 8}).contiguous(kCL).requires_grad_();
  Tensor weight = randn({4, 3, 3, 3}).contiguous(kCL).requires_grad_();
  Tensor out = F::conv2d(x, weight);
  REQUIRE(out.is_contiguous(kCL));
  lc::reset();
  // out.contiguous() converts in the forward; its gradient arrives NCHW at the convolution's
  // backward, which computes channels-last and converts it (PyTorch's cuDNN convolution does too).
  sum(out.contiguous() * randn(out.sizes())).backward();
  const lc::Stats s = lc::stats();
  INFO(s.str());
  REQUIRE(s.count == 2);
  REQUIRE(s.kinds.size() == 2);
  CHECK(s.kinds[0].phase == "forward");
  CHECK(s.kinds[0].to == "contiguous");
  CHECK(s.kinds[1].phase == "ConvolutionBackward");
  CHECK(s.kinds[1].from == "contiguous");
  CHECK(s.kinds[1].to == "channels_last");
  CHECK(s.kinds[1].sizes == Shape{2, 4, 6, 6});
  CHECK(x.grad().is_contiguous(kCL));
  CHECK(weight.grad().is_contiguous(kCL));
}

// PyTorch's count for the same step, from tools/torch_layout_conversions.py: -1 when python3-torch
// or torchvision is not installed (the script exits 3); any other failure of the oracle fails the test.
int torch_conversions(const char* flags) {
  const std::string cmd =
      std::string("/usr/bin/python3 tools/torch_layout_conversions.py --count-only ") + flags + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 256> line{};
  std::string out, last;
  while (std::fgets(line.data(), line.size(), pipe)) {
    out += line.data();
    last = line.data();
  }
  const int status = pclose(pipe);
  INFO(cmd << " said:\n" << out);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3) return -1;
  REQUIRE(WEXITSTATUS(status) == 0);
  int count = -1;
  REQUIRE(std::sscanf(last.c_str(), "%d", &count) == 1);
  REQUIRE(count >= 0);
  return count;
}

// One SGD step of a channels-last ResNet-50 on a channels-last batch of 2 x 3 x 224 x 224 on sim:
// forward, loss, backward, optimizer step. Returns the conversions of the second step (the first
// makes the optimizer's momentum buffers).
lc::Stats resnet50_step_conversions(bool bf16, bool nchw_input) {
  manual_seed(5);
  const Device device = Device::sim(0);
  auto net = models::resnet50({.num_classes = 1000});
  net->to(device);
  net->to(kCL);
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  Tensor x = randn({2, 3, 224, 224}).to(device).contiguous(kCL), y = randint(0, 1000, {2}).to(device);
  lc::Stats second;
  for (int step = 0; step < 2; ++step) {
    lc::reset();
    opt.zero_grad();
    Tensor loss;
    {
      autocast::AutocastGuard amp(DeviceType::Sim, kBFloat16, bf16);
      loss = F::cross_entropy(net->forward(nchw_input ? x.contiguous() : x), y);
    }
    loss.backward();
    opt.step();
    second = lc::stats();
    REQUIRE(std::isfinite(loss.item<double>()));
  }
  return second;
}

TEST_CASE("a channels-last ResNet-50 training step at 224x224 makes no layout conversion, as PyTorch's",
          "[layout_conversions][resnet]") {
  const bool bf16 = GENERATE(false, true);
  INFO((bf16 ? "bfloat16 autocast" : "float32"));
  const lc::Stats s = resnet50_step_conversions(bf16, false);
  INFO(s.str());
  CHECK(s.count == 0);
  const int torch = torch_conversions(bf16 ? "--bf16" : "");
  if (torch < 0) {
    std::printf("CHORUS-SKIP: python3-torch/torchvision not found: PyTorch's count not compared\n");
  } else {
    CHECK(s.count == torch);
  }
}

TEST_CASE("an NCHW batch into the channels-last ResNet-50 is converted at the stem only",
          "[layout_conversions][resnet]") {
  // The control: the counter sees the conversion the step asks for (the batch made NCHW inside the
  // step) and the stem convolution's copy back to channels-last (a channels-last weight makes the
  // convolution channels-last, as in PyTorch; PyTorch's CPU convolution makes that copy inside
  // oneDNN, below its dispatcher, so the two counts are not compared here), and nothing after it:
  // every layer keeps the weights' layout.
  const lc::Stats s = resnet50_step_conversions(false, true);
  INFO(s.str());
  REQUIRE(s.count == 2);
  REQUIRE(s.kinds.size() == 2);
  CHECK(s.kinds[0].phase == "forward");
  CHECK(s.kinds[0].from == "channels_last");
  CHECK(s.kinds[1].from == "contiguous");
  for (const lc::Kind& k : s.kinds) CHECK(k.sizes == Shape{2, 3, 224, 224});
}

}  // namespace
}  // namespace chorus
