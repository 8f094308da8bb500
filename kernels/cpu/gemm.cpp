// Matrix products: float32 through oneDNN's dnnl_sgemm (its own run-time ISA dispatch: AVX-512 where
// the CPU has it, about twice Eigen's AVX2 rate there; gemm_bench), except the products that read A
// transposed on a CPU where oneDNN runs its AVX2 code, and those whose B that code would read at
// colliding addresses, which go to OpenBLAS (see use_openblas and plain_b_collides), and those that
// read B transposed at 2+ threads on a CPU where it runs its AVX-512 code, which are split by hand
// into one single-threaded call per thread ([Products split by hand]); everything else through
// Eigen. The libraries read a strided 2-D view in place when its columns are
// contiguous (row-major) or its rows are (a transposed view, column-major), so t() and transpose()
// cost float32 no copy; Eigen gets row-major operands only ([One Eigen product per dtype]). Views
// contiguous in neither dim are copied first.
#include <Eigen/Core>
#include <cblas.h>
#include <dnnl.h>
#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/onednn_conv.h"
#include "kernels/cpu/parallel.h"

namespace chorus::kernels::cpu {
namespace {

// A row-major Eigen map of the rows x cols view at `ptr` whose columns are contiguous (row stride rs);
// read-only for a const T.
template <typename T>
auto row_major_map(T* ptr, int64_t rows, int64_t cols, int64_t rs) {
  using Matrix = Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Mapped = std::conditional_t<std::is_const_v<T>, const Matrix, Matrix>;
  return Eigen::Map<Mapped, Eigen::Unaligned, Eigen::OuterStride<>>(ptr, rows, cols,
                                                                    Eigen::OuterStride<>(std::max<int64_t>(rs, cols)));
}

Tensor dense(const Tensor& t) {
  Tensor out = make_tensor(t.sizes(), t.dtype(), kCPU);
  copy(out, t);
  return out;
}

// Normalizes a 2-D view's strides for mapping: a size-1 dim may carry any stride.
void strides_2d(const Tensor& t, int64_t& rs, int64_t& cs) {
  rs = t.size(0) == 1 ? t.size(1) : t.stride(0);
  cs = t.size(1) == 1 ? 1 : t.stride(1);
  if (t.size(1) == 1 && t.size(0) != 1) { cs = 1; }
}

// The libraries read a view in place only when one dim is unit-stride and the other steps over whole
// rows (columns). An expanded (stride-0) or overlapping view is not such a matrix: mapping it with
// the widened outer stride would read the wrong elements (e.g. the stride-0 gradient that
// sum(dim=0) sends into mm's backward), so it is copied first.
bool mappable(const Tensor& t) {
  int64_t rs, cs;
  strides_2d(t, rs, cs);
  const int64_t rows = t.size(0), cols = t.size(1);
  return (cs == 1 && (rows == 1 || rs >= cols)) || (rs == 1 && (cols == 1 || cs >= rows));
}

// One operand for dnnl_sgemm (row-major semantics): its pointer, leading dimension, and whether it is
// used transposed, for a rows x cols view with strides (rs, cs) that is used as itself or, with
// `transpose`, as its transpose.
struct SgemmOperand {
  const float* ptr;
  int64_t ld;
  char trans;
};
SgemmOperand sgemm_operand(const float* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool transpose) {
  const bool row_major = cs == 1 || cols == 1;
  const int64_t ld = row_major ? std::max<int64_t>(rs, cols) : std::max<int64_t>(cs, rows);
  return {p, std::max<int64_t>(ld, 1), (row_major != transpose) ? 'N' : 'T'};
}

// oneDNN 2.6's sgemm reads a transposed A at about half its rate when A is tall (Zen 3, 1 thread,
// GFLOP/s: m=1024 n=256 k=1024 27-28 transposed against 54-57 not; OpenBLAS 44-62 transposed;
// docs/data/gemm_shapes_zen3_2026-11-28.txt). That is Linear's weight gradient (grad_out^T x input)
// where the layer widens (BERT's first FFN layer). Copying A into row-major order costs m*k moves
// against the product's 2*m*n*k flops. Not for square or short A, where oneDNN's transposed read
// was as fast as the copy and product (m=256 n=256 k=1024; m=30522 n=256 k=146).
bool copy_transposed_a(int64_t m, int64_t n, int64_t k) { return m >= 512 && m >= 2 * n && n >= 128 && k >= 256; }

// dst[l * ld_dst + j] = src[j * ld_src + l] for an 8 x 8 block (AVX2: this file is built with -mavx2).
inline void transpose_8x8(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  __m256 r[8], t[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + j * ld_src);
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int h = 0; h < 8; h += 4) {
    r[h] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(dst + j * ld_dst, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
    _mm256_storeu_ps(dst + (j + 4) * ld_dst, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
  }
}

// Writes the rows x cols matrix X whose element (i, p) is at src[p * ld_src + i] (X's rows are
// contiguous) to dst[i * ld_dst + p], in 8 x 8 register transposes (chorus's generic strided copy
// reads such a view column by column, at about 2.7 GB/s here). The blocks go in tiles of 16 source
// rows x 256 columns: two 8-row strips of the source are read along 1 KiB at a time (streams the
// prefetcher follows) while the 256 destination rows they fill stay in L2. Square 32 x 32 tiles, the
// first version, read 32 rows 4 KiB apart at once (one cache set at BERT's 1024-wide shapes) and ran
// at 0.5-0.8x of this (fresh destination, cold source, 1024 x 1024 and 1024 x 256, Zen 3).
void transpose_into(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  constexpr int64_t kRowsTile = 256, kColsTile = 16, kColsBand = 256;
  // Tasks are (row tile, band of 256 columns) pairs, so a matrix of one row tile still spreads over
  // the threads.
  const int64_t row_tiles = (rows + kRowsTile - 1) / kRowsTile, bands = (cols + kColsBand - 1) / kColsBand;
  parallel_for(0, row_tiles * bands, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t i0 = task / bands * kRowsTile, i1 = std::min(rows, i0 + kRowsTile);
      const int64_t band0 = task % bands * kColsBand, band1 = std::min(cols, band0 + kColsBand);
      const int64_t i8 = i0 + (i1 - i0) / 8 * 8;  // the rows the 8 x 8 blocks cover
      for (int64_t p0 = band0; p0 < band1; p0 += kColsTile) {
        const int64_t p1 = std::min(band1, p0 + kColsTile);
        int64_t p = p0;
        for (; p + 8 <= p1; p += 8) {
          for (int64_t i = i0; i < i8; i += 8) transpose_8x8(src + p * ld_src + i, ld_src, dst + i * ld_dst + p, ld_dst);
        }
        // Columns left over (cols not a multiple of 8), then rows left over (rows not a multiple of 8).
        for (int64_t i = i0; i < i8; ++i)
          for (int64_t pp = p; pp < p1; ++pp) dst[i * ld_dst + pp] = src[pp * ld_src + i];
        for (int64_t i = i8; i < i1; ++i)
          for (int64_t pp = p0; pp < p1; ++pp) dst[i * ld_dst + pp] = src[pp * ld_src + i];
      }
    }
  });
}

// The m x k float32 view a whose rows are contiguous (element (i, p) at p * cs + i), as a new
// row-major tensor.
Tensor row_major_copy(const Tensor& a, int64_t cs) {
  Tensor out = make_tensor({a.size(0), a.size(1)}, kFloat32, kCPU);
  transpose_into(static_cast<const float*>(a.raw_data_ptr()), cs, a.size(0), a.size(1),
                 static_cast<float*>(out.raw_data_ptr()), a.size(1));
  return out;
}

// The 2-D view t with its dims swapped (Tensor::t() lives above the kernels).
Tensor transposed_view(const Tensor& t) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset(), Shape{t.size(1), t.size(0)},
                                             Strides{t.stride(1), t.stride(0)}, t.dtype()));
}

// Whether oneDNN's sgemm runs its AVX2 code: the CPU has no AVX-512, or CHORUS_CPU_CAPABILITY=avx2
// capped oneDNN (onednn::configure). train_step_bench's --cpu-loops caps chorus's own loops only, so
// it does not count here.
bool onednn_runs_avx2() {
  static const bool avx2 = !cpu_has_avx512() || std::string(requested_capability()) == "avx2";
  return avx2;
}

// The products that read A transposed with C row-major, at the sizes of a weight gradient (Linear's
// grad_out^T x input: m, n >= 128), go to OpenBLAS 0.3.21 where oneDNN runs AVX2 code: there OpenBLAS
// reads the transposed A at its full rate while oneDNN's sgemm runs at half of it and the copy-first
// and C^T paths below reach 0.73-0.92 of OpenBLAS (Zen 3, 1 thread, GFLOP/s, chorus before /
// OpenBLAS: 256x1024x1024 58.1 / 79.2, 1024x256x1024 60.4 / 73.5, 256x256x1024 72.5 / 78.6;
// gemm_bench, docs/data/gemm_shapes_zen3_2026-11-29.txt); with k >= 256, or with a C at least twice as
// wide as tall, which the C^T path served (the MLP's 256x512x128 with AVX2 imposed on Zen 5: oneDNN
// 68.9, C^T 73.5, OpenBLAS 104.7; docs/data/gemm_shapes_zen5_2026-11-30.txt). Not a tall C with k <
// 256 (m=30522 n=256 k=146, the masked-LM decoder's gradient: oneDNN 65.5, OpenBLAS 62.0), not inside
// a parallel region (bmm's many small products run one per thread).
std::atomic<int> g_transposed_gemm{static_cast<int>(TransposedGemm::kAuto)};

bool auto_choice() {
  return g_transposed_gemm.load(std::memory_order_relaxed) == static_cast<int>(TransposedGemm::kAuto);
}

// oneDNN 2.6's AVX2 sgemm is slow on a plain (not transposed) B whose address is a multiple of 32
// bytes and whose rows are a multiple of 512 floats (2 KiB) apart, where C has 32 to 512 rows: its
// time / OpenBLAS's, median of 11 interleaved rounds (Zen 3, 1 thread; gemm_bench --aligned-b,
// docs/data/gemm_aligned_b_zen3_2026-12-01.txt): m=128 n=512 k=256 1.31, m=146 n=512 k=30522 1.43,
// m=512 n=512 k=512 1.38, m=256 n=1024 k=512 1.86, m=32 n=2048 k=512 1.57. The same B 16 bytes off
// that boundary ran at 0.94-1.06 of OpenBLAS's time, and so did rows 768 floats apart, m >= 640; m =
// 16 and k = 10 were as fast or faster in oneDNN (the cause inside oneDNN is not traced). Those
// products are the MLP's second input gradient (128 x 256 times the 256 x 512 weight) and
// BERT-small's masked-LM decoder's (146 x 30522 times the 30522 x 512 word embeddings).
bool plain_b_collides(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_row_major, int64_t ldb,
                      bool b_aligned) {
  return !a_transposed && b_row_major && b_aligned && ldb % 512 == 0 && m >= 32 && m <= 512 && n >= 256 && k >= 64;
}

// [OpenBLAS's own threads] chorus links OpenBLAS's OpenMP build (third_party/openblas.BUILD), whose
// threads are libgomp's: the one team that chorus's parallel loops and oneDNN use too. A program
// that loaded another build (a copy of a binary run where libopenblas0-openmp is missing loads what
// /etc/alternatives names, Debian's default being the pthreads build) has OpenBLAS's own workers
// beside libgomp's: after each product they spin, calling sched_yield, while libgomp's spin for the
// next loop, three busy threads on two cores. The MLP's training step at 2 threads (AVX2 imposed,
// Zen 5) took 2.1x as long with that build loaded, and 1.00x with no product sent to it
// (docs/benchmarks.md, session 52). So with any build but OpenMP's, OpenBLAS gets products only at 1
// thread, where its workers sleep (sgemm below also calls it with 1 thread then, whatever
// num_threads() says by the time it runs). The clang sanitizer builds link LLVM's libomp, not
// libgomp, so there even the OpenMP build's threads are a second pool; only CI runs those.
bool openblas_built_with_openmp() {
  static const bool openmp = openblas_get_parallel() == 2;  // 0: sequential, 1: pthreads, 2: OpenMP
  return openmp;
}

// The weight gradients above and the colliding plain products, where oneDNN runs AVX2 code.
bool use_openblas(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_row_major, bool c_row_major, int64_t ldb,
                  bool b_aligned) {
  const bool weight_gradient = a_transposed && m >= 128 && n >= 128 && (k >= 256 || (n >= 2 * m && k >= 64));
  return c_row_major && (weight_gradient || plain_b_collides(m, n, k, a_transposed, b_row_major, ldb, b_aligned)) &&
         !omp_in_parallel() && auto_choice() && onednn_runs_avx2() && (num_threads() == 1 || openblas_built_with_openmp());
}

// [Products split by hand] oneDNN 2.6's AVX-512 sgemm runs a product whose B it reads transposed
// (Linear's forward, x W^T) poorly on 2 threads. C split into one block of rows or columns per
// thread, each block one single-threaded call, ran as fast or faster at every such shape of the
// training steps (Zen 4, 2 threads, GFLOP/s, oneDNN's call / split: the MLP's 128x512x784 162-185 /
// 191-207 and 128x256x512 132-136 / 190-194; BERT-mini's 1024x256x1024 163-174 / 191-205;
// BERT-small's 146x30522x512 135 / 194; and 32x512x512 56 / 122, where oneDNN's 2 threads are
// slower than its one; docs/data/gemm_split_zen4_2026-12-04.txt). At those shapes the blocks also
// give one thread's bits, where oneDNN's own 2-thread call sums in another order (128x512x784:
// gemm_test); not at every shape, since oneDNN picks its kernel by the block's size (128x2048x784
// split in two differs from one thread in 222,156 of 262,144 elements). Not below 2^23
// multiply-adds (64x64x64 and 100x300x200 took 1.01-1.05x oneDNN's own time split), no block
// narrower than 128 columns or shorter than 16 rows (oneDNN's small-n kernels; more blocks than 2
// were not timed: these CPUs have 2 cores), only where oneDNN runs its AVX-512 code (with its AVX2
// code the split was as often slower: 128x512x784 0.97-1.05x, 128x256x512 1.00-1.05x), not for a
// plain B (even), not inside a parallel region, and not with kOneDnn. Any A B^T product outside a
// parallel region takes it: Linear's forward, conv2d_by_gemm's, attention's score products when
// the heads are fewer than the threads.
constexpr int64_t kSplitAlign = 16;     // a column block starts a multiple of 16 floats into C's rows
constexpr int64_t kSplitColumns = 128;  // the narrowest column block
constexpr int64_t kSplitRows = 16;      // the shortest row block

// Whether oneDNN runs its AVX-512 code: its own answer, after onednn::configure() (called before any
// product) applied CHORUS_CPU_CAPABILITY (avx2 and default cap it) and ONEDNN_MAX_CPU_ISA.
bool onednn_runs_avx512() {
  static const bool avx512 = [] {
    onednn::configure();  // the cap first: oneDNN takes none after this query
    return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  }();
  return avx512;
}

int64_t split_parts(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_row_major, bool c_row_major) {
  if (a_transposed || b_row_major || !c_row_major) return 1;
  if (!auto_choice() || omp_in_parallel() || !onednn_runs_avx512()) return 1;
  if (m * n * k < (int64_t{1} << 23)) return 1;
  const int64_t blocks = n >= m ? n / kSplitColumns : m / kSplitRows;  // as many as the sizes allow
  return std::min<int64_t>(num_threads(), blocks);
}

// Whether a transposed A may be copied row-major first, or C computed as (B^T A)^T: workarounds for
// oneDNN's AVX2 sgemm (above). oneDNN's AVX-512 code reads a transposed A at its full rate, where
// both lost to the plain call (Zen 5, 1 thread, GFLOP/s, workaround / plain dnnl_sgemm:
// 256x1024x1024 137.7 / 189.9, 1024x256x1024 136.7 / 160.5, 30522x256x146 141.3 / 167.1,
// 256x512x128 156.0 / 213.2; docs/data/gemm_shapes_zen5_2026-11-30.txt), so with kAuto they are for
// AVX2 code only; kOneDnn keeps them on every CPU (tests reach them on any machine).
bool onednn_workarounds() { return !auto_choice() || onednn_runs_avx2(); }

}  // namespace

// The way a float32 product C[m,n] = A B goes, named so that tests can check the choice: OpenBLAS,
// oneDNN's sgemm as it is, A copied row-major before it, or C computed as (B^T A)^T. With kAuto the
// weight gradients (A transposed, C row-major, m, n >= 128, and k >= 256 or C at least twice as wide
// as tall) go to OpenBLAS where oneDNN runs AVX2 code (never inside an OpenMP parallel region, nor at
// 2+ threads with a build of OpenBLAS other than OpenMP's: [OpenBLAS's own threads]), and so
// do the products whose plain B oneDNN would read in place at colliding addresses (plain_b_collides:
// ldb and b_aligned say where B's rows lie); where oneDNN runs AVX-512 code every product goes to
// oneDNN as it is, those that read B transposed at 2+ threads split by hand (kSplitC: [Products
// split by hand]); kOneDnn takes the two workarounds for oneDNN's AVX2 code on every CPU and never
// splits. [No header] gemm_test and openblas_probe declare these two themselves: a header added to
// //kernels/cpu (or a change to one) is an input of every compile action that depends on the
// library, so it would recompile the whole project in every configuration (docs/build.md); move
// them into capability.h with the next change that has to touch it.
enum class GemmRoute : int { kOpenBlas, kOneDnn, kCopyA, kTransposeC, kSplitC };

GemmRoute sgemm_route(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_row_major, bool c_row_major,
                      bool beta_zero, int64_t ldb, bool b_aligned) {
  if (use_openblas(m, n, k, a_transposed, b_row_major, c_row_major, ldb, b_aligned)) return GemmRoute::kOpenBlas;
  if (split_parts(m, n, k, a_transposed, b_row_major, c_row_major) > 1) return GemmRoute::kSplitC;
  if (!a_transposed || !c_row_major || !onednn_workarounds()) return GemmRoute::kOneDnn;
  // A transposed and C much wider than tall (m=256 n=1024 k=1024: 30 GF/s read either way): the
  // transposed product C^T = B^T A has the tall shape the copy serves; C is then its transpose.
  if (beta_zero && b_row_major && m >= 128 && n >= 2 * m && n >= 512 && k >= 64) return GemmRoute::kTransposeC;
  if (copy_transposed_a(m, n, k)) return GemmRoute::kCopyA;
  return GemmRoute::kOneDnn;
}

namespace {

bool sgemm(const Tensor& c, const Tensor& a_in, const Tensor& b, float alpha, float beta) {
  const int64_t m = a_in.size(0), k = a_in.size(1), n = b.size(1);
  if (k == 0 || m == 0 || n == 0) return false;
  int64_t ars, acs, brs, bcs, crs, ccs;
  strides_2d(a_in, ars, acs);
  strides_2d(b, brs, bcs);
  strides_2d(c, crs, ccs);
  const bool c_row_major = ccs == 1 || n == 1;
  const int64_t ldc = std::max<int64_t>(crs, n);
  const bool b_row_major = bcs == 1 || n == 1;
  const GemmRoute route = sgemm_route(m, n, k, !(acs == 1 || k == 1), b_row_major, c_row_major, beta == 0.f,
                                      b_row_major ? std::max<int64_t>(brs, n) : std::max<int64_t>(bcs, k),
                                      reinterpret_cast<uintptr_t>(b.raw_data_ptr()) % 32 == 0);
  if (route == GemmRoute::kOpenBlas &&
      std::max({m, n, k, ars, acs, brs, bcs, ldc}) <= std::numeric_limits<blasint>::max()) {
    // One product in OpenBLAS at a time: its OpenMP build (the one chorus links) shares its work
    // buffers between concurrent callers unless built with NUM_PARALLEL (OpenBLAS issues 1736, 3921),
    // and chorus calls products from several threads (the sim device's stream workers; a user's
    // threads). Its thread count is set on each call: the OpenMP build reads the calling thread's
    // omp_get_max_threads(), which a thread other than the one set_num_threads ran on does not share;
    // any other build gets 1 ([OpenBLAS's own threads]).
    static std::mutex openblas_mutex;
    std::lock_guard<std::mutex> lock(openblas_mutex);
    openblas_set_num_threads(openblas_built_with_openmp() ? num_threads() : 1);
    const SgemmOperand A = sgemm_operand(static_cast<const float*>(a_in.raw_data_ptr()), m, k, ars, acs, false);
    const SgemmOperand B = sgemm_operand(static_cast<const float*>(b.raw_data_ptr()), k, n, brs, bcs, false);
    auto op = [](char t) { return t == 'T' ? CblasTrans : CblasNoTrans; };
    cblas_sgemm(CblasRowMajor, op(A.trans), op(B.trans), static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), alpha, A.ptr, static_cast<blasint>(A.ld), B.ptr, static_cast<blasint>(B.ld),
                beta, static_cast<float*>(c.raw_data_ptr()), static_cast<blasint>(ldc));
    return true;
  }
  if (route == GemmRoute::kSplitC) {  // [Products split by hand]: A plain, B transposed, C row-major
    const int64_t parts = split_parts(m, n, k, false, false, true);
    const SgemmOperand A = sgemm_operand(static_cast<const float*>(a_in.raw_data_ptr()), m, k, ars, acs, false);
    const SgemmOperand B = sgemm_operand(static_cast<const float*>(b.raw_data_ptr()), k, n, brs, bcs, false);
    if (parts < 2 || A.trans != 'N' || B.trans != 'T') {
      fail("matmul: internal error: a product {}x{}x{} routed to the split is not one it takes", m, n, k);
    }
    auto* pc = static_cast<float*>(c.raw_data_ptr());
    const bool by_columns = n >= m;
    const int64_t extent = by_columns ? n : m;
    auto bound = [&](int64_t part) {  // where part `part` starts; columns on a multiple of kSplitAlign
      const int64_t at = extent * part / parts;
      return by_columns && part < parts ? at / kSplitAlign * kSplitAlign : at;
    };
    std::vector<dnnl_status_t> status(static_cast<size_t>(parts), dnnl_success);
    parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
      // One part a thread. Inside an active region oneDNN runs one thread; in a team the runtime
      // shrank to one thread (OMP_DYNAMIC) the region is not active, so say it (this implicit
      // task's setting only).
      omp_set_num_threads(1);
      for (int64_t part = lo; part < hi; ++part) {
        const int64_t from = bound(part), count = bound(part + 1) - from;
        status[static_cast<size_t>(part)] =
            by_columns ? dnnl_sgemm('N', 'T', m, count, k, alpha, A.ptr, A.ld, B.ptr + from * B.ld, B.ld, beta,
                                    pc + from, ldc)
                       : dnnl_sgemm('N', 'T', count, n, k, alpha, A.ptr + from * A.ld, A.ld, B.ptr, B.ld, beta,
                                    pc + from * ldc, ldc);
      }
    });
    for (dnnl_status_t st : status) {
      if (st == dnnl_success) continue;
      // With beta 0 Eigen recomputes the whole of C; otherwise a block another part already added
      // to would take beta twice.
      if (beta == 0.f) return false;
      fail("matmul: oneDNN's sgemm failed on a part of an {}x{}x{} product (status {})", m, n, k, static_cast<int>(st));
    }
    return true;
  }
  if (route == GemmRoute::kTransposeC) {
    Tensor ct = make_tensor({n, m}, kFloat32, kCPU);
    if (!sgemm(ct, transposed_view(b), transposed_view(a_in), alpha, 0.f)) return false;
    transpose_into(static_cast<const float*>(ct.raw_data_ptr()), m, m, n, static_cast<float*>(c.raw_data_ptr()),
                   std::max<int64_t>(crs, n));
    return true;
  }
  const bool copy_a = route == GemmRoute::kCopyA;
  const Tensor a = copy_a ? row_major_copy(a_in, acs) : a_in;
  if (copy_a) strides_2d(a, ars, acs);
  const auto* pa = static_cast<const float*>(a.raw_data_ptr());
  const auto* pb = static_cast<const float*>(b.raw_data_ptr());
  auto* pc = static_cast<float*>(c.raw_data_ptr());
  dnnl_status_t status;
  if (c_row_major) {  // C row-major: C = A B
    const SgemmOperand A = sgemm_operand(pa, m, k, ars, acs, false), B = sgemm_operand(pb, k, n, brs, bcs, false);
    status = dnnl_sgemm(A.trans, B.trans, m, n, k, alpha, A.ptr, A.ld, B.ptr, B.ld, beta, pc,
                        std::max<int64_t>(crs, n));
  } else {  // C column-major: C^T = B^T A^T, row-major with leading dimension ccs
    const SgemmOperand Bt = sgemm_operand(pb, k, n, brs, bcs, true), At = sgemm_operand(pa, m, k, ars, acs, true);
    status = dnnl_sgemm(Bt.trans, At.trans, n, m, k, alpha, Bt.ptr, Bt.ld, At.ptr, At.ld, beta, pc,
                        std::max<int64_t>(ccs, m));
  }
  return status == dnnl_success;
}

template <typename T>
void gemm_typed(const Tensor& c, const Tensor& a, const Tensor& b, T alpha, T beta) {
  if constexpr (std::is_same_v<T, float>) {
    if (onednn::enabled()) {
      onednn::configure();
      if (sgemm(c, a, b, alpha, beta)) return;
    }
  }
  // [One Eigen product per dtype] Eigen compiles a product for each storage order of A, B and C, and
  // each comes with its matrix-vector and packing variants: mapping every view in its own order (8
  // combinations) made this file the second slowest of the library to compile in every build (-c opt
  // 50 s, TSan 33 s, ASan 84 s; docs/build.md). So the operands are row-major here: a view whose rows
  // are contiguous (a transposed one) is copied first, and a C that is not row-major gets the product
  // through a row-major copy. The copies cost m*k, k*n or m*n moves against the product's 2*m*n*k
  // flops; float32, the dtype models train in, goes to oneDNN or OpenBLAS above and reads its views in
  // place.
  auto row_major = [](const Tensor& t) {
    int64_t rs, cs;
    strides_2d(t, rs, cs);
    return cs == 1 ? t : dense(t);
  };
  const Tensor ra = row_major(a), rb = row_major(b);
  int64_t rs, cs;
  strides_2d(c, rs, cs);
  const bool c_row_major = cs == 1;
  const Tensor rc = c_row_major ? c : (beta == T(0) ? make_tensor(c.sizes(), c.dtype(), kCPU) : dense(c));
  const int64_t m = ra.size(0), k = ra.size(1), n = rb.size(1);
  int64_t ars, acs, brs, bcs, crs, ccs;
  strides_2d(ra, ars, acs);
  strides_2d(rb, brs, bcs);
  strides_2d(rc, crs, ccs);
  const auto A = row_major_map(static_cast<const T*>(ra.raw_data_ptr()), m, k, ars);
  const auto B = row_major_map(static_cast<const T*>(rb.raw_data_ptr()), k, n, brs);
  auto C = row_major_map(static_cast<T*>(rc.raw_data_ptr()), m, n, crs);
  if (k == 0) {
    if (beta == T(0)) C.setZero();
    else C *= beta;
  } else if (beta == T(0)) {
    C.noalias() = alpha * (A * B);
  } else {
    if (beta != T(1)) C *= beta;
    C.noalias() += alpha * (A * B);
  }
  if (!c_row_major) copy(c, rc);
}

}  // namespace

void set_transposed_gemm(TransposedGemm choice) {
  g_transposed_gemm.store(static_cast<int>(choice), std::memory_order_relaxed);
}

TransposedGemm transposed_gemm() {
  return static_cast<TransposedGemm>(g_transposed_gemm.load(std::memory_order_relaxed));
}

void gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta) {
  Tensor aa = mappable(a) ? a : dense(a);
  Tensor bb = mappable(b) ? b : dense(b);
  const bool c_ok = mappable(c);
  Tensor cc = c_ok ? c : dense(c);
  sync_eigen_threads();
  CHORUS_DISPATCH_COMPUTE(c.dtype(), "matmul", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      fail("matmul: not defined for bool tensors");
    } else {
      gemm_typed<T>(cc, aa, bb, static_cast<T>(alpha), static_cast<T>(beta));
    }
  });
  if (!c_ok) copy(c, cc);
}

void bmm(const Tensor& c, const Tensor& a, const Tensor& b) {
  const int64_t batch = a.size(0);
  const int64_t flops_per = a.size(1) * a.size(2) * b.size(2);
  auto one = [&](int64_t i) {
    auto sel = [i](const Tensor& t) {
      return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset() + i * t.stride(0),
                                                 Shape{t.size(1), t.size(2)},
                                                 Strides{t.stride(1), t.stride(2)}, t.dtype()));
    };
    gemm(sel(c), sel(a), sel(b), 1.0, 0.0);
  };
  // Many small products: one per thread (Eigen runs single-threaded inside a parallel region).
  // Few large ones: in sequence, each using every thread inside Eigen.
  if (batch >= num_threads() && flops_per < (1 << 21)) {
    parallel_for(0, batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
}

}  // namespace chorus::kernels::cpu
