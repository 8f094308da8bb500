// The stream-ordered group and DDP's reducer in one process, for ThreadSanitizer: a world-size-1
// Gloo group over a FileStore, wrapped in StreamOrderedGroup, on sim:0 with random delays. DDP with
// bucket views (so buckets really go through the communication stream) trains an MLP 6 steps and
// must equal plain training; direct collectives on the device keep their values. The host thread,
// the compute and communication stream workers, Gloo's thread and the allocator all interleave.
#include <catch2/catch.hpp>

#include <filesystem>

#include "distributed/ddp.h"
#include "distributed/gloo.h"
#include "distributed/stream_group.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tensor/sim/sim.h"

namespace chorus::distributed {
namespace F = nn::functional;

TEST_CASE("DDP through the stream-ordered group on sim:0 in one process", "[distributed][sim][tsan]") {
  sim::set_delay_us(50);
  const std::string path = std::filesystem::temp_directory_path() / "chorus_stream_group_test_store";
  std::filesystem::remove(path);
  auto group = std::make_shared<StreamOrderedGroup>(
      std::make_shared<ProcessGroupGloo>(std::make_shared<FileStore>(path), 0, 1));
  const Device sim0 = Device::sim(0);

  Tensor t = arange(0, 64, 1, TensorOptions{.dtype = kFloat64}).to(sim0);
  group->allreduce({t}, ReduceOp::Avg)->wait();
  group->broadcast({t}, 0)->wait();
  CHECK(equal(t.cpu(), arange(0, 64, 1, TensorOptions{.dtype = kFloat64})));

  auto make = [] {
    manual_seed(3);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(10, 24));
    net->push_back(std::make_shared<nn::Tanh>());
    net->push_back(std::make_shared<nn::Linear>(24, 4));
    net->to(kFloat64);
    return net;
  };
  auto model = make(), ref = make();
  model->to(sim0);
  DistributedDataParallel ddp(model, group,
                              {.bucket_cap_mb = 0.0005, .first_bucket_cap_mb = 0.0005, .gradient_as_bucket_view = true});
  REQUIRE(ddp.reducer().buckets().size() > 1);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  Generator g(4);
  for (int step = 0; step < 6; ++step) {
    Tensor x = randn({6, 10}, {.dtype = kFloat64}, &g), y = randint(0, 4, {6}, {.dtype = kInt64}, &g);
    opt.zero_grad();
    ref_opt.zero_grad();
    F::cross_entropy(ddp.forward(x.to(sim0)), y.to(sim0)).backward();
    opt.step();
    F::cross_entropy(ref->forward(x), y).backward();
    ref_opt.step();
  }
  const auto a = model->named_parameters(), b = ref->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(equal(a[i].second.cpu(), b[i].second));
  }
  sim::set_delay_us(0);
  std::filesystem::remove(path);
}

}  // namespace chorus::distributed
