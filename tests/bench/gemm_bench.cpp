// SGEMM GFLOP/s of chorus's CPU matmul against OpenBLAS 0.3.21 (OpenMP build) and oneDNN 2.6's
// dnnl_sgemm in the same run, square 256..2048 and 4096x768x768 (a BERT-base projection), on 1 and 2 threads; and
// the products of a BERT-mini's, a BERT-small's and the MLP's training steps with their transposes, at 1 thread;
// elementwise add GB/s
// on 16M floats against memcpy (the memory-bandwidth ceiling).
//
//   bazel run -c opt //tests/bench:gemm_bench
//   bazel run -c opt //tests/bench:gemm_bench -- --aligned-b   (only oneDNN against OpenBLAS with B
//                                                               aligned and not: aligned_b_table)
//   bazel run -c opt //tests/bench:gemm_bench -- --steps       (only the training steps' products)
//   bazel run -c opt //tests/bench:gemm_bench -- --steps --threads 2   (the same at 2 threads; BERT-mini's
//                                                               attention table is 1 thread only)
//   bazel run -c opt //tests/bench:gemm_bench -- --attention   (only BERT-mini's per-head attention products)
//   bazel run -c opt //tests/bench:gemm_bench -- --split       (products reading B transposed, 2 threads:
//                                                               chorus's split against oneDNN's own call)
//   bazel run -c opt //tests/bench:gemm_bench -- --matmul-primitive  (dnnl_sgemm against oneDNN's matmul
//                                                               primitive on the training steps' products)
#include <cblas.h>
#include <dnnl.h>
#include <dnnl.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tests/bench/bench_util.h"

extern "C" void openblas_set_num_threads(int);

using namespace chorus;

// The products of one training step, with the transposes autograd hands to matmul: a "T" operand is
// the transpose of a row-major tensor (x.t()), as Linear's backward passes grad_out^T and weight^T.
// 1 thread (`--steps --threads T`: T); calls are per step, so the last columns add up to the step's
// matrix-product time.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Product {
  char ta, tb;
  int64_t m, n, k, calls;
};

template <size_t N>
void step_products(const char* title, const Product (&step)[N], int threads) {
  std::printf("\n%s, %d thread%s: C[m,n] = op(A) op(B), GFLOP/s (medians of 9 interleaved rounds) and ms per step\n\n",
              title, threads, threads == 1 ? "" : "s");
  std::printf("| op | m | n | k | calls | chorus | OpenBLAS | oneDNN sgemm | chorus / faster library (time) | chorus ms | "
              "faster library ms |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  set_num_threads(threads);
  openblas_set_num_threads(threads);
  double chorus_ms = 0, best_ms = 0;
  for (const Product& s : step) {
    manual_seed(1);
    // Stored row-major as A [m,k] or, transposed, [k,m]; B [k,n] or [n,k].
    Tensor as = s.ta == 'T' ? randn({s.k, s.m}) : randn({s.m, s.k}), bs = s.tb == 'T' ? randn({s.n, s.k}) : randn({s.k, s.n});
    Tensor a = s.ta == 'T' ? as.t() : as, b = s.tb == 'T' ? bs.t() : bs, c = empty({s.m, s.n});
    const int64_t lda = s.ta == 'T' ? s.m : s.k, ldb = s.tb == 'T' ? s.k : s.n;
    const auto trans = [](char t) { return t == 'T' ? CblasTrans : CblasNoTrans; };
    const double flop = 2.0 * s.m * s.k * s.n;
    // Each round times the three back to back: this VM's speed drifts between runs by a third, so
    // only times taken side by side compare (docs/benchmarks.md).
    std::vector<double> tc, to, td, ratio;
    for (int round = 0; round < 9; ++round) {
      tc.push_back(bench::median_time([&] { c = matmul(a, b); }, 1, 3));
      to.push_back(bench::median_time(
          [&] {
            cblas_sgemm(CblasRowMajor, trans(s.ta), trans(s.tb), s.m, s.n, s.k, 1.0f, as.data_ptr<float>(), lda,
                        bs.data_ptr<float>(), ldb, 0.0f, c.data_ptr<float>(), s.n);
          },
          1, 3));
      td.push_back(bench::median_time(
          [&] {
            dnnl_sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, as.data_ptr<float>(), lda, bs.data_ptr<float>(), ldb, 0.0f,
                       c.data_ptr<float>(), s.n);
          },
          1, 3));
      ratio.push_back(tc.back() / std::min(to.back(), td.back()));
    }
    const double mc = median(tc), mo = median(to), md = median(td);
    chorus_ms += mc * s.calls * 1e3;
    best_ms += std::min(mo, md) * s.calls * 1e3;
    std::printf("| %c%c | %lld | %lld | %lld | %lld | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", s.ta, s.tb,
                (long long)s.m, (long long)s.n, (long long)s.k, (long long)s.calls, flop / mc / 1e9, flop / mo / 1e9,
                flop / md / 1e9, median(ratio), mc * s.calls * 1e3, std::min(mo, md) * s.calls * 1e3);
    std::fflush(stdout);
  }
  std::printf("| all | | | | | | | | | %.2f | %.2f |\n", chorus_ms, best_ms);
}

// oneDNN 2.6's AVX2 sgemm against OpenBLAS on products C = A B with A and B plain (not transposed),
// with B at a 64-byte-aligned address (as chorus's CPU tensors are) and 16 bytes off it, 1 thread:
// the case kernels/cpu/gemm.cpp's plain_b_collides sends to OpenBLAS. Each round times both libraries
// back to back (median of 5 calls each); the table gives each rate's median over the rounds and the
// median, smallest and largest of the rounds' time ratios. Buffers from aligned_alloc, uniform values.
void aligned_b_table() {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{128, 512, 256}, {146, 512, 30522}, {512, 512, 512}, {128, 512, 784}, {256, 1024, 512},
                          {32, 2048, 512},  {128, 3072, 256},   {128, 768, 256}, {146, 256, 30522}, {640, 512, 512},
                          {1024, 512, 512}, {16, 512, 512},     {128, 512, 10}};
  set_num_threads(1);
  openblas_set_num_threads(1);
  std::printf("\noneDNN's sgemm against OpenBLAS, C[m,n] = A[m,k] B[k,n], all row-major and dense, 1 thread, "
              "oneDNN capability %s: GFLOP/s and oneDNN's time / OpenBLAS's\n\n",
              (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core ? "AVX-512"
                                                                                                     : "AVX2 or less");
  std::printf("| m | n | k | B's address | oneDNN | OpenBLAS | oneDNN / OpenBLAS time (min, max) |\n"
              "|---|---|---|---|---|---|---|\n");
  const int rounds = 11;
  for (const Shape& s : shapes) {
    for (int64_t offset : {0, 4}) {  // in floats: 0 or 16 bytes past a 64-byte boundary
      auto buffer = [](int64_t count) {
        float* p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((count + 16) * 4 + 63) / 64 * 64));
        for (int64_t i = 0; i < count + 16; ++i) p[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
        return p;
      };
      float *a = buffer(s.m * s.k), *b = buffer(s.k * s.n), *c = buffer(s.m * s.n);
      const float* bb = b + offset;
      std::vector<double> onednn, openblas, ratio;
      for (int r = 0; r < rounds; ++r) {
        const double td = bench::median_time(
            [&] { dnnl_sgemm('N', 'N', s.m, s.n, s.k, 1.0f, a, s.k, bb, s.n, 0.0f, c, s.n); }, 1, 5);
        const double to = bench::median_time(
            [&] {
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a, s.k, bb, s.n, 0.0f, c, s.n);
            },
            1, 5);
        const double flop = 2.0 * s.m * s.n * s.k;
        onednn.push_back(flop / td / 1e9);
        openblas.push_back(flop / to / 1e9);
        ratio.push_back(td / to);
      }
      std::printf("| %lld | %lld | %lld | %s | %.1f | %.1f | %.2f (%.2f, %.2f) |\n", (long long)s.m, (long long)s.n,
                  (long long)s.k, offset == 0 ? "64-byte aligned" : "16 bytes off", median(onednn), median(openblas),
                  median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()));
      std::fflush(stdout);
      std::free(a);
      std::free(b);
      std::free(c);
    }
  }
}

// BERT-mini's attention products, one head at a time (32 heads of 128 tokens x 64 a layer, 4 layers:
// 128 calls of each), dense here (in the step they are views of the heads' projections): forward
// S = Q K^T and O = P V; backward dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q.
void attention_table() {
  const Product attention[] = {{'N', 'T', 128, 128, 64, 128}, {'N', 'N', 128, 64, 128, 128},
                               {'N', 'T', 128, 128, 64, 128}, {'T', 'N', 128, 64, 128, 128},
                               {'N', 'N', 128, 64, 128, 128}, {'T', 'N', 128, 64, 128, 128}};
  step_products("BERT-mini's attention products, one head a call", attention, 1);
}

// The products of one BERT-mini masked-LM training step (train_step_bench's, batch 8 x 128 tokens,
// 146 of them predicted).
const Product kBertMiniStep[] = {{'T', 'N', 256, 1024, 1024, 4}, {'T', 'N', 1024, 256, 1024, 4}, {'T', 'N', 30522, 256, 146, 1},
                                 {'N', 'T', 146, 30522, 256, 1}, {'T', 'N', 256, 256, 1024, 16}, {'N', 'T', 1024, 256, 1024, 4},
                                 {'N', 'N', 1024, 256, 1024, 4}, {'N', 'N', 146, 256, 30522, 1},  {'N', 'T', 1024, 256, 256, 16},
                                 {'N', 'N', 1024, 256, 256, 16}, {'N', 'T', 1024, 1024, 256, 4},  {'N', 'N', 1024, 1024, 256, 4}};
// BERT-small (4 layers, hidden 512, feed-forward 2048), the same batch: forward x W^T, the input
// gradients g W, the weight gradients g^T x.
const Product kBertSmallStep[] = {
    {'N', 'T', 1024, 512, 512, 16},  {'N', 'T', 1024, 2048, 512, 4}, {'N', 'T', 1024, 512, 2048, 4},
    {'N', 'T', 146, 30522, 512, 1},  {'N', 'N', 1024, 512, 512, 16}, {'N', 'N', 1024, 512, 2048, 4},
    {'N', 'N', 1024, 2048, 512, 4},  {'N', 'N', 146, 512, 30522, 1}, {'T', 'N', 512, 512, 1024, 16},
    {'T', 'N', 2048, 512, 1024, 4},  {'T', 'N', 512, 2048, 1024, 4}, {'T', 'N', 30522, 512, 146, 1}};
// train_step_bench's MLP (784-512-256-10, batch 128): forward x W^T, then per layer the input
// gradient g W (not for the first) and the weight gradient g^T h.
const Product kMlpStep[] = {{'N', 'T', 128, 512, 784, 1}, {'N', 'T', 128, 256, 512, 1}, {'N', 'T', 128, 10, 256, 1},
                            {'N', 'N', 128, 256, 10, 1},  {'T', 'N', 10, 256, 128, 1},  {'N', 'N', 128, 512, 256, 1},
                            {'T', 'N', 256, 512, 128, 1}, {'T', 'N', 512, 784, 128, 1}};

// The products of the training steps of train_step_bench's BERT-mini, BERT-small and MLP.
void step_tables(int threads) {
  step_products("BERT-mini's training-step products", kBertMiniStep, threads);
  if (threads == 1) attention_table();
  step_products("BERT-small's training-step products", kBertSmallStep, threads);
  step_products("The MLP's training-step products (train_step_bench, batch 128)", kMlpStep, threads);
}

// --split [--threads T]: products that read B transposed (Linear's forward, x W^T) at the training
// steps' sizes and around them, T threads (2 by default): chorus splits them by hand where oneDNN
// runs AVX-512 code ([Products split by hand], kernels/cpu/gemm.cpp), against oneDNN's own
// multi-threaded call and OpenBLAS's. The 100x300x200 and 64x64x64 rows are below the split's
// bound (chorus's column is oneDNN's call there).
const Product kSplitShapes[] = {
    {'N', 'T', 128, 512, 784, 1},    {'N', 'T', 128, 256, 512, 1},    {'N', 'T', 1024, 256, 1024, 1},
    {'N', 'T', 146, 30522, 256, 1},  {'N', 'T', 1024, 512, 512, 1},   {'N', 'T', 1024, 2048, 512, 1},
    {'N', 'T', 1024, 512, 2048, 1},  {'N', 'T', 146, 30522, 512, 1},  {'N', 'T', 4096, 768, 768, 1},
    {'N', 'T', 4096, 3072, 768, 1},  {'N', 'T', 4096, 768, 3072, 1},  {'N', 'T', 32, 512, 512, 1},
    {'N', 'T', 512, 128, 4096, 1},   {'N', 'T', 2048, 64, 2048, 1},   {'N', 'T', 256, 256, 256, 1},
    {'N', 'T', 100, 300, 200, 1},    {'N', 'T', 64, 64, 64, 1}};

// --matmul-primitive: oneDNN 2.6's matmul primitive (on an AVX-512 CPU its brgemm implementation,
// "brg:avx512_core"; the name is printed) against the dnnl_sgemm chorus calls, on the same
// training-step products, 1 thread, the same operands and strides (a "T" operand is a transposed
// view, given to the primitive as strides). The primitive is made once per shape, as a cache of
// primitives would hold it; each round times both back to back (median of 3 calls each), 9 rounds.
// Whether a second oneDNN path would make the products faster (docs/benchmarks.md, session 51).
template <size_t N>
void matmul_primitive_products(const char* title, const Product (&step)[N]) {
  std::printf("\n%s, 1 thread: dnnl_sgemm against oneDNN's matmul primitive, GFLOP/s (medians of 9 interleaved rounds)\n\n",
              title);
  std::printf("| op | m | n | k | calls | dnnl_sgemm | matmul primitive | primitive / sgemm (time, median of rounds) | "
              "max abs difference | implementation |\n|---|---|---|---|---|---|---|---|---|---|\n");
  set_num_threads(1);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  double sgemm_ms = 0, primitive_ms = 0;
  for (const Product& s : step) {
    manual_seed(1);
    Tensor as = s.ta == 'T' ? randn({s.k, s.m}) : randn({s.m, s.k}), bs = s.tb == 'T' ? randn({s.n, s.k}) : randn({s.k, s.n});
    Tensor c_sgemm = empty({s.m, s.n}), c_primitive = empty({s.m, s.n});
    const int64_t lda = s.ta == 'T' ? s.m : s.k, ldb = s.tb == 'T' ? s.k : s.n;
    using dims = dnnl::memory::dims;
    const auto f32 = dnnl::memory::data_type::f32;
    const dnnl::memory::desc a_md({s.m, s.k}, f32, s.ta == 'T' ? dims{1, s.m} : dims{s.k, 1});
    const dnnl::memory::desc b_md({s.k, s.n}, f32, s.tb == 'T' ? dims{1, s.k} : dims{s.n, 1});
    const dnnl::memory::desc c_md({s.m, s.n}, f32, dims{s.n, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    const dnnl::matmul primitive(pd);
    dnnl::memory a_mem(a_md, engine, as.data_ptr<float>()), b_mem(b_md, engine, bs.data_ptr<float>()),
        c_mem(c_md, engine, c_primitive.data_ptr<float>());
    const auto run_sgemm = [&] {
      dnnl_sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, as.data_ptr<float>(), lda, bs.data_ptr<float>(), ldb, 0.0f,
                 c_sgemm.data_ptr<float>(), s.n);
    };
    const auto run_primitive = [&] {
      primitive.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
      stream.wait();
    };
    const double flop = 2.0 * s.m * s.k * s.n;
    std::vector<double> ts, tp, ratio;
    for (int round = 0; round < 9; ++round) {
      ts.push_back(bench::median_time(run_sgemm, 1, 3));
      tp.push_back(bench::median_time(run_primitive, 1, 3));
      ratio.push_back(tp.back() / ts.back());
    }
    const double diff = max(abs(sub(c_sgemm, c_primitive))).item<double>();
    const double ms = median(ts), mp = median(tp);
    sgemm_ms += ms * s.calls * 1e3;
    primitive_ms += mp * s.calls * 1e3;
    std::printf("| %c%c | %lld | %lld | %lld | %lld | %.1f | %.1f | %.3f | %.2g | %s |\n", s.ta, s.tb, (long long)s.m,
                (long long)s.n, (long long)s.k, (long long)s.calls, flop / ms / 1e9, flop / mp / 1e9, median(ratio), diff,
                pd.impl_info_str());
    std::fflush(stdout);
  }
  std::printf("| all (ms per step) | | | | | %.2f | %.2f | %.3f | | |\n", sgemm_ms, primitive_ms, primitive_ms / sgemm_ms);
}

void matmul_primitive_tables() {
  matmul_primitive_products("The MLP's training-step products (train_step_bench, batch 128)", kMlpStep);
  matmul_primitive_products("BERT-mini's training-step products", kBertMiniStep);
  matmul_primitive_products("BERT-small's training-step products", kBertSmallStep);
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--aligned-b") {
    aligned_b_table();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--attention") {
    attention_table();
    return 0;
  }
  const bool steps = argc > 1 && std::string(argv[1]) == "--steps";
  if (steps || (argc > 1 && std::string(argv[1]) == "--split")) {
    int threads = steps ? 1 : 2;
    const bool with_threads = argc == 4 && std::string(argv[2]) == "--threads";
    if (with_threads) threads = std::atoi(argv[3]);
    if ((argc != 2 && !with_threads) || threads < 1 || threads > 256) {
      std::fprintf(stderr, "gemm_bench %s: expected nothing more or --threads T (1-256)\n", argv[1]);
      return 2;
    }
    if (steps) step_tables(threads);
    else step_products("Products reading B transposed (each shape once)", kSplitShapes, threads);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--matmul-primitive") {
    matmul_primitive_tables();
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr,
                 "gemm_bench: expected no argument, --aligned-b, --steps, --split, --attention or "
                 "--matmul-primitive, got '%s'\n",
                 argv[1]);
    return 2;
  }
  struct Size {
    int64_t m, k, n;
  };
  // Square sizes, a BERT-base projection, and the medium shapes of train_step_bench's MLP (128 x 784
  // x 512) and BERT-mini (1024 x 256 x 256, 1024 x 256 x 1024).
  const Size sizes[] = {{256, 256, 256},   {512, 512, 512},  {1024, 1024, 1024}, {2048, 2048, 2048},
                        {4096, 768, 768},  {128, 784, 512},  {1024, 256, 256},   {1024, 256, 1024}};
  {  // Half a second of work first: the CPU leaves its idle clock before anything is timed.
    Tensor a = randn({512, 512}), b = randn({512, 512});
    const double until = bench::now_s() + 0.5;
    while (bench::now_s() < until) a = matmul(a, b).mul(1e-3);
  }
  std::printf("SGEMM C[m,n] = A[m,k] B[k,n], float32, GFLOP/s (median after warm-up)\n\n");
  std::printf("| m x k x n | threads | chorus | OpenBLAS | oneDNN sgemm | chorus / OpenBLAS |\n|---|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    openblas_set_num_threads(threads);
    for (Size s : sizes) {
      manual_seed(1);
      Tensor a = randn({s.m, s.k}), b = randn({s.k, s.n}), c = empty({s.m, s.n});
      const double flop = 2.0 * s.m * s.k * s.n;
      const int reps = flop > 4e9 ? 5 : 25;
      const double tc = bench::median_time([&] { c = matmul(a, b); }, 5, reps);
      const double to = bench::median_time(
          [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data_ptr<float>(), s.k,
                        b.data_ptr<float>(), s.n, 0.0f, c.data_ptr<float>(), s.n);
          },
          5, reps);
      const double td = bench::median_time(
          [&] {
            dnnl_sgemm('N', 'N', s.m, s.n, s.k, 1.0f, a.data_ptr<float>(), s.k, b.data_ptr<float>(), s.n, 0.0f,
                       c.data_ptr<float>(), s.n);
          },
          5, reps);
      std::printf("| %lld x %lld x %lld | %d | %.1f | %.1f | %.1f | %.2f |\n", (long long)s.m, (long long)s.k,
                  (long long)s.n, threads, flop / tc / 1e9, flop / to / 1e9, flop / td / 1e9, to / tc);
      std::fflush(stdout);
    }
  }
  step_tables(1);

  std::printf("\nElementwise add c = a + b on 16M float32 (3 x 64 MiB touched), GB/s\n\n");
  std::printf("| threads | chorus add | memcpy 64 MiB (2 x 64 MiB touched) |\n|---|---|---|\n");
  const int64_t n = 16 << 20;
  Tensor a = randn({n}), b = randn({n}), c = empty({n});
  std::vector<float> src(n, 1.0f), dst(n);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const double ta = bench::median_time([&] { c = add(a, b); }, 3, 15);
    const double tm = bench::median_time([&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); }, 3, 15);
    std::printf("| %d | %.1f | %.1f |\n", threads, 3.0 * n * 4 / ta / 1e9, 2.0 * n * 4 / tm / 1e9);
  }
  return 0;
}
