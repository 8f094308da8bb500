// kernels/cuda/gemm_plan: every plan is executed through OpenBLAS's column-major cblas_sgemm /
// cblas_dgemm (the arguments cuBLAS takes; batches looped with the plan's strides) and compared
// with chorus's CPU addmm/matmul, for A, B and C contiguous, transposed, sliced with ld > rows,
// broadcast or overlapping (which must be copied), size-1 dims, k = 0, batched with broadcast and
// interleaved batches, float32 and float64. Views that cuBLAS can read in place must not be copied.
#include "kernels/cuda/gemm_plan.h"

#include <cblas.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace {

using namespace chorus;
using cuda::GemmOp;
using cuda::GemmPlan;
using cuda::MatrixLayout;

// How a test matrix is laid out, and whether cuBLAS can read it without a copy.
enum class Kind { Contiguous, Transposed, Sliced, SlicedTransposed, Expanded, Strided, Overlapping };
const std::vector<Kind> kAllKinds = {Kind::Contiguous, Kind::Transposed,  Kind::Sliced,     Kind::SlicedTransposed,
                                     Kind::Expanded,   Kind::Strided,     Kind::Overlapping};
const char* name(Kind k) {
  const char* names[] = {"contiguous", "transposed", "sliced", "sliced transposed", "expanded", "strided",
                         "overlapping"};
  return names[static_cast<int>(k)];
}

// A [rows, cols] view of random values in layout `kind`.
Tensor matrix(int64_t rows, int64_t cols, Kind kind, DType dt, Generator& g) {
  const TensorOptions o{.dtype = dt};
  switch (kind) {
    case Kind::Contiguous: return randn({rows, cols}, o, &g);
    case Kind::Transposed: return randn({cols, rows}, o, &g).t();
    case Kind::Sliced: return randn({rows + 3, cols + 5}, o, &g).narrow(0, 1, rows).narrow(1, 2, cols);
    case Kind::SlicedTransposed: return randn({cols + 4, rows + 6}, o, &g).narrow(0, 3, cols).narrow(1, 1, rows).t();
    case Kind::Expanded: return randn({rows, 1}, o, &g).expand({rows, cols});  // strides (1, 0)
    case Kind::Strided:  // every other column of every other row: neither stride is 1
      return randn({2 * rows + 1, 2 * cols + 1}, o, &g).as_strided({rows, cols}, {2 * (2 * cols + 1), 2});
    case Kind::Overlapping:  // rows start one element apart
      return randn({rows + cols + 1}, o, &g).as_strided({rows, cols}, {1, 1});
  }
  return Tensor();
}

// Whether a view of this kind and shape must be copied: cuBLAS needs one unit stride and a leading
// dim of at least the rows (cols, transposed) it steps over; a size-1 dim's stride never matters.
bool needs_copy(Kind kind, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0 || (rows == 1 && cols == 1)) return false;
  switch (kind) {
    case Kind::Expanded: return cols > 1;  // strides (1, 0): a column vector is fine, a row is not
    case Kind::Strided:  // a single row or column steps only one dim: its stride is the leading dim
    case Kind::Overlapping: return rows > 1 && cols > 1;
    default: return false;
  }
}

MatrixLayout layout(const Tensor& t) {
  if (t.dim() == 2) return MatrixLayout{t.size(0), t.size(1), t.stride(0), t.stride(1), 0};
  return MatrixLayout{t.size(1), t.size(2), t.stride(1), t.stride(2), t.stride(0)};
}

CBLAS_TRANSPOSE cblas_op(GemmOp op) { return op == GemmOp::N ? CblasNoTrans : CblasTrans; }

// The buffer a plan asks an operand to be copied into: dense row-major, one matrix if the operand
// is broadcast over the batch.
Tensor dense_copy(const Tensor& t) {
  if (t.dim() == 3 && t.stride(0) == 0) return t.select(0, 0).contiguous();
  return t.contiguous();
}

// Runs C = alpha * A @ B + beta * C (C a view, written in place) as the plan says, through cblas.
template <typename T>
void run_plan(const GemmPlan& plan, const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta) {
  const Tensor a_use = plan.copy_a ? dense_copy(a) : a;
  const Tensor b_use = plan.copy_b ? dense_copy(b) : b;
  Tensor c_use = plan.copy_c ? c.contiguous().clone() : c;
  const T* first = static_cast<const T*>((plan.first_is_b ? b_use : a_use).raw_data_ptr());
  const T* second = static_cast<const T*>((plan.first_is_b ? a_use : b_use).raw_data_ptr());
  T* out = static_cast<T*>(c_use.raw_data_ptr());
  REQUIRE(plan.fits_int32);
  const auto i32 = [](int64_t v) { return static_cast<int>(v); };
  for (int64_t i = 0; i < plan.batch; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasColMajor, cblas_op(plan.transa), cblas_op(plan.transb), i32(plan.m), i32(plan.n), i32(plan.k),
                  static_cast<float>(alpha), first + i * plan.stride_a, i32(plan.lda), second + i * plan.stride_b,
                  i32(plan.ldb), static_cast<float>(beta), out + i * plan.stride_c, i32(plan.ldc));
    } else {
      cblas_dgemm(CblasColMajor, cblas_op(plan.transa), cblas_op(plan.transb), i32(plan.m), i32(plan.n), i32(plan.k),
                  alpha, first + i * plan.stride_a, i32(plan.lda), second + i * plan.stride_b, i32(plan.ldb), beta,
                  out + i * plan.stride_c, i32(plan.ldc));
    }
  }
  if (plan.copy_c) c.copy_(c_use);
}

// |got - expected| within round-off: a bound from |alpha| |A| |B| + |beta C0| per element.
bool close(const Tensor& got, const Tensor& expected, const Tensor& bound, DType dt) {
  const double rel = dt == kFloat32 ? 1e-5 : 1e-13;
  const Tensor err = abs(sub(got.to(kFloat64), expected.to(kFloat64)));
  const Tensor limit = add(mul(bound.to(kFloat64), rel), 1e-30);
  return equal(le(err, limit), ones(err.sizes(), TensorOptions{.dtype = kBool}));
}

// One case: plans, checks the copy flags, runs, compares with chorus.
void check_gemm(const Tensor& a, const Tensor& b, Tensor c, double alpha, double beta, DType dt,
                const std::string& what) {
  INFO(what << ": A " << shape_str(a.sizes()) << " strides " << shape_str(a.strides()) << ", B "
            << shape_str(b.sizes()) << " strides " << shape_str(b.strides()) << ", C strides "
            << shape_str(c.strides()));
  const int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  const GemmPlan plan = cuda::plan_gemm(layout(a), layout(b), layout(c), batch);
  const Tensor c0 = c.clone();
  Tensor expected = mul(matmul(a, b), alpha);
  if (beta != 0) expected = add(expected, mul(c0, beta));  // beta 0: C is never read (it may hold NaN)
  const Tensor bound = add(mul(matmul(abs(a), abs(b)), std::abs(alpha)), beta != 0 ? abs(mul(c0, beta)) : zeros_like(c0));
  if (dt == kFloat32) run_plan<float>(plan, a, b, c, alpha, beta);
  else run_plan<double>(plan, a, b, c, alpha, beta);
  INFO("plan: first_is_b " << plan.first_is_b << " ops " << (plan.transa == GemmOp::T) << (plan.transb == GemmOp::T)
                           << " m n k " << plan.m << " " << plan.n << " " << plan.k << " ld " << plan.lda << " "
                           << plan.ldb << " " << plan.ldc << " copies " << plan.copy_a << plan.copy_b << plan.copy_c);
  REQUIRE(close(c, expected, bound, dt));
}

TEST_CASE("cuBLAS plans of 2-D products in every layout compute addmm through cblas", "[cuda][gemm_plan]") {
  struct Size {
    int64_t m, k, n;
  };
  const std::vector<Size> sizes = {{5, 7, 3}, {1, 7, 3}, {5, 1, 3}, {5, 7, 1}, {1, 1, 1}, {6, 4, 6},
                                   {5, 0, 3}, {1, 6, 1}, {0, 3, 4}};
  const std::vector<Kind> c_kinds = {Kind::Contiguous, Kind::Transposed, Kind::Sliced, Kind::SlicedTransposed};
  Generator g(42);
  int cases = 0, copies_a = 0;
  for (DType dt : {kFloat32, kFloat64}) {
    for (const Size s : sizes) {
      for (Kind ka : kAllKinds) {
        for (Kind kb : kAllKinds) {
          for (Kind kc : c_kinds) {
            const Tensor a = matrix(s.m, s.k, ka, dt, g), b = matrix(s.k, s.n, kb, dt, g);
            Tensor c = matrix(s.m, s.n, kc, dt, g);
            const double alpha = 0.5 + (cases % 5) * 0.25, beta = cases % 4 == 0 ? 0.0 : -1.5 + (cases % 3);
            if (beta == 0) c.fill_(NAN);
            const std::string what = std::string(dtype_name(dt)) + " A " + name(ka) + ", B " + name(kb) + ", C " +
                                     name(kc) + " m k n " + std::to_string(s.m) + " " + std::to_string(s.k) + " " +
                                     std::to_string(s.n);
            check_gemm(a, b, c, alpha, beta, dt, what);
            // Only what cuBLAS cannot read in place is copied.
            const GemmPlan plan = cuda::plan_gemm(layout(a), layout(b), layout(c));
            INFO(what);
            CHECK(plan.copy_a == needs_copy(ka, s.m, s.k));
            CHECK(plan.copy_b == needs_copy(kb, s.k, s.n));
            CHECK_FALSE(plan.copy_c);
            copies_a += plan.copy_a;
            ++cases;
          }
        }
      }
    }
  }
  CHECK(copies_a > 100);
}

TEST_CASE("a row-major C is computed as C^T = B^T A^T, a column-major C directly", "[cuda][gemm_plan]") {
  // C [4, 6] row-major, A [4, 5] and B [5, 6] row-major: first operand B, no transposes, m = n(C).
  GemmPlan p = cuda::plan_gemm({4, 5, 5, 1}, {5, 6, 6, 1}, {4, 6, 6, 1});
  CHECK(p.first_is_b);
  CHECK((p.transa == GemmOp::N && p.transb == GemmOp::N));
  CHECK((p.m == 6 && p.n == 4 && p.k == 5 && p.lda == 6 && p.ldb == 5 && p.ldc == 6));
  // The same with a column-major C: first operand A, both read transposed (they are row-major).
  p = cuda::plan_gemm({4, 5, 5, 1}, {5, 6, 6, 1}, {4, 6, 1, 4});
  CHECK_FALSE(p.first_is_b);
  CHECK((p.transa == GemmOp::T && p.transb == GemmOp::T));
  CHECK((p.m == 4 && p.n == 6 && p.lda == 5 && p.ldb == 6 && p.ldc == 4));
  // A leading dim below the rows it must cover (C rows overlapping) forces a copy of C.
  p = cuda::plan_gemm({4, 5, 5, 1}, {5, 6, 6, 1}, {4, 6, 3, 1});
  CHECK(p.copy_c);
  CHECK((p.first_is_b && p.ldc == 6));
  // k = 0 still gets leading dims cuBLAS accepts (>= 1).
  p = cuda::plan_gemm({3, 0, 0, 1}, {0, 2, 2, 1}, {3, 2, 2, 1});
  CHECK((p.k == 0 && p.lda >= 1 && p.ldb >= 1 && !p.copy_a && !p.copy_b));
}

// A [batch, rows, cols] view: per-matrix kind plus how the batch is laid out.
enum class BatchKind { Dense, Broadcast, Interleaved };
Tensor batched(int64_t batch, int64_t rows, int64_t cols, Kind kind, BatchKind bk, DType dt, Generator& g) {
  const TensorOptions o{.dtype = dt};
  switch (bk) {
    case BatchKind::Broadcast: return matrix(rows, cols, kind, dt, g).unsqueeze(0).expand({batch, rows, cols});
    case BatchKind::Interleaved:  // [rows, batch, cols] permuted: batch stride cols, row stride batch*cols
      return kind == Kind::Transposed ? randn({cols, batch, rows}, o, &g).permute({1, 2, 0})
                                      : randn({rows, batch, cols}, o, &g).permute({1, 0, 2});
    case BatchKind::Dense:
      break;
  }
  if (kind == Kind::Transposed) return randn({batch, cols, rows}, o, &g).transpose(1, 2);
  if (kind == Kind::Expanded) return randn({batch, rows, 1}, o, &g).expand({batch, rows, cols});
  return randn({batch, rows, cols}, o, &g);
}

TEST_CASE("batched plans with batch strides, broadcast and interleaved batches compute bmm", "[cuda][gemm_plan]") {
  Generator g(7);
  const std::vector<Kind> kinds = {Kind::Contiguous, Kind::Transposed, Kind::Expanded};
  const std::vector<BatchKind> bkinds = {BatchKind::Dense, BatchKind::Broadcast, BatchKind::Interleaved};
  int cases = 0, broadcast_in_place = 0;
  for (DType dt : {kFloat32, kFloat64}) {
    for (int64_t batch : {1, 3}) {
      for (Kind ka : kinds)
        for (Kind kb : kinds)
          for (BatchKind ba : bkinds)
            for (BatchKind bb : bkinds)
              for (bool c_transposed : {false, true}) {
                if ((ba == BatchKind::Interleaved && ka == Kind::Expanded) ||
                    (bb == BatchKind::Interleaved && kb == Kind::Expanded)) {
                  continue;
                }
                const int64_t m = 4, k = 5, n = 3;
                const Tensor a = batched(batch, m, k, ka, ba, dt, g), b = batched(batch, k, n, kb, bb, dt, g);
                Tensor c = c_transposed ? randn({batch, n, m}, TensorOptions{.dtype = dt}, &g).transpose(1, 2)
                                        : randn({batch, m, n}, TensorOptions{.dtype = dt}, &g);
                const std::string what = std::string(dtype_name(dt)) + " batch " + std::to_string(batch) + " A " +
                                         name(ka) + "/" + std::to_string(static_cast<int>(ba)) + " B " + name(kb) +
                                         "/" + std::to_string(static_cast<int>(bb));
                check_gemm(a, b, c, 1.25, cases % 2 ? 0.5 : 0.0, dt, what);
                const GemmPlan plan = cuda::plan_gemm(layout(a), layout(b), layout(c), batch);
                CHECK(plan.copy_a == needs_copy(ka, m, k));
                CHECK(plan.copy_b == needs_copy(kb, k, n));
                if (batch > 1 && ba == BatchKind::Broadcast && !plan.copy_a) {
                  CHECK((plan.first_is_b ? plan.stride_b : plan.stride_a) == 0);  // read in place, stride 0
                  ++broadcast_in_place;
                }
                ++cases;
              }
    }
  }
  CHECK(broadcast_in_place > 10);
}

TEST_CASE("a C whose batches overlap is copied; bad shapes are errors", "[cuda][gemm_plan]") {
  const MatrixLayout a{4, 5, 5, 1, 20}, b{5, 6, 6, 1, 30};
  CHECK(cuda::plan_gemm(a, b, {4, 6, 6, 1, 0}, 3).copy_c);   // one C for every batch entry
  CHECK(cuda::plan_gemm(a, b, {4, 6, 6, 1, 6}, 3).copy_c);   // batches a row apart
  CHECK_FALSE(cuda::plan_gemm(a, b, {4, 6, 6, 1, 24}, 3).copy_c);
  const GemmPlan copied = cuda::plan_gemm(a, b, {4, 6, 6, 1, 0}, 3);
  CHECK(copied.stride_c == 24);  // the dense buffer has a matrix per batch entry
  CHECK_THROWS_AS(cuda::plan_gemm(a, {4, 6, 6, 1}, {4, 6, 6, 1}), Error);  // k mismatch
  CHECK_THROWS_AS(cuda::plan_gemm({4, 5, -5, 1}, b, {4, 6, 6, 1}), Error);
  const GemmPlan huge = cuda::plan_gemm({int64_t{3} << 31, 2, 2, 1}, {2, 2, 2, 1}, {int64_t{3} << 31, 2, 2, 1});
  CHECK_FALSE(huge.fits_int32);
}

}  // namespace
