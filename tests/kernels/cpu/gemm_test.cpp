// The float32 products that read A transposed (kernels/cpu/gemm.cpp, every weight gradient): through
// OpenBLAS (TransposedGemm::kAuto where oneDNN runs AVX2 code) and through oneDNN's own paths
// (kOneDnn: A copied row-major first for a tall C, C^T = B^T A for a wide one), each against the
// float64 product (Eigen's, a third implementation), at 1 and 2 threads, with A read from a slice of
// a wider tensor, B plain and transposed, alpha and beta; the route kAuto and kOneDnn take
// (sgemm_route), kAuto's result bit for bit that library's own call (cblas_sgemm where oneDNN runs
// AVX2 code, dnnl_sgemm where it runs AVX-512); and products from several threads at once (OpenBLAS's
// OpenMP build shares its buffers between concurrent callers: chorus serializes its calls).
#include <catch2/catch.hpp>
#include <cblas.h>
#include <dnnl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/kernels.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

// kernels/cpu/gemm.cpp defines these (why there is no header for them: [No header] there).
namespace chorus::kernels::cpu {
enum class GemmRoute : int { kOpenBlas, kOneDnn, kCopyA, kTransposeC, kSplitC };
GemmRoute sgemm_route(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_row_major, bool c_row_major,
                      bool beta_zero, int64_t ldb, bool b_aligned);
}  // namespace chorus::kernels::cpu

namespace kc = chorus::kernels::cpu;
using namespace chorus;

namespace {

// Restores kAuto and the thread count however a test case ends.
struct GemmGuard {
  int threads = get_num_threads();
  ~GemmGuard() {
    kc::set_transposed_gemm(kc::TransposedGemm::kAuto);
    set_num_threads(threads);
  }
};

std::vector<double> values(const Tensor& t) {
  Tensor d = t.to(kFloat64).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// The largest |got - want| over the elements, and the bound: k float32 roundings of products of
// N(0, 1) values (each |a b| below about 20) summed in any order, with room for alpha and beta.
void check_close(const Tensor& got, const Tensor& want, int64_t k, const std::string& what) {
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> g = values(got), w = values(want);
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
  const double bound = 4.0 * static_cast<double>(k) * std::ldexp(1.0, -24) * 20.0;
  INFO(what << ": largest difference from the float64 product " << worst << ", bound " << bound);
  CHECK(worst <= bound);
  CHECK(worst > 0.0);  // float32 sums of 256+ random products always round somewhere: the reference is float64
}

// A rows x cols float32 view whose rows are contiguous (a transposed slice of a wider tensor, storage
// offset 5), as Linear's grad_out^T is.
Tensor transposed_slice(int64_t rows, int64_t cols) {
  Tensor wide = randn({cols, rows + 70});
  return wide.slice(1, 5, 5 + rows).t();
}

}  // namespace

TEST_CASE("Transposed-A float32 products match the float64 product through every path", "[cpu][gemm]") {
  GemmGuard guard;
  manual_seed(11);
  struct Shape3 {
    int64_t m, k, n;
    const char* path;  // what kOneDnn does with it
  };
  const Shape3 shapes[] = {{600, 260, 130, "A copied row-major (tall C)"},
                           {130, 260, 600, "C^T = B^T A (wide C)"},
                           {256, 512, 256, "oneDNN's transposed read"}};
  for (kc::TransposedGemm choice : {kc::TransposedGemm::kAuto, kc::TransposedGemm::kOneDnn}) {
    kc::set_transposed_gemm(choice);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (const Shape3& s : shapes) {
        const std::string what = std::string(choice == kc::TransposedGemm::kAuto ? "kAuto" : "kOneDnn") + ", " +
                                 std::to_string(threads) + " thread(s), " + std::to_string(s.m) + " x " +
                                 std::to_string(s.k) + " x " + std::to_string(s.n) + " (" + s.path + ")";
        Tensor a = transposed_slice(s.m, s.k);
        Tensor b = randn({s.k, s.n});
        Tensor bt = randn({s.n, s.k}).t();  // B read transposed as well
        const Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64), bt64 = bt.to(kFloat64);
        check_close(mm(a, b), mm(a64, b64), s.k, what + ", A^T B");
        check_close(mm(a, bt), mm(a64, bt64), s.k, what + ", A^T B^T");
        // addmm: beta * bias + alpha * A B, bias broadcast over the rows.
        Tensor bias = randn({s.n});
        check_close(addmm(bias, a, b, 0.5, 2.0), addmm(bias.to(kFloat64), a64, b64, 0.5, 2.0), 2 * s.k,
                    what + ", addmm beta 0.5 alpha 2");
      }
    }
  }
}

// A B as one library's own call computes it, OpenBLAS's or oneDNN's (b: k x n dense; a: m x k,
// either the transposed slice of transposed_slice, read as A^T, or dense row-major).
std::vector<float> library_product(const Tensor& a, const Tensor& b, bool openblas) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const bool a_transposed = a.stride(0) == 1;
  const int64_t lda = a_transposed ? a.stride(1) : a.stride(0);
  std::vector<float> c(static_cast<size_t>(m * n));
  if (openblas) {
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, a_transposed ? CblasTrans : CblasNoTrans, CblasNoTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a.data_ptr<float>(), static_cast<blasint>(lda),
                b.data_ptr<float>(), static_cast<blasint>(n), 0.0f, c.data(), static_cast<blasint>(n));
  } else {
    REQUIRE(dnnl_sgemm(a_transposed ? 'T' : 'N', 'N', m, n, k, 1.0f, a.data_ptr<float>(), lda, b.data_ptr<float>(), n,
                       0.0f, c.data(), n) == dnnl_success);
  }
  return c;
}

// How many elements of `got` differ, bit for bit, from that library's product.
int64_t differ_from(const Tensor& got, const Tensor& a, const Tensor& b, bool openblas) {
  const std::vector<float> want = library_product(a, b, openblas);
  const float* g = got.data_ptr<float>();
  int64_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += g[i] != want[i];
  return differ;
}

TEST_CASE("kAuto: OpenBLAS for weight gradients under AVX2, oneDNN's plain call under AVX-512", "[cpu][gemm]") {
  GemmGuard guard;
  manual_seed(14);
  set_num_threads(1);
  const bool onednn_avx2 = !kc::cpu_has_avx512() || std::string(kc::requested_capability()) == "avx2";
  using R = kc::GemmRoute;
  // {m, k, n}, the workaround kOneDnn takes: the MLP's second weight gradient (C twice as wide as
  // tall, k = 128 < 256), a tall C with k >= 256, a wide one with k >= 256.
  struct Case {
    int64_t m, k, n;
    R workaround;
  };
  const Case cases[] = {{256, 128, 512, R::kTransposeC}, {600, 260, 130, R::kCopyA}, {256, 1024, 1024, R::kTransposeC}};
  for (const Case& s : cases) {
    INFO(s.m << " x " << s.k << " x " << s.n << (onednn_avx2 ? ", oneDNN runs AVX2 code" : ", oneDNN runs AVX-512 code"));
    const R want = onednn_avx2 ? R::kOpenBlas : R::kOneDnn;
    CHECK(kc::sgemm_route(s.m, s.n, s.k, true, true, true, true, s.n, true) == want);
    // The result is that library's own, bit for bit (the 1024-wide case: the route only, to keep the
    // test quick).
    if (s.k < 1024) {
      Tensor a = transposed_slice(s.m, s.k);
      Tensor b = randn({s.k, s.n});
      CHECK(differ_from(mm(a, b), a, b, /*openblas=*/onednn_avx2) == 0);
    }
    kc::set_transposed_gemm(kc::TransposedGemm::kOneDnn);
    CHECK(kc::sgemm_route(s.m, s.n, s.k, true, true, true, true, s.n, true) == s.workaround);
    // And kOneDnn leaves OpenBLAS (it copies A and calls oneDNN): seen where the two libraries round
    // the product differently, as in the plain-B case below.
    if (onednn_avx2 && s.workaround == R::kCopyA) {
      Tensor a = transposed_slice(s.m, s.k);
      Tensor b = randn({s.k, s.n});
      if (library_product(a, b, true) != library_product(a.contiguous(), b, false))
        CHECK(differ_from(mm(a, b), a, b, /*openblas=*/true) > 0);
      else
        std::printf("CHORUS-SKIP: oneDNN and OpenBLAS gave the same bits for %lld x %lld x %lld, so the result cannot "
                    "show which library kOneDnn ran (the route was checked)\n",
                    static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n));
    }
    // With beta != 0 (C^T would overwrite C), the wide C stays with oneDNN.
    if (s.workaround == R::kTransposeC)
      CHECK(kc::sgemm_route(s.m, s.n, s.k, true, true, true, false, s.n, true) == R::kOneDnn);
    kc::set_transposed_gemm(kc::TransposedGemm::kAuto);
  }
  // Not a weight gradient: A read as it is, or a small product.
  CHECK(kc::sgemm_route(600, 130, 260, false, true, true, true, 130, true) == R::kOneDnn);
  CHECK(kc::sgemm_route(64, 512, 128, true, true, true, true, 512, true) == R::kOneDnn);
  // A tall C with k < 256 (the masked-LM decoder's gradient, 30522 x 146 x 256) stays with oneDNN.
  CHECK(kc::sgemm_route(30522, 256, 146, true, true, true, true, 256, true) == R::kOneDnn);
}

TEST_CASE("kAuto: OpenBLAS under AVX2 for plain products whose aligned B has rows 512 floats apart", "[cpu][gemm]") {
  GemmGuard guard;
  manual_seed(15);
  set_num_threads(1);
  const bool onednn_avx2 = !kc::cpu_has_avx512() || std::string(kc::requested_capability()) == "avx2";
  using R = kc::GemmRoute;
  const R want = onednn_avx2 ? R::kOpenBlas : R::kOneDnn;
  INFO((onednn_avx2 ? "oneDNN runs AVX2 code" : "oneDNN runs AVX-512 code"));
  // The MLP's second input gradient (m=128 n=512 k=256), BERT-small's decoder's (146 x 512 x 30522),
  // rows 1024 and 2048 floats apart.
  CHECK(kc::sgemm_route(128, 512, 256, false, true, true, true, 512, true) == want);
  CHECK(kc::sgemm_route(146, 512, 30522, false, true, true, false, 512, true) == want);
  CHECK(kc::sgemm_route(256, 1024, 512, false, true, true, true, 1024, true) == want);
  CHECK(kc::sgemm_route(32, 2048, 512, false, true, true, true, 2048, true) == want);
  // Where oneDNN's plain call ran as fast or faster (docs/data/gemm_aligned_b_zen3_2026-12-01.txt): B
  // 16 bytes off a 32-byte boundary, rows 768 floats apart, C with 640 or 16 rows, k = 10; and B read
  // transposed.
  CHECK(kc::sgemm_route(128, 512, 256, false, true, true, true, 512, false) == R::kOneDnn);
  CHECK(kc::sgemm_route(128, 768, 256, false, true, true, true, 768, true) == R::kOneDnn);
  CHECK(kc::sgemm_route(640, 512, 512, false, true, true, true, 512, true) == R::kOneDnn);
  CHECK(kc::sgemm_route(16, 512, 512, false, true, true, true, 512, true) == R::kOneDnn);
  CHECK(kc::sgemm_route(128, 512, 10, false, true, true, true, 512, true) == R::kOneDnn);
  CHECK(kc::sgemm_route(128, 512, 256, false, false, true, true, 256, true) == R::kOneDnn);
  // kOneDnn keeps oneDNN's own call on every CPU.
  kc::set_transposed_gemm(kc::TransposedGemm::kOneDnn);
  CHECK(kc::sgemm_route(128, 512, 256, false, true, true, true, 512, true) == R::kOneDnn);
  kc::set_transposed_gemm(kc::TransposedGemm::kAuto);

  // mm takes the route: CPU tensors start 64-byte aligned, so B = randn({256, 512}) is such a B. The
  // result is that library's own, bit for bit, and within float32 rounding of the float64 product.
  Tensor a = randn({128, 256}), b = randn({256, 512});
  REQUIRE(reinterpret_cast<uintptr_t>(b.data_ptr<float>()) % 32 == 0);
  const Tensor c = mm(a, b);
  CHECK(differ_from(c, a, b, /*openblas=*/onednn_avx2) == 0);
  check_close(c, mm(a.to(kFloat64), b.to(kFloat64)), 256, "128 x 256 x 512, kAuto");
  // Under AVX2, kOneDnn's result is oneDNN's. The results tell the libraries apart only where they
  // round differently: on an AVX-512 Zen 5 with AVX2 imposed (CHORUS_CPU_CAPABILITY=avx2), oneDNN's
  // and OpenBLAS's 128 x 256 x 512 agreed bit for bit, so deeper products are tried too.
  if (onednn_avx2) {
    kc::set_transposed_gemm(kc::TransposedGemm::kOneDnn);
    bool told_apart = false;
    for (const int64_t k : {256, 1000, 3000}) {
      const Tensor a1 = randn({128, k}), b1 = randn({k, 512});
      REQUIRE(kc::sgemm_route(128, 512, k, false, true, true, true, 512, true) == R::kOneDnn);
      const Tensor c1 = mm(a1, b1);
      CHECK(differ_from(c1, a1, b1, /*openblas=*/false) == 0);
      if (library_product(a1, b1, true) == library_product(a1, b1, false)) continue;
      CHECK(differ_from(c1, a1, b1, /*openblas=*/true) > 0);
      told_apart = true;
      break;
    }
    if (!told_apart)
      std::printf("CHORUS-SKIP: oneDNN and OpenBLAS gave the same bits for 128 x k x 512, k = 256, 1000 and 3000, so "
                  "the results cannot show which library kOneDnn ran (the routes were checked)\n");
  }
}

TEST_CASE("Transposed-A products from several threads at once give each thread the serial result", "[cpu][gemm]") {
  GemmGuard guard;
  manual_seed(13);
  set_num_threads(2);
  const int64_t m = 600, k = 260, n = 130;
  Tensor a = transposed_slice(m, k);
  std::vector<Tensor> bs;
  std::vector<Tensor> serial;
  for (int t = 0; t < 4; ++t) {
    bs.push_back(randn({k, n}));
    serial.push_back(mm(a, bs.back()));
  }
  std::vector<int64_t> differ(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        Tensor c = mm(a, bs[static_cast<size_t>(t)]);
        const float* p = c.data_ptr<float>();
        const float* q = serial[static_cast<size_t>(t)].data_ptr<float>();
        for (int64_t i = 0; i < m * n; ++i) differ[static_cast<size_t>(t)] += p[i] != q[i];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    INFO("thread " << t << ": " << differ[static_cast<size_t>(t)] << " elements differ from the serial product");
    CHECK(differ[static_cast<size_t>(t)] == 0);
  }
}

// [Products split by hand] (gemm.cpp): where oneDNN runs AVX-512 code, a product that reads B
// transposed (Linear's forward, x W^T) at 2+ threads is split into one block of C per thread, each a
// single-threaded dnnl_sgemm. At these shapes the result is oneDNN's 1-thread call bit for bit
// (oneDNN's own 2-thread call sums in another order at some shapes, 128x784x512 here) and within
// float32 rounding of the float64 product: column blocks (128x784x512), uneven ones (40x300x1000),
// row blocks of uneven height (601x260x130), A and B read from slices of wider tensors, and C a
// slice of a wider tensor with beta 1 (a block written twice, or a guard column touched, shows).
TEST_CASE("Products reading B transposed are split by hand at 2 threads: one thread's bits", "[cpu][gemm]") {
  GemmGuard guard;
  manual_seed(16);
  using R = kc::GemmRoute;
  // As gemm.cpp asks it: oneDNN's own answer, after CHORUS_CPU_CAPABILITY's cap.
  const bool onednn_avx512 = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  set_num_threads(2);
  if (!onednn_avx512) {  // no split for oneDNN's AVX2 (or older) code: it was as often slower there
    CHECK(kc::sgemm_route(128, 512, 784, false, false, true, true, 784, true) == R::kOneDnn);
    std::printf("CHORUS-SKIP: oneDNN runs no AVX-512 code here, where products are not split; only the route was "
                "checked\n");
    return;
  }
  // The route: B transposed, A plain, C row-major, 2 threads, 2^23 multiply-adds or more, blocks of
  // at least 128 columns or 16 rows.
  CHECK(kc::sgemm_route(128, 512, 784, false, false, true, true, 784, true) == R::kSplitC);
  CHECK(kc::sgemm_route(146, 30522, 256, false, false, true, false, 256, true) == R::kSplitC);
  CHECK(kc::sgemm_route(100, 300, 200, false, false, true, true, 200, true) == R::kOneDnn);  // 6M: too small
  CHECK(kc::sgemm_route(24, 16, 32768, false, false, true, true, 32768, true) == R::kOneDnn);  // 12-row blocks
  CHECK(kc::sgemm_route(64, 200, 1024, false, false, true, true, 1024, true) == R::kOneDnn);  // 100-column blocks
  CHECK(kc::sgemm_route(128, 512, 784, false, true, true, true, 512, true) == R::kOneDnn);   // B plain
  CHECK(kc::sgemm_route(128, 512, 784, true, false, true, true, 784, true) == R::kOneDnn);   // A transposed
  CHECK(kc::sgemm_route(128, 512, 784, false, false, false, true, 784, true) == R::kOneDnn);  // C column-major
  kc::set_transposed_gemm(kc::TransposedGemm::kOneDnn);
  CHECK(kc::sgemm_route(128, 512, 784, false, false, true, true, 784, true) == R::kOneDnn);
  kc::set_transposed_gemm(kc::TransposedGemm::kAuto);
  set_num_threads(1);
  CHECK(kc::sgemm_route(128, 512, 784, false, false, true, true, 784, true) == R::kOneDnn);

  struct Shape3 {
    int64_t m, k, n;
  };
  const Shape3 shapes[] = {{128, 784, 512}, {40, 300, 1000}, {601, 260, 130}};
  bool own_call_differs = false;
  for (const Shape3& s : shapes) {
    INFO(s.m << " x " << s.k << " x " << s.n);
    Tensor a = randn({s.m, s.k + 9}).slice(1, 4, 4 + s.k);  // rows k + 9 floats apart
    Tensor w = randn({s.n, s.k + 7}).slice(1, 2, 2 + s.k);  // B^T's rows k + 7 floats apart
    Tensor bt = w.t();
    const int64_t lda = a.stride(0), ldb = w.stride(0);
    // oneDNN's 1-thread call, made here.
    std::vector<float> one(static_cast<size_t>(s.m * s.n));
    set_num_threads(1);
    REQUIRE(dnnl_sgemm('N', 'T', s.m, s.n, s.k, 1.0f, a.data_ptr<float>(), lda, w.data_ptr<float>(), ldb, 0.0f,
                       one.data(), s.n) == dnnl_success);
    set_num_threads(2);
    REQUIRE(kc::sgemm_route(s.m, s.n, s.k, false, false, true, true, ldb, true) == R::kSplitC);
    const Tensor c = mm(a, bt);
    const float* p = c.data_ptr<float>();
    int64_t differ = 0;
    for (size_t i = 0; i < one.size(); ++i) differ += p[i] != one[i];
    CHECK(differ == 0);
    const Tensor a64 = a.to(kFloat64), bt64 = bt.to(kFloat64);
    check_close(c, mm(a64, bt64), s.k, "split by hand");
    Tensor bias = randn({s.n});
    check_close(addmm(bias, a, bt, 0.5, 2.0), addmm(bias.to(kFloat64), a64, bt64, 0.5, 2.0), 2 * s.k,
                "split by hand, addmm beta 0.5 alpha 2");
    // C a slice of a wider tensor (3 guard columns before, 7 after), beta 1: against oneDNN's 1-thread
    // call on a copy, every element of the wider tensor.
    Tensor wide_c = randn({s.m, s.n + 10});
    Tensor want = wide_c.clone();
    set_num_threads(1);
    REQUIRE(dnnl_sgemm('N', 'T', s.m, s.n, s.k, 1.0f, a.data_ptr<float>(), lda, w.data_ptr<float>(), ldb, 1.0f,
                       want.data_ptr<float>() + 3, s.n + 10) == dnnl_success);
    set_num_threads(2);
    kc::gemm(wide_c.slice(1, 3, 3 + s.n), a, bt, 1.0, 1.0);
    const float* got = wide_c.data_ptr<float>();
    const float* expect = want.data_ptr<float>();
    int64_t differ_wide = 0;
    for (int64_t i = 0; i < wide_c.numel(); ++i) differ_wide += got[i] != expect[i];
    CHECK(differ_wide == 0);
    // oneDNN's own 2-thread call, for the record: where it differs from one thread, the bit check above
    // is what tells the split from it.
    kc::set_transposed_gemm(kc::TransposedGemm::kOneDnn);
    const Tensor own = mm(a, bt);
    kc::set_transposed_gemm(kc::TransposedGemm::kAuto);
    const float* q = own.data_ptr<float>();
    for (size_t i = 0; i < one.size(); ++i) own_call_differs |= q[i] != one[i];
  }
  if (!own_call_differs)
    std::printf("CHORUS-SKIP: oneDNN's own 2-thread products gave one thread's bits at every shape here, so the bit "
                "check cannot tell the split from oneDNN's call (the routes and the float64 bounds were checked)\n");
}
