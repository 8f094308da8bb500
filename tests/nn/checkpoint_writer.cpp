// For checkpoint_kill_test: saves a checkpoint over and over into one path, each generation's every
// tensor filled with the generation number (and its step = that number), until killed. Argument:
// the checkpoint path. Prints "saved" once its first save is complete, so the test can aim its kills
// at the saves that follow (a loaded machine may take longer to start the program than to kill it).
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
  // The tensors are made once and refilled, so most of the loop's time is spent saving.
  nn::Checkpoint c;
  // Small (4 x 16 KiB): the time of a save is then mostly its write and fsync, while the temporary
  // file exists, which is where a kill can tear something.
  for (int i = 0; i < 4; ++i) c.model.emplace_back("w" + std::to_string(i), zeros({16, 256}));
  c.optimizer.emplace_back("state.0.step", zeros({}, {.dtype = kFloat64}));
  for (int64_t generation = 1;; ++generation) {
    const double g = static_cast<double>(generation);
    for (auto& [name, t] : c.model) t.fill_(g);
    c.optimizer[0].second.fill_(g);
    c.epoch = generation;
    c.step = generation;
    c.extra = {{"generation", std::to_string(generation)}};
    c.save(argv[1]);
    if (generation == 1) {
      std::fputs("saved\n", stdout);
      std::fflush(stdout);
    }
  }
}
