// The training state the checkpoint fuzz target resumes into, and that make_seeds saves its seed
// from: an MLP 4-3-2, Adam, StepLR(2).
#pragma once

#include <memory>

#include "nn/nn.h"
#include "optim/optim.h"

namespace chorus::fuzz {

struct CheckpointModel {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Adam> opt;
  std::unique_ptr<optim::StepLR> sched;

  CheckpointModel() : model(std::make_shared<nn::Sequential>()) {
    manual_seed(0);
    model->push_back(std::make_shared<nn::Linear>(4, 3));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(3, 2));
    opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{});
    sched = std::make_unique<optim::StepLR>(*opt, 2);
  }

  // One training step on random data.
  void step() {
    opt->zero_grad();
    model->forward(randn({5, 4})).pow(2).mean().backward();
    opt->step();
    sched->step();
  }
};

}  // namespace chorus::fuzz
