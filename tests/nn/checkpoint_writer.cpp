// For checkpoint_kill_test: saves a checkpoint over and over into one path, each generation's every
// tensor filled with the generation number (and its step = that number), until killed. Argument:
// the checkpoint path.
#include <cstdio>
#include <string>

#include "nn/serialize.h"
#include "tensor/ops.h"

using namespace chorus;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer PATH\n");
    return 2;
  }
  for (int64_t generation = 1;; ++generation) {
    nn::Checkpoint c;
    const double g = static_cast<double>(generation);
    for (int i = 0; i < 4; ++i) c.model.emplace_back("w" + std::to_string(i), full({256, 1024}, g));  // 1 MiB each
    c.optimizer.emplace_back("state.0.step", full({}, g, {.dtype = kFloat64}));
    c.epoch = generation;
    c.step = generation;
    c.extra = {{"generation", std::to_string(generation)}};
    c.save(argv[1]);
  }
}
