// ResNet-18/34/50: torchvision's parameter counts, state_dict names and shapes (so torchvision
// checkpoints load by name), torchvision's initialization, and a forward/backward step.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "examples/models/resnet.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

int64_t count_parameters(nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

std::map<std::string, Shape> shapes(nn::Module& m) {
  std::map<std::string, Shape> out;
  for (auto& [name, t] : m.state_dict()) out[name] = t.sizes();
  return out;
}

TEST_CASE("ResNet parameter counts and state_dict sizes equal torchvision's", "[models][resnet]") {
  auto r18 = models::resnet18(), r34 = models::resnet34(), r50 = models::resnet50();
  CHECK(count_parameters(*r18) == 11689512);
  CHECK(count_parameters(*r34) == 21797672);
  CHECK(count_parameters(*r50) == 25557032);
  CHECK(r18->state_dict().size() == 122u);  // 20 convs, 20 BNs x 5 entries, fc weight and bias
  CHECK(r50->state_dict().size() == 320u);  // 53 convs, 53 BNs x 5, fc
}

TEST_CASE("ResNet state_dict names and shapes follow torchvision", "[models][resnet]") {
  auto s18 = shapes(*models::resnet18());
  CHECK(s18.at("conv1.weight") == Shape{64, 3, 7, 7});
  CHECK(s18.at("bn1.running_mean") == Shape{64});
  CHECK(s18.at("bn1.num_batches_tracked") == Shape{});
  CHECK(s18.at("layer1.0.conv1.weight") == Shape{64, 64, 3, 3});
  CHECK(s18.at("layer1.1.bn2.bias") == Shape{64});
  CHECK(s18.count("layer1.0.downsample.0.weight") == 0);
  CHECK(s18.at("layer2.0.conv1.weight") == Shape{128, 64, 3, 3});
  CHECK(s18.at("layer2.0.downsample.0.weight") == Shape{128, 64, 1, 1});
  CHECK(s18.at("layer2.0.downsample.1.running_var") == Shape{128});
  CHECK(s18.at("layer4.1.conv2.weight") == Shape{512, 512, 3, 3});
  CHECK(s18.at("fc.weight") == Shape{1000, 512});
  auto s50 = shapes(*models::resnet50());
  CHECK(s50.at("layer1.0.conv1.weight") == Shape{64, 64, 1, 1});
  CHECK(s50.at("layer1.0.conv3.weight") == Shape{256, 64, 1, 1});
  CHECK(s50.at("layer1.0.downsample.0.weight") == Shape{256, 64, 1, 1});
  CHECK(s50.at("layer2.0.conv2.weight") == Shape{128, 128, 3, 3});  // v1.5: stride on the 3x3
  CHECK(s50.at("layer3.5.bn3.weight") == Shape{1024});
  CHECK(s50.at("fc.weight") == Shape{1000, 2048});
  auto small = shapes(*models::resnet18({.num_classes = 10, .in_channels = 1, .small_input = true}));
  CHECK(small.at("conv1.weight") == Shape{64, 1, 3, 3});
  CHECK(small.at("fc.bias") == Shape{10});
}

TEST_CASE("ResNet initialization is torchvision's", "[models][resnet]") {
  manual_seed(4);
  auto r = models::resnet18({.zero_init_residual = true});
  auto named = r->named_parameters();
  std::map<std::string, Tensor> p(named.begin(), named.end());
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out_channels * kH * kW)).
  const Tensor w = p.at("layer3.0.conv2.weight");
  const double want = std::sqrt(2.0 / (256 * 9));
  CHECK(chorus::std(w).item<float>() == Approx(want).epsilon(0.03));
  CHECK(std::abs(w.mean().item<float>()) < 0.1 * want);
  CHECK(p.at("layer3.0.bn1.weight").min().item<float>() == 1.0f);
  CHECK(p.at("layer3.0.bn1.bias").abs().max().item<float>() == 0.0f);
  CHECK(p.at("layer3.0.bn2.weight").abs().max().item<float>() == 0.0f);  // zero_init_residual
  const double bound = 1.0 / std::sqrt(512.0);                           // Linear's default
  CHECK(p.at("fc.weight").abs().max().item<float>() <= bound);
}

TEST_CASE("ResNet forward shapes and one training step", "[models][resnet]") {
  manual_seed(5);
  auto r18 = models::resnet18({.num_classes = 7});
  Tensor y = r18->forward(randn({2, 3, 64, 64}));
  CHECK(y.sizes() == Shape{2, 7});
  auto small = models::resnet18({.num_classes = 10, .in_channels = 1, .small_input = true});
  Tensor x = randn({4, 1, 28, 28});
  Tensor t = randint(0, 10, {4});
  Tensor loss = nn::functional::cross_entropy(small->forward(x), t);
  loss.backward();
  int64_t with_grad = 0;
  for (const Tensor& p : small->parameters()) with_grad += p.grad().defined();
  CHECK(with_grad == static_cast<int64_t>(small->parameters().size()));
  CHECK_THROWS_WITH(models::ResNet(false, {2, 2, 2}), Catch::Contains("4 stages"));
}

}  // namespace
}  // namespace chorus
