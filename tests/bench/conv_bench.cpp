// Convolutions of ResNet-18 (input 64x64, as train_step_bench), forward and backward (input and
// weight gradients), at batch 1, 16 and 32 and 1 and 2 threads: chorus's oneDNN path, chorus's
// im2col + Eigen GEMM path, and libtorch 1.13 (oneDNN inside), all in this run; medians after
// warm-up. What decided the float32 convolution path (docs/benchmarks.md).
//   bazel run -c opt //tests/bench:conv_bench [-- --reps 10]
//   ... -- --winograd: the 3x3 stride-1 convolutions of the small ResNet and ResNet-18 with and
//   without Winograd (set_winograd), each with the implementation it ran, and libtorch: where oneDNN
//   has no Winograd kernels (AVX2; CHORUS_CPU_CAPABILITY=avx2) that is chorus's own F(2x2, 3x3)
//   ([Own Winograd convolutions], kernels/cpu/winograd.cpp) against oneDNN's direct kernels.
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/onednn_conv.h"
#include "nn/nn.h"
#include "tensor/ops.h"
#include "tests/bench/bench_util.h"

namespace {

struct Layer {
  const char* name;
  int64_t c_in, c_out, hw, k, stride, pad;
};

// ResNet-18 on 64x64 inputs: the stem, then one 3x3 of each stage, the first (strided) 3x3 of
// stages 2-4 and their 1x1 strided projections.
const Layer kLayers[] = {
    {"conv1 7x7/2 3->64 @64", 3, 64, 64, 7, 2, 3},       {"layer1 3x3 64->64 @16", 64, 64, 16, 3, 1, 1},
    {"layer2.0 3x3/2 64->128 @16", 64, 128, 16, 3, 2, 1}, {"layer2 3x3 128->128 @8", 128, 128, 8, 3, 1, 1},
    {"layer2 proj 1x1/2 64->128", 64, 128, 16, 1, 2, 0},  {"layer3.0 3x3/2 128->256 @8", 128, 256, 8, 3, 2, 1},
    {"layer3 3x3 256->256 @4", 256, 256, 4, 3, 1, 1},     {"layer4.0 3x3/2 256->512 @4", 256, 512, 4, 3, 2, 1},
    {"layer4 3x3 512->512 @2", 512, 512, 2, 3, 1, 1},
};

namespace F = chorus::nn::functional;

// One convolution's forward + backward (input and weight gradients), chorus and libtorch, ms.
double chorus_ms(const Layer& l, int64_t batch, int warmup, int reps) {
  chorus::manual_seed(1);
  chorus::Tensor x = chorus::randn({batch, l.c_in, l.hw, l.hw}).requires_grad_();
  chorus::Tensor w = chorus::randn({l.c_out, l.c_in, l.k, l.k}).requires_grad_();
  chorus::Tensor g;
  return chorus::bench::median_time(
             [&] {
               x.set_grad(chorus::Tensor());
               w.set_grad(chorus::Tensor());
               chorus::Tensor y = F::conv2d(x, w, chorus::Tensor(), {l.stride, l.stride}, {l.pad, l.pad});
               if (!g.defined()) g = chorus::randn(y.sizes());
               y.backward(g);
             },
             warmup, reps) *
         1e3;
}

double torch_ms(const Layer& l, int64_t batch, int warmup, int reps) {
  torch::manual_seed(1);
  torch::Tensor tx = torch::randn({batch, l.c_in, l.hw, l.hw}).requires_grad_();
  torch::Tensor tw = torch::randn({l.c_out, l.c_in, l.k, l.k}).requires_grad_();
  torch::Tensor tg;
  return chorus::bench::median_time(
             [&] {
               if (tx.grad().defined()) tx.mutable_grad().zero_();
               if (tw.grad().defined()) tw.mutable_grad().zero_();
               torch::Tensor y = torch::conv2d(tx, tw, {}, l.stride, l.pad);
               if (!tg.defined()) tg = torch::randn(y.sizes());
               y.backward(tg);
             },
             warmup, reps) *
         1e3;
}

int winograd_table(int warmup, int reps) {
  namespace od = chorus::kernels::cpu::onednn;
  const Layer layers[] = {{"small ResNet 3x3 32->32 @32", 32, 32, 32, 3, 1, 1},
                          {"small ResNet 3x3 64->64 @16", 64, 64, 16, 3, 1, 1},
                          {"small ResNet 3x3 128->128 @8", 128, 128, 8, 3, 1, 1}};
  std::printf("3x3 stride-1 convolutions, forward + backward (input and weight gradients), float32, median of %d after "
              "%d warm-up; ms; oneDNN: %s\n\n| layer | batch | threads | direct | winograd (implementation) | "
              "libtorch | winograd / direct | winograd / libtorch |\n|---|---|---|---|---|---|---|---|\n",
              reps, warmup, od::capability().c_str());
  for (int threads : {1, 2}) {
    chorus::set_num_threads(threads);
    torch::set_num_threads(threads);
    for (int64_t batch : {16, 32}) {
      for (const Layer& l : layers) {
        double ms[2];
        std::string impl;
        for (int wino = 0; wino < 2; ++wino) {
          const od::WinogradScope scope(wino == 1);
          ms[wino] = chorus_ms(l, batch, warmup, reps);
          if (wino == 1) {
            const chorus::kernels::Window2d win{.in_h = l.hw, .in_w = l.hw, .out_h = l.hw, .out_w = l.hw,
                                                .kernel_h = 3, .kernel_w = 3, .pad_h = 1, .pad_w = 1};
            impl = od::implementation(chorus::randn({batch, l.c_in, l.hw, l.hw}), chorus::randn({l.c_out, l.c_in, 3, 3}),
                                      win, 1);
          }
        }
        const double mt = torch_ms(l, batch, warmup, reps);
        std::printf("| %s | %lld | %d | %.3f | %.3f (%s) | %.3f | %.2f | %.2f |\n", l.name,
                    static_cast<long long>(batch), threads, ms[0], ms[1], impl.c_str(), mt, ms[1] / ms[0], ms[1] / mt);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10, warmup = 3;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--winograd")) return winograd_table(warmup, reps);
  std::printf("ResNet-18 convolutions, forward + backward (input and weight gradients), float32, median of %d after %d "
              "warm-up; ms\n\n| layer | batch | threads | chorus oneDNN | chorus im2col | libtorch | oneDNN / libtorch "
              "|\n|---|---|---|---|---|---|---|\n",
              reps, warmup);
  double sum_dnnl = 0, sum_im2col = 0, sum_torch = 0;
  for (int threads : {1, 2}) {
    chorus::set_num_threads(threads);
    torch::set_num_threads(threads);
    for (int64_t batch : {1, 16, 32}) {
      for (const Layer& l : kLayers) {
        double ms[2];
        for (int path = 0; path < 2; ++path) {
          chorus::kernels::cpu::onednn::set_enabled(path == 0);
          ms[path] = chorus_ms(l, batch, warmup, reps);
        }
        chorus::kernels::cpu::onednn::set_enabled(true);
        const double mt = torch_ms(l, batch, warmup, reps);
        sum_dnnl += ms[0];
        sum_im2col += ms[1];
        sum_torch += mt;
        std::printf("| %s | %lld | %d | %.3f | %.3f | %.3f | %.2f |\n", l.name, static_cast<long long>(batch), threads,
                    ms[0], ms[1], mt, ms[0] / mt);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\nTotal over the table: chorus oneDNN %.1f ms, chorus im2col %.1f ms, libtorch %.1f ms "
              "(oneDNN / libtorch %.2f, im2col / libtorch %.2f)\n",
              sum_dnnl, sum_im2col, sum_torch, sum_dnnl / sum_torch, sum_im2col / sum_torch);
  return 0;
}
