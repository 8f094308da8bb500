// A statically linked chorus program for isa_guard_test: a few training steps of a small MLP with
// AdamW (elementwise, optimizer and reduction kernels), so the kernels library is linked whole.
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"

using namespace chorus;

int main() {
  manual_seed(1);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(32, 64));
  net->push_back(std::make_shared<nn::GELU>());
  net->push_back(std::make_shared<nn::Linear>(64, 4));
  optim::AdamW opt(net->parameters(), {.lr = 1e-3});
  const Tensor x = randn({16, 32}), y = randint(0, 4, {16});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    nn::functional::cross_entropy(net->forward(x), y).backward();
    opt.step();
  }
  return 0;
}
