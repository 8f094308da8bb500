// A tiny MLP trained on synthetic data with plain tensors and autograd: the smallest end-to-end
// check that chorus trains. The data is a fixed random "teacher" network's labels, so a student MLP
// can fit it and the loss must fall.
#include <cmath>
#include <cstdio>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

using namespace chorus;

int main() {
  manual_seed(0);
  const int64_t n = 512, in = 16, hidden = 64, classes = 4;
  // Teacher: labels = argmax(x @ T).
  Tensor x = randn({n, in});
  Tensor labels = argmax(matmul(x, randn({in, classes})), 1);
  Tensor target = one_hot(labels, classes).to(kFloat32);

  // Student: in -> hidden -> classes, initialized like PyTorch's Linear (uniform +-1/sqrt(fan_in)).
  auto init = [](int64_t fan_in, const Shape& shape) {
    Tensor w = sub(mul(rand(shape), 2.0), 1.0).mul_(1.0 / std::sqrt(static_cast<double>(fan_in)));
    return w.requires_grad_();
  };
  Tensor w1 = init(in, {in, hidden}), b1 = init(in, {hidden});
  Tensor w2 = init(hidden, {hidden, classes}), b2 = init(hidden, {classes});
  std::vector<Tensor> params{w1, b1, w2, b2};

  const double lr = 0.5;
  for (int step = 0; step <= 200; ++step) {
    Tensor logits = add(matmul(relu(add(matmul(x, w1), b1)), w2), b2);
    // Cross-entropy from log_softmax against the one-hot targets.
    Tensor loss = neg(mean(sum(mul(log_softmax(logits, 1), target), {1})));
    for (Tensor& p : params) p.mutable_grad() = Tensor();
    loss.backward();
    {
      NoGradGuard no_grad;
      for (Tensor& p : params) p.sub_(p.grad(), lr);
    }
    if (step % 20 == 0) {
      double acc = eq(argmax(logits, 1), labels).to(kFloat32).mean().item<double>();
      std::printf("step %3d  loss %.4f  train accuracy %.3f\n", step, loss.item<double>(), acc);
    }
  }
  return 0;
}
