// A program outside the chorus repository that uses chorus, built two ways by tools/outside_test.sh:
// in a Bazel workspace that declares @chorus (hello.BUILD), and with CMake against an installed tree
// (CMakeLists.txt, find_package(chorus)). It fits y = x w + b by gradient descent through chorus's
// autograd, nn and optim, and exits 0 only if it finds w and b.
#include <cmath>
#include <cstdio>

#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/ops.h"

int main() {
  using namespace chorus;
  manual_seed(0);
  const Tensor w = tensor<float>({1.5f, -2.0f, 0.5f}).reshape({3, 1});
  const Tensor x = randn({256, 3});
  const Tensor y = matmul(x, w) + 0.25;
  auto model = std::make_shared<nn::Linear>(3, 1);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  double loss = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    Tensor l = nn::functional::mse_loss(model->forward(x), y);
    l.backward();
    opt.step();
    loss = l.item<double>();
  }
  const double w_error = model->weight.reshape({3, 1}).sub(w).abs().max().item<double>();
  const double b_error = std::fabs(model->bias.item<double>() - 0.25);
  std::printf("hello_chorus: loss %.3g, |w - w*| %.3g, |b - b*| %.3g\n", loss, w_error, b_error);
  return loss < 1e-8 && w_error < 1e-4 && b_error < 1e-4 ? 0 : 1;
}
