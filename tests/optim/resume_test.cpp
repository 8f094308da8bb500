// Resume equivalence: training 2 epochs equals training 1, saving a checkpoint, rebuilding every
// object from scratch, loading it and training 1 more — parameter for parameter, bit for bit.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "data/data.h"
#include "nn/nn.h"
#include "nn/serialize.h"
#include "optim/optim.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

namespace F = nn::functional;

struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::StepLR> sched;
  std::unique_ptr<data::DataLoader> loader;
  int64_t step = 0;

  Run(std::shared_ptr<data::Dataset> dataset, bool adam) {
    manual_seed(21);
    model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(1, 4, 3).padding(1)));
    model->push_back(std::make_shared<nn::BatchNorm2d>(4));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Dropout>(0.2));  // consumes the RNG: restored with the checkpoint
    model->push_back(std::make_shared<nn::Flatten>());
    model->push_back(std::make_shared<nn::Linear>(4 * 6 * 6, 3));
    if (adam) opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.01});
    else opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    sched = std::make_unique<optim::StepLR>(*opt, 3, 0.7);
    loader = std::make_unique<data::DataLoader>(dataset, data::DataLoaderOptions{.batch_size = 8, .shuffle = true, .seed = 4});
  }

  void epoch(int64_t e) {
    loader->set_epoch(e);
    for (data::Batch& b : *loader) {
      opt->zero_grad();
      F::cross_entropy(model->forward(b.data), b.target).backward();
      opt->step();
      sched->step();
      ++step;
    }
  }
};

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.contiguous().raw_data_ptr(), b.contiguous().raw_data_ptr(), a.nbytes()) == 0;
}

TEST_CASE("resuming from a checkpoint continues exactly where training stopped", "[optim][checkpoint]") {
  Generator gen(3);
  auto dataset = std::make_shared<data::TensorDataset>(randn({44, 1, 6, 6}, {}, &gen), randint(0, 3, {44}, {.dtype = kInt64}, &gen));
  const std::string path =
      (std::filesystem::temp_directory_path() / ("chorus_resume_" + std::to_string(::getpid()) + ".safetensors")).string();
  for (bool adam : {false, true}) {
    INFO((adam ? "AdamW" : "SGD momentum"));
    Run straight(dataset, adam);
    straight.epoch(0);
    straight.epoch(1);

    Run first(dataset, adam);
    first.epoch(0);
    nn::Checkpoint c;
    c.model = first.model->state_dict();
    c.optimizer = first.opt->state_dict();
    c.scheduler = first.sched->state_dict();
    c.epoch = 1;
    c.step = first.step;
    c.capture_rng();
    c.save(path);
    randn({100});  // whatever happens between stopping and resuming does not matter

    Run resumed(dataset, adam);  // fresh model, optimizer, scheduler, loader
    nn::Checkpoint back = nn::Checkpoint::load(path);
    resumed.model->load_state_dict(back.model);
    resumed.opt->load_state_dict(back.optimizer);
    resumed.sched->load_state_dict(back.scheduler);
    back.restore_rng();
    resumed.step = back.step;
    resumed.epoch(back.epoch);

    CHECK(resumed.step == straight.step);
    CHECK(resumed.opt->param_groups()[0].lr() == straight.opt->param_groups()[0].lr());
    auto a = straight.model->state_dict(), b = resumed.model->state_dict();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(bit_equal(a[i].second, b[i].second));  // parameters and BatchNorm buffers
    }
    // And the resumed run really moved: it differs from the checkpoint it started at.
    CHECK_FALSE(bit_equal(b.back().second, back.model.back().second));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace chorus
