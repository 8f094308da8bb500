// The README's example, compiled with every build so it cannot go stale.
#include <iostream>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"
using namespace chorus;

int main() {
  manual_seed(0);
  Tensor x = randn({64, 16});                                  // a batch of inputs
  Tensor y = randn({64, 1});                                   // regression targets
  Tensor w = randn({16, 1}, {.requires_grad = true});          // a linear model
  Tensor b = zeros({1}, {.requires_grad = true});
  for (int step = 0; step < 100; ++step) {
    Tensor loss = (matmul(x, w) + b - y).pow(2).mean();        // broadcasting, autograd
    w.mutable_grad() = Tensor(); b.mutable_grad() = Tensor();  // clear old gradients
    loss.backward();
    NoGradGuard no_grad;                                       // update without recording
    w.sub_(w.grad(), 0.1); b.sub_(b.grad(), 0.1);
  }
  std::cout << w.t() << "\n";                                  // prints like PyTorch
}
