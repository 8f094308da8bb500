// An LSTM's training step (forward, the loss, backward; no optimizer) at growing sequence lengths, on
// a padded batch and on a packed one from an input that requires grad, chorus against libtorch 1.13
// in the same process: ms a step (bench::paired_median_times) and how
// the time grows with the length. A step whose time grows faster than the length has work that is
// quadratic in it (split's pieces, and pack_padded_sequence's steps, each had a whole-size gradient
// until [One node for a split], autograd/ops/index.cpp).
//
//   bazel run -c opt //tests/bench:rnn_bench -- [--threads T] [--steps N] [--lengths 16,64,256]
#include <torch/nn/modules/rnn.h>
#include <torch/nn/utils/rnn.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "nn/rnn.h"
#include "nn/utils/rnn.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/libtorch_peer.h"

using namespace chorus;

int main(int argc, char** argv) {
  int threads = 1, steps = 10;
  std::vector<int64_t> lengths = {16, 64, 256};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else if (flag == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else if (flag == "--lengths") {
      lengths.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) lengths.push_back(std::stoll(item));
    } else {
      std::fprintf(stderr, "usage: rnn_bench [--threads T] [--steps N] [--lengths L1,L2,...]\n");
      return 2;
    }
  }
  set_num_threads(threads);
  bench::peer_threads(threads);
  const int64_t batch = 16, input = 64, hidden = 256;
  manual_seed(5);
  torch::manual_seed(5);
  nn::LSTM lstm(input, hidden);
  torch::nn::LSTM peer(torch::nn::LSTMOptions(input, hidden));
  std::printf("LSTM %lld -> %lld, batch %lld, one layer, %d thread(s): forward, mean of the output, backward "
              "(no optimizer); median of %d steps a side after warm-up (bench::paired_median_times)\n\n",
              static_cast<long long>(input), static_cast<long long>(hidden), static_cast<long long>(batch), threads,
              steps);
  std::printf("| input | length | chorus ms | libtorch ms | chorus / libtorch | chorus ms per time step |\n"
              "|---|---|---|---|---|---|\n");
  for (int64_t length : lengths) {
    const Tensor x = randn({length, batch, input});
    const torch::Tensor tx = torch::randn({length, batch, input});
    auto chorus_step = [&] {
      lstm.zero_grad();
      std::get<0>(lstm.forward(x, std::nullopt)).mean().backward();
    };
    auto torch_step = [&] {
      peer->zero_grad();
      std::get<0>(peer->forward(tx)).mean().backward();
    };
    // Packed, from an input that requires grad (an embedding's output, say): pack_padded_sequence's
    // steps are on the gradient's path too. Lengths from `length` down to half of it.
    Tensor xg = x.clone();
    xg.requires_grad_();
    torch::Tensor txg = tx.clone().requires_grad_();
    std::vector<int64_t> lens(batch);
    for (int64_t i = 0; i < batch; ++i) lens[i] = length - (length / 2) * i / batch;
    const torch::Tensor tlens = torch::tensor(lens);
    auto chorus_packed = [&] {
      lstm.zero_grad();
      xg.mutable_grad() = Tensor();
      std::get<0>(lstm.forward(nn::utils::rnn::pack_padded_sequence(xg, lens), std::nullopt)).data.mean().backward();
    };
    auto torch_packed = [&] {
      peer->zero_grad();
      if (txg.grad().defined()) txg.grad().zero_();
      std::get<0>(peer->forward_with_packed_input(torch::nn::utils::rnn::pack_padded_sequence(txg, tlens)))
          .data()
          .mean()
          .backward();
    };
    for (bool packed : {false, true}) {
      const bench::PairedTimes t = packed ? bench::paired_median_times(chorus_packed, torch_packed, 2, steps)
                                          : bench::paired_median_times(chorus_step, torch_step, 2, steps);
      std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.3f |\n", packed ? "packed, requires grad" : "padded",
                  static_cast<long long>(length), t.a * 1e3, t.b * 1e3, t.ratio, t.a * 1e3 / static_cast<double>(length));
      std::fflush(stdout);
    }
  }
  return 0;
}
