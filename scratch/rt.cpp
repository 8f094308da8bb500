#include <cstdio>
#include <cstdlib>
#include "examples/models/resnet.h"
#include "optim/optim.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"
using namespace chorus;
int main(int argc, char** argv) {
  int b = std::atoi(argv[1]); bool small = std::atoi(argv[2]); int hw = std::atoi(argv[3]);
  set_num_threads(std::atoi(argv[4]));
  models::ResNetOptions o; o.num_classes = 10; o.in_channels = 1; o.small_input = small; if (argc > 5) o.stem_max_pool = true;
  auto m = models::resnet18(o);
  optim::SGD opt(m->parameters(), {.lr = 0.01, .momentum = 0.9});
  Tensor x = randn({b, 1, hw, hw}); Tensor y = randint(0, 10, {b});
  double t = bench::median_time([&] { opt.zero_grad(); nn::functional::cross_entropy(m->forward(x), y).backward(); opt.step(); }, 2, 5);
  std::printf("b=%d small=%d hw=%d: %.1f ms/step, %.1f img/s\n", b, (int)small, hw, t * 1e3, b / t);
}
