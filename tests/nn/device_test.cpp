// Training on the sim device equals training on the CPU: an MLP (Linear, GELU, LayerNorm, Dropout;
// Adam) and a small CNN (Conv2d, BatchNorm2d, ReLU, max and adaptive pooling; SGD with Nesterov
// momentum and weight decay) run 20 steps from the same weights on the same batches, on sim:0
// (every kernel on a sim stream, device memory the host cannot read, random delays before every
// task) and on the CPU. Also: Module::to, checkpoints saved from and loaded to either device,
// optimizer state moving with its parameters, and the errors for mixed devices and missing CUDA.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>

#include "kernels/dispatch.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tensor/cuda.h"
#include "tensor/runtime.h"
#include "tensor/sim/sim.h"
#include "tests/distributed/worker_checks.h"

namespace chorus {
namespace {

namespace F = nn::functional;
const Device kSim = Device::sim(0);

std::shared_ptr<nn::Sequential> make_mlp(DType dtype) {
  manual_seed(11);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(12, 32));
  net->push_back(std::make_shared<nn::GELU>());
  net->push_back(std::make_shared<nn::LayerNorm>(Shape{32}));
  net->push_back(std::make_shared<nn::Dropout>(0.2));
  net->push_back(std::make_shared<nn::Linear>(32, 5));
  net->to(dtype);
  return net;
}

std::shared_ptr<nn::Sequential> make_cnn(DType dtype) {
  manual_seed(12);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(2, 6, 3).padding(1)));
  net->push_back(std::make_shared<nn::BatchNorm2d>(6));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::MaxPool2d>(2));
  net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(6, 8, 3).stride(2).padding(1)));
  net->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(8, 4));
  net->to(dtype);
  return net;
}

struct Run {
  std::vector<double> losses;
  nn::NamedTensors state;  // parameters and buffers after training, on the CPU
};

// Trains `net` on `device` for `steps` steps over batches drawn from a fixed generator (on the CPU,
// then moved: both runs see the same data), with dropout drawing from the default generator seeded
// the same way.
Run train(std::shared_ptr<nn::Sequential> net, Device device, bool cnn, DType dtype, int steps) {
  net->to(device);
  net->train();
  std::unique_ptr<optim::Optimizer> opt;
  if (cnn) {
    opt = std::make_unique<optim::SGD>(net->parameters(),
                                       optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  } else {
    opt = std::make_unique<optim::Adam>(net->parameters(), optim::AdamOptions{.lr = 3e-3, .weight_decay = 1e-4});
  }
  Generator data(5);
  manual_seed(99);
  Run run;
  for (int step = 0; step < steps; ++step) {
    Tensor x = cnn ? randn({6, 2, 8, 8}, {.dtype = dtype}, &data) : randn({16, 12}, {.dtype = dtype}, &data);
    Tensor y = randint(0, cnn ? 4 : 5, {cnn ? 6 : 16}, {.dtype = kInt64}, &data);
    opt->zero_grad();
    Tensor loss = F::cross_entropy(net->forward(x.to(device)), y.to(device));
    loss.backward();
    opt->step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& [name, t] : net->state_dict()) run.state.emplace_back(name, t.cpu());
  return run;
}


void check_same_training(bool cnn, DType dtype) {
  const Run cpu = train(cnn ? make_cnn(dtype) : make_mlp(dtype), kCPU, cnn, dtype, 20);
  const uint64_t tasks_before = sim::tasks_run();
  const Run sim = train(cnn ? make_cnn(dtype) : make_mlp(dtype), kSim, cnn, dtype, 20);
  CHECK(sim::tasks_run() > tasks_before + 20 * 20);  // the steps ran as sim stream tasks
  REQUIRE(sim.losses.size() == cpu.losses.size());
  CHECK(cpu.losses.back() < cpu.losses.front());  // it trains at all
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    INFO("step " << i);
    if (dtype == kFloat64) CHECK(sim.losses[i] == cpu.losses[i]);
    else CHECK(std::abs(sim.losses[i] - cpu.losses[i]) <= 1e-5 * std::abs(cpu.losses[i]));
  }
  REQUIRE(sim.state.size() == cpu.state.size());
  for (size_t i = 0; i < cpu.state.size(); ++i) {
    INFO(cpu.state[i].first);
    REQUIRE(sim.state[i].first == cpu.state[i].first);
    if (dtype == kFloat64) CHECK(equal(sim.state[i].second, cpu.state[i].second));
    else CHECK(testing::allclose_ratio(sim.state[i].second, cpu.state[i].second, 1e-5, 1e-6) <= 1);
  }
}

// Random delays before every sim task: a missing stream synchronization becomes a wrong value.
struct SimDelay {
  explicit SimDelay(uint32_t us) : previous(sim::delay_us()) { sim::set_delay_us(us); }
  ~SimDelay() { sim::set_delay_us(previous); }
  uint32_t previous;
};

}  // namespace

TEST_CASE("an MLP trained 20 steps on sim:0 equals the CPU run", "[nn][sim]") {
  SimDelay delay(20);
  SECTION("float64: bit for bit") { check_same_training(false, kFloat64); }
  SECTION("float32") { check_same_training(false, kFloat32); }
}

TEST_CASE("a CNN with BatchNorm trained 20 steps on sim:0 equals the CPU run", "[nn][sim]") {
  SimDelay delay(20);
  SECTION("float64: bit for bit") { check_same_training(true, kFloat64); }
  SECTION("float32") { check_same_training(true, kFloat32); }
}

TEST_CASE("a transformer encoder with embeddings gives the CPU's outputs and gradients on sim:0", "[nn][sim]") {
  // Embedding (index_select forward, index_add backward), multi-head attention with a key padding
  // mask (bmm, softmax, masked_fill), GELU feed-forward, pre-norm LayerNorm; float64, bit for bit.
  SimDelay delay(10);
  auto build = [] {
    manual_seed(21);
    auto emb = std::make_shared<nn::Embedding>(50, 16);
    auto layer = std::make_shared<nn::TransformerEncoderLayer>(
        16, 4, nn::TransformerEncoderLayerOptions{.dim_feedforward = 32, .dropout = 0.0, .activation = "gelu",
                                                  .batch_first = true, .norm_first = true});
    emb->to(kFloat64);
    layer->to(kFloat64);
    return std::make_pair(emb, layer);
  };
  Generator g(3);
  const Tensor tokens = randint(0, 50, {3, 7}, {.dtype = kInt64}, &g);
  const Tensor padding = tensor(std::vector<bool>{false, false, false, false, false, true, true,  //
                                                  false, false, false, false, false, false, false,
                                                  false, false, false, true, true, true, true},
                                Shape{3, 7}, {.dtype = kBool});
  const Tensor grad_out = randn({3, 7, 16}, {.dtype = kFloat64}, &g);
  auto run = [&](Device device) {
    auto [emb, layer] = build();
    emb->to(device);
    layer->to(device);
    Tensor out = layer->forward(emb->forward(tokens.to(device)), Tensor(), padding.to(device));
    out.backward(grad_out.to(device));
    nn::NamedTensors result{{"output", out.detach().cpu()}};
    for (const auto& [name, p] : emb->named_parameters()) result.emplace_back("emb." + name, p.grad().cpu());
    for (const auto& [name, p] : layer->named_parameters()) result.emplace_back(name, p.grad().cpu());
    return result;
  };
  const nn::NamedTensors cpu = run(kCPU), sim = run(kSim);
  REQUIRE(cpu.size() == sim.size());
  REQUIRE(cpu.size() > 10);
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(cpu[i].first);
    CHECK(equal(sim[i].second, cpu[i].second));
  }
}

// Every functional form of nn on sim:0 against the CPU, forward and backward, float64, bit for bit:
// float inputs are leaves drawn from one seed on the CPU and moved; fixed tensors (targets, class
// weights, BatchNorm statistics) are made per device by the row.
struct FunctionalRow {
  std::string name;
  std::vector<Shape> inputs;  // float64 leaves
  std::function<Tensor(const TensorList&, Device)> f;
};

std::vector<FunctionalRow> functional_rows() {
  using L = const TensorList&;
  auto longs = [](std::vector<int64_t> v, Shape s, Device d) {
    return tensor(v, s, {.dtype = kInt64, .device = d});
  };
  auto doubles = [](std::vector<double> v, Device d) { return tensor(v, std::nullopt, {.dtype = kFloat64, .device = d}); };
  std::vector<FunctionalRow> rows;
  rows.push_back({"linear", {{4, 5}, {3, 5}, {3}}, [](L x, Device) { return F::linear(x[0], x[1], x[2]); }});
  rows.push_back({"gelu tanh, silu", {{3, 4}}, [](L x, Device) { return F::silu(F::gelu(x[0], "tanh")); }});
  rows.push_back({"log_softmax dim 0", {{3, 4}}, [](L x, Device) { return F::log_softmax(x[0], 0); }});
  rows.push_back({"embedding with padding_idx", {{6, 3}}, [=](L x, Device d) {
                    return F::embedding(longs({1, 0, 5, 0, 2, 1}, {2, 3}, d), x[0], 0);
                  }});
  rows.push_back({"layer_norm over 2 dims", {{2, 3, 4}, {3, 4}, {3, 4}},
                  [](L x, Device) { return F::layer_norm(x[0], {3, 4}, x[1], x[2], 1e-5); }});
  rows.push_back({"batch_norm training with running stats", {{4, 3, 2, 2}, {3}, {3}}, [=](L x, Device d) {
                    Tensor rm = doubles({0.1, -0.2, 0.3}, d), rv = doubles({1.0, 0.5, 2.0}, d);
                    Tensor out = F::batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5);
                    return out + rm.sum() + rv.sum();  // the updated statistics are compared too
                  }});
  rows.push_back({"batch_norm eval", {{4, 3, 5}, {3}, {3}}, [=](L x, Device d) {
                    return F::batch_norm(x[0], doubles({0.1, -0.2, 0.3}, d), doubles({1.0, 0.5, 2.0}, d), x[1], x[2],
                                         false, 0.1, 1e-5);
                  }});
  rows.push_back({"conv2d stride 2, padding, dilation, groups", {{2, 4, 7, 6}, {6, 2, 3, 3}, {6}}, [](L x, Device) {
                    return F::conv2d(x[0], x[1], x[2], {2, 1}, {1, 2}, {1, 2}, 2);
                  }});
  rows.push_back({"conv2d 1x1 unbatched", {{3, 5, 5}, {4, 3, 1, 1}, {4}},
                  [](L x, Device) { return F::conv2d(x[0], x[1], x[2], {1, 1}, {0, 0}, {1, 1}, 1); }});
  rows.push_back({"max_pool2d ceil_mode, padding", {{2, 3, 7, 7}}, [](L x, Device) {
                    return F::max_pool2d(x[0], {3, 3}, std::optional<F::Pair>(F::Pair{2, 2}), {1, 1}, {1, 1}, true);
                  }});
  rows.push_back({"avg_pool2d count_include_pad false", {{2, 3, 6, 5}}, [](L x, Device) {
                    return F::avg_pool2d(x[0], {3, 2}, std::optional<F::Pair>(F::Pair{2, 2}), {1, 1}, false, false);
                  }});
  rows.push_back({"adaptive_avg_pool2d 7x5 -> 3x2", {{2, 3, 7, 5}},
                  [](L x, Device) { return F::adaptive_avg_pool2d(x[0], {3, 2}); }});
  rows.push_back({"cross_entropy weighted, ignore_index, smoothing", {{5, 4}}, [=](L x, Device d) {
                    return F::cross_entropy(x[0], longs({1, -100, 3, 0, 2}, {5}, d),
                                            {.weight = doubles({1.0, 2.0, 0.5, 1.5}, d), .label_smoothing = 0.1});
                  }});
  rows.push_back({"cross_entropy spatial, sum", {{2, 3, 2, 2}}, [=](L x, Device d) {
                    return F::cross_entropy(x[0], longs({0, 1, 2, 1, 2, 2, 0, 0}, {2, 2, 2}, d),
                                            {.reduction = F::Reduction::Sum});
                  }});
  rows.push_back({"cross_entropy none", {{3, 4}}, [=](L x, Device d) {
                    return F::cross_entropy(x[0], longs({3, 0, 1}, {3}, d), {.reduction = F::Reduction::None});
                  }});
  rows.push_back({"nll_loss weighted", {{4, 3}}, [=](L x, Device d) {
                    return F::nll_loss(F::log_softmax(x[0], 1), longs({2, 0, 1, 1}, {4}, d),
                                       {.weight = doubles({0.5, 1.0, 2.0}, d)});
                  }});
  rows.push_back({"mse_loss", {{3, 4}, {3, 4}}, [](L x, Device) { return F::mse_loss(x[0], x[1]); }});
  rows.push_back({"binary_cross_entropy_with_logits pos_weight", {{3, 4}}, [=](L x, Device d) {
                    Tensor target = tensor(std::vector<double>{1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1}, Shape{3, 4},
                                           {.dtype = kFloat64, .device = d});
                    return F::binary_cross_entropy_with_logits(x[0], target, F::Reduction::Mean,
                                                               doubles({0.5, 2.0, 1.0, 3.0}, d));
                  }});
  return rows;
}

TEST_CASE("every nn functional form gives the CPU's outputs and gradients on sim:0", "[nn][sim]") {
  SimDelay delay(5);
  const auto rows = functional_rows();
  for (size_t r = 0; r < rows.size(); ++r) {
    const FunctionalRow& row = rows[r];
    INFO(row.name);
    auto run = [&](Device device) {
      Generator g(500 + r);
      TensorList inputs;
      for (const Shape& s : row.inputs) {
        Tensor t = randn(s, {.dtype = kFloat64}, &g).to(device);
        t.requires_grad_();
        inputs.push_back(t);
      }
      Tensor out = row.f(inputs, device);
      REQUIRE(out.device() == device);
      out.backward(randn(out.sizes(), {.dtype = kFloat64}, &g).to(device));
      TensorList result{out.detach().cpu()};
      for (const Tensor& t : inputs) result.push_back(t.grad().cpu());
      return result;
    };
    const TensorList cpu = run(kCPU), sim = run(kSim);
    for (size_t k = 0; k < cpu.size(); ++k) {
      INFO((k == 0 ? std::string("output") : "gradient of input " + std::to_string(k - 1)));
      CHECK(equal(sim[k], cpu[k]));
    }
  }
}

TEST_CASE("Module::to moves parameters, buffers and gradients to the device and back", "[nn][sim]") {
  auto net = make_cnn(kFloat32);
  const nn::NamedTensors before = net->state_dict();
  net->to("sim:0");
  for (const auto& [name, t] : net->state_dict()) {
    INFO(name);
    CHECK(t.device() == kSim);
  }
  for (const Tensor& p : net->parameters()) CHECK(p.requires_grad());
  F::cross_entropy(net->forward(randn({2, 2, 8, 8}).to(kSim)), tensor<int64_t>({1, 3}).to(kSim)).backward();
  for (const Tensor& p : net->parameters()) CHECK(p.grad().device() == kSim);
  net->to(kCPU);
  net->eval();
  for (const auto& [name, t] : net->state_dict()) CHECK(t.device() == kCPU);
  // Parameters changed only by what autograd did not do (no step): the values round-tripped.
  const nn::NamedTensors after = net->state_dict();
  for (size_t i = 0; i < before.size(); ++i) {
    if (before[i].first.find("running") != std::string::npos || before[i].first.find("num_batches") != std::string::npos) {
      continue;  // the forward in training mode updated the BatchNorm statistics
    }
    INFO(before[i].first);
    CHECK(equal(after[i].second, before[i].second));
  }
}

// Module::to while a graph from before the move is still held (as a training loop holds the last
// loss): the next graph's gradients have the parameters' new dtype and device (the stale
// AccumulateGrad node is not reused), and the old graph's backward is a clear error, not a float32
// gradient on a float64 weight or a CPU gradient on a sim weight.
TEST_CASE("Module::to with an earlier graph still held: new gradients follow the parameters, the old graph refuses",
          "[nn][sim]") {
  for (const bool to_device : {false, true}) {
    INFO((to_device ? "to sim:0" : "to float64"));
    manual_seed(3);
    auto mlp = [] {
      auto m = std::make_shared<nn::Sequential>();
      m->push_back(std::make_shared<nn::Linear>(4, 3));
      m->push_back(std::make_shared<nn::Tanh>());
      m->push_back(std::make_shared<nn::Linear>(3, 2));
      return m;
    };
    auto net = mlp();
    const Tensor x = randn({5, 4});
    Tensor held = net->forward(x).sum();  // its graph holds each weight's AccumulateGrad node
    if (to_device) net->to("sim:0");
    else net->to(kFloat64);
    const Tensor x2 = to_device ? x.to(kSim) : x.to(kFloat64);
    Tensor loss = net->forward(x2).pow(2.0).sum();
    loss.backward();
    for (const Tensor& p : net->parameters()) {
      REQUIRE(p.grad().defined());
      CHECK(p.grad().dtype() == p.dtype());
      CHECK(p.grad().device() == p.device());
    }
    // The gradients are the moved model's: the same as a fresh copy's on the CPU in float64.
    auto ref = mlp();
    ref->to(kFloat64);
    {
      NoGradGuard no_grad;
      const auto src = net->parameters();
      auto dst = ref->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i].to(kCPU).to(kFloat64));
    }
    ref->forward(x.to(kFloat64)).pow(2.0).sum().backward();
    const auto got = net->parameters(), want = ref->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      const double tol = to_device ? 1e-5 : 1e-12;  // sim:0 computes in float32
      CHECK(allclose(got[i].grad().to(kCPU).to(kFloat64), want[i].grad(), tol, tol));
    }
    optim::SGD opt(net->parameters(), {.lr = 0.1});
    CHECK_NOTHROW(opt.step());
    CHECK_THROWS_WITH(held.backward(), Catch::Contains("the graph was built before the leaf's data was replaced") &&
                                           Catch::Contains(to_device ? "now holds float32 on sim:0" : "now holds float64 on cpu"));
  }
}

TEST_CASE("checkpoints are saved from and loaded to either device", "[nn][sim]") {
  const std::string dir = std::filesystem::temp_directory_path() / "chorus_device_test";
  std::filesystem::create_directories(dir);
  auto on_sim = make_mlp(kFloat32);
  on_sim->to(kSim);
  optim::Adam opt(on_sim->parameters(), {.lr = 1e-2, .amsgrad = true});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    F::cross_entropy(on_sim->forward(randn({4, 12}).to(kSim)), tensor<int64_t>({0, 1, 2, 3}).to(kSim)).backward();
    opt.step();
  }
  nn::save_safetensors(dir + "/model.safetensors", on_sim->state_dict());
  nn::save_safetensors(dir + "/optim.safetensors", opt.state_dict());

  auto on_cpu = make_mlp(kFloat32);  // different weights until loaded (same seed, but on_sim trained)
  on_cpu->load_state_dict(nn::load_safetensors(dir + "/model.safetensors").tensors);
  const nn::NamedTensors a = on_cpu->state_dict(), b = on_sim->state_dict();
  for (size_t i = 0; i < a.size(); ++i) CHECK(equal(a[i].second, b[i].second.cpu()));

  // The optimizer state loads onto the parameters' device, whatever device it was saved from: the
  // step below would be refused otherwise (Optimizer::check_state names a buffer on another
  // device). state_dict() snapshots it in host memory.
  auto again = make_mlp(kFloat32);
  again->to(kSim);
  optim::Adam opt2(again->parameters(), {.lr = 1e-2, .amsgrad = true});
  again->load_state_dict(nn::load_safetensors(dir + "/model.safetensors").tensors);
  opt2.load_state_dict(nn::load_safetensors(dir + "/optim.safetensors").tensors);
  for (const auto& [name, t] : opt2.state_dict()) {
    INFO(name);
    CHECK(t.device().is_cpu());
  }
  // One more identical step on both keeps them identical.
  Tensor x = randn({4, 12});
  Tensor y = tensor<int64_t>({3, 2, 1, 0});
  for (auto* pair : {&opt, &opt2}) pair->zero_grad();
  on_sim->eval();
  again->eval();
  F::cross_entropy(on_sim->forward(x.to(kSim)), y.to(kSim)).backward();
  F::cross_entropy(again->forward(x.to(kSim)), y.to(kSim)).backward();
  opt.step();
  opt2.step();
  const nn::NamedTensors c = on_sim->state_dict(), d = again->state_dict();
  for (size_t i = 0; i < c.size(); ++i) CHECK(equal(c[i].second.cpu(), d[i].second.cpu()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("mixing devices in one op names both devices", "[nn][sim]") {
  Tensor a = randn({3});
  Tensor b = randn({3}).to(kSim);
  REQUIRE_THROWS_WITH(a + b, Catch::Contains("cpu") && Catch::Contains("sim:0"));
  REQUIRE_THROWS_WITH(a.matmul(b), Catch::Contains("cpu") && Catch::Contains("sim:0"));
  auto lin = std::make_shared<nn::Linear>(3, 2);
  REQUIRE_THROWS_WITH(lin->forward(b.unsqueeze(0)), Catch::Contains("cpu") && Catch::Contains("sim:0"));
  REQUIRE_THROWS_WITH(a.to("sim:7"), Catch::Contains("sim:7") && Catch::Contains("does not exist"));
}

TEST_CASE("without a CUDA device every CUDA entry point raises a clear error", "[nn][cuda]") {
  // This build registers no CUDA runtime on a machine without a GPU, or one reporting no device.
  // The target runs with CUDA_VISIBLE_DEVICES set empty (tests/nn/BUILD), so a machine with a GPU
  // shows none to it too: the case holds with and without a GPU.
  INFO("CUDA_VISIBLE_DEVICES=" << (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)"));
  REQUIRE(device_count(DeviceType::CUDA) == 0);
  CHECK_FALSE(cuda::is_available());
  CHECK_THROWS_WITH(cuda::synchronize(), Catch::Contains("no CUDA device"));
  // A build without CUDA (the sanitizer builds of tools/test.sh --full) has no CUDA allocator at
  // all, and says that instead.
  CHECK_THROWS_WITH(cuda::memory_allocated(), kernels::has_kernels(DeviceType::CUDA)
                                                  ? Catch::Contains("no CUDA device")
                                                  : Catch::Contains("this build of chorus has no such backend"));
  auto no_cuda = Catch::Contains("no CUDA device");
  CHECK_THROWS_WITH(zeros({2}, {.device = Device::cuda(0)}), no_cuda);
  CHECK_THROWS_WITH(randn({2}).to("cuda:0"), no_cuda);
  CHECK_THROWS_WITH(randn({2}).cuda(), no_cuda);
  CHECK_THROWS_WITH(current_stream(Device::cuda(0)), no_cuda);
  CHECK_THROWS_WITH(stream_from_pool(Device::cuda(0), true), no_cuda);
  CHECK_THROWS_WITH(synchronize(Device::cuda(0)), no_cuda);
  CHECK_THROWS_WITH(DeviceGuard(Device::cuda(0)), no_cuda);
  auto net = make_mlp(kFloat32);
  CHECK_THROWS_WITH(net->to(Device::cuda(0)), no_cuda);
}

}  // namespace chorus
