// ResNet-18/34/50 with torchvision's architecture and parameter names (conv1, bn1, layer1.0.conv1,
// layer2.0.downsample.0, fc, ...), so a torchvision state_dict saved as safetensors loads into it
// without renaming. Initialization as torchvision: kaiming_normal_(fan_out, relu) for convolutions,
// BatchNorm weight 1 / bias 0, PyTorch's default for the final Linear.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "distributed/pipeline/blocks.h"
#include "nn/nn.h"

namespace chorus::models {

struct ResNetOptions {
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  // For 28x28 / 32x32 inputs (Fashion-MNIST, CIFAR): a 3x3 stride-1 stem and no max pooling. The
  // parameter names stay torchvision's; only conv1's shape changes.
  bool small_input = false;
  // The 3x3 stride-2 max pooling after the stem: by default there with the ImageNet stem and not with
  // small_input. small_input with max pooling (28 -> 14 at layer1) costs a quarter of the compute of
  // small_input alone; Fashion-MNIST training uses it (examples/resnet).
  std::optional<bool> stem_max_pool{};
  // Zero the last BatchNorm weight of each residual branch (torchvision's zero_init_residual).
  bool zero_init_residual = false;
};

class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Sequential> downsample);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Sequential> downsample;  // null when the shortcut is the identity
};

class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Sequential> downsample);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Sequential> downsample;
};

class ResNet : public nn::Module {
 public:
  // bottleneck selects Bottleneck blocks (ResNet-50); layers: blocks per stage.
  ResNet(bool bottleneck, std::vector<int64_t> layers, ResNetOptions options = {});
  Tensor forward(const Tensor& x) override;
  // The model as pipeline blocks (distributed/pipeline/blocks.h), one tensor each: "stem" (conv1,
  // bn1, ReLU, max pooling), "layer1" ... "layer4", "head" (average pooling, fc). The same
  // computation as forward(); the model must be held by a shared_ptr.
  distributed::pipeline::BlockModel pipeline_blocks();

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::MaxPool2d> maxpool;  // null without stem max pooling
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;

 private:
  std::shared_ptr<nn::Sequential> make_layer(bool bottleneck, int64_t planes, int64_t blocks, int64_t stride);
  int64_t inplanes_ = 64;
};

std::shared_ptr<ResNet> resnet18(ResNetOptions options = {});
std::shared_ptr<ResNet> resnet34(ResNetOptions options = {});
std::shared_ptr<ResNet> resnet50(ResNetOptions options = {});

}  // namespace chorus::models
