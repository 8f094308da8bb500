// The README's example, compiled with every build so it cannot go stale.
#include "data/data.h"
#include "distributed/ddp.h"
#include "distributed/init.h"
#include "nn/nn.h"
#include "optim/optim.h"
using namespace chorus;
namespace F = nn::functional;

int main() {  // run it with: chorusrun --nproc-per-node 2 ./program
  auto group = distributed::init_process_group();                  // RANK, WORLD_SIZE from chorusrun
  auto train = std::make_shared<data::MNIST>(data::default_data_dir() + "/mnist", data::Split::Train);
  data::DataLoader loader(train, {.batch_size = 32, .sampler = std::make_shared<data::DistributedSampler>(
                                                        train->size(), group->size(), group->rank())});
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(1, 16, 3).padding(1)));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(4));
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(16 * 4 * 4, 10));
  distributed::DistributedDataParallel model(net, group);          // gradients averaged across ranks
  optim::Adam opt(net->parameters(), {.lr = 1e-3});
  for (data::Batch& b : loader) {
    opt.zero_grad();
    F::cross_entropy(model.forward(b.data), b.target).backward();  // allreduce overlaps backward
    opt.step();
  }
}
