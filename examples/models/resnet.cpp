#include "examples/models/resnet.h"

#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "tensor/ops.h"

namespace chorus::models {
namespace {

namespace F = nn::functional;

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}
std::shared_ptr<nn::Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Sequential> ds)
    : nn::Module("BasicBlock") {
  conv1 = register_module("conv1", conv3x3(inplanes, planes, stride));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  if (ds) downsample = register_module("downsample", ds);
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = F::relu(bn1->forward(conv1->forward(x)));
  out = bn2->forward(conv2->forward(out));
  return F::relu(out + (downsample ? downsample->forward(x) : x));
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Sequential> ds)
    : nn::Module("Bottleneck") {
  // torchvision's v1.5: the stride sits on the 3x3 convolution.
  conv1 = register_module("conv1", conv1x1(inplanes, planes, 1));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, stride));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  conv3 = register_module("conv3", conv1x1(planes, planes * kExpansion, 1));
  bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(planes * kExpansion));
  if (ds) downsample = register_module("downsample", ds);
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = F::relu(bn1->forward(conv1->forward(x)));
  out = F::relu(bn2->forward(conv2->forward(out)));
  out = bn3->forward(conv3->forward(out));
  return F::relu(out + (downsample ? downsample->forward(x) : x));
}

ResNet::ResNet(bool bottleneck, std::vector<int64_t> layers, ResNetOptions o) : nn::Module("ResNet") {
  if (layers.size() != 4) fail("ResNet: expected 4 stages of blocks, got {}", layers.size());
  if (o.num_classes < 1 || o.in_channels < 1) {
    fail("ResNet: num_classes ({}) and in_channels ({}) must be positive", o.num_classes, o.in_channels);
  }
  if (o.small_input) {
    conv1 = register_module("conv1", conv3x3(o.in_channels, 64, 1));
  } else {
    conv1 = register_module(
        "conv1", std::make_shared<nn::Conv2d>(nn::Conv2dOptions(o.in_channels, 64, 7).stride(2).padding(3).bias(false)));
  }
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(64));
  if (o.stem_max_pool.value_or(!o.small_input)) maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2d>(nn::Pair{3, 3}, nn::Pair{2, 2}, nn::Pair{1, 1}));
  layer1 = register_module("layer1", make_layer(bottleneck, 64, layers[0], 1));
  layer2 = register_module("layer2", make_layer(bottleneck, 128, layers[1], 2));
  layer3 = register_module("layer3", make_layer(bottleneck, 256, layers[2], 2));
  layer4 = register_module("layer4", make_layer(bottleneck, 512, layers[3], 2));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<nn::Linear>(512 * (bottleneck ? Bottleneck::kExpansion : 1), o.num_classes));
  // torchvision's initialization.
  NoGradGuard no_grad;
  apply([&](nn::Module& m) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(&m)) nn::init::kaiming_normal_(conv->weight, 0.0, "fan_out", "relu");
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m)) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  });
  if (o.zero_init_residual) {
    apply([&](nn::Module& m) {
      if (auto* b = dynamic_cast<Bottleneck*>(&m)) nn::init::zeros_(b->bn3->weight);
      if (auto* b = dynamic_cast<BasicBlock*>(&m)) nn::init::zeros_(b->bn2->weight);
    });
  }
}

std::shared_ptr<nn::Sequential> ResNet::make_layer(bool bottleneck, int64_t planes, int64_t blocks, int64_t stride) {
  const int64_t expansion = bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;
  std::shared_ptr<nn::Sequential> ds;
  if (stride != 1 || inplanes_ != planes * expansion) {
    ds = std::make_shared<nn::Sequential>();
    ds->push_back(conv1x1(inplanes_, planes * expansion, stride));
    ds->push_back(std::make_shared<nn::BatchNorm2d>(planes * expansion));
  }
  auto layer = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t s = i == 0 ? stride : 1;
    auto d = i == 0 ? ds : nullptr;
    if (bottleneck) layer->push_back(std::make_shared<Bottleneck>(inplanes_, planes, s, d));
    else layer->push_back(std::make_shared<BasicBlock>(inplanes_, planes, s, d));
    inplanes_ = planes * expansion;
  }
  return layer;
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = F::relu(bn1->forward(conv1->forward(x)));
  if (maxpool) h = maxpool->forward(h);
  h = layer4->forward(layer3->forward(layer2->forward(layer1->forward(h))));
  return fc->forward(avgpool->forward(h).flatten(1));
}

distributed::pipeline::BlockModel ResNet::pipeline_blocks() {
  namespace pp = distributed::pipeline;
  pp::BlockModel m;
  m.model = shared_from_this();
  auto conv = conv1;
  auto bn = bn1;
  auto pool = maxpool;
  m.blocks.push_back({"stem", {"conv1", "bn1"}, [conv, bn, pool](const TensorList& in) {
                        Tensor h = F::relu(bn->forward(conv->forward(pp::single_input("stem", in))));
                        return TensorList{pool ? pool->forward(h) : h};
                      }});
  const std::pair<const char*, std::shared_ptr<nn::Sequential>> layers[] = {
      {"layer1", layer1}, {"layer2", layer2}, {"layer3", layer3}, {"layer4", layer4}};
  for (const auto& [name, layer] : layers) {
    const std::string block = name;
    auto l = layer;
    m.blocks.push_back({block, {block}, [l, block](const TensorList& in) {
                          return TensorList{l->forward(pp::single_input(block, in))};
                        }});
  }
  auto avg = avgpool;
  auto head = fc;
  m.blocks.push_back({"head", {"fc"}, [avg, head](const TensorList& in) {
                        return TensorList{head->forward(avg->forward(pp::single_input("head", in)).flatten(1))};
                      }});
  return m;
}

std::shared_ptr<ResNet> resnet18(ResNetOptions o) { return std::make_shared<ResNet>(false, std::vector<int64_t>{2, 2, 2, 2}, o); }
std::shared_ptr<ResNet> resnet34(ResNetOptions o) { return std::make_shared<ResNet>(false, std::vector<int64_t>{3, 4, 6, 3}, o); }
std::shared_ptr<ResNet> resnet50(ResNetOptions o) { return std::make_shared<ResNet>(true, std::vector<int64_t>{3, 4, 6, 3}, o); }

}  // namespace chorus::models
