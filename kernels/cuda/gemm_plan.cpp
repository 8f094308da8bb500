// cuBLAS call planning (see gemm_plan.h). Column-major terms throughout: a stored matrix S of
// R rows has element (i, j) at i + j * ld, and cuBLAS requires ld >= max(1, R) even where no
// second column is ever read.
#include "kernels/cuda/gemm_plan.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "tensor/error.h"

namespace chorus::cuda {
namespace {

struct ColumnMajor {
  GemmOp op;
  int64_t ld;
};

// How cuBLAS reads the view X [rows, cols] (strides rs, cs) as op(S) for a column-major S:
// N: S = X, needs rs == 1 and ld = cs >= rows; T: S = X^T ([cols, rows]), needs cs == 1 and
// ld = rs >= cols. A dim of size 1 is never stepped, so its stride is free (and ld takes the
// smallest legal value when it is the stepping one). nullopt: no such view, copy first.
std::optional<ColumnMajor> column_major(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (rows == 0 || cols == 0) return ColumnMajor{GemmOp::N, std::max<int64_t>(1, rows)};  // nothing is read
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows))) {
    return ColumnMajor{GemmOp::N, cols == 1 ? std::max<int64_t>(1, rows) : cs};
  }
  // (A single row never gets here: N reads it unless its column stride is 0 with cols > 1, and T
  // cannot read that either.)
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(1, cols)) return ColumnMajor{GemmOp::T, rs};
  return std::nullopt;
}

// The dense row-major buffer an operand is copied into. An input broadcast over the batch (batch
// stride 0) is copied once; C always gets a matrix per batch entry.
MatrixLayout dense(const MatrixLayout& x, bool is_output = false) {
  const int64_t batch_stride = x.batch_stride == 0 && !is_output ? 0 : x.rows * x.cols;
  return MatrixLayout{x.rows, x.cols, x.cols, 1, batch_stride};
}

// Matrices of C for different batch entries must not share elements (cuBLAS writes them
// concurrently). Checked conservatively: batch stride at least one matrix's whole span.
bool batches_disjoint(const MatrixLayout& c, int64_t batch) {
  if (batch <= 1 || c.rows == 0 || c.cols == 0) return true;
  const int64_t span = (c.rows - 1) * c.row_stride + (c.cols - 1) * c.col_stride + 1;
  return c.batch_stride >= span;
}

// The transpose of a view: rows and cols swapped with their strides.
MatrixLayout transposed(const MatrixLayout& x) {
  return MatrixLayout{x.cols, x.rows, x.col_stride, x.row_stride, x.batch_stride};
}

}  // namespace

GemmPlan plan_gemm(const MatrixLayout& a, const MatrixLayout& b, const MatrixLayout& c, int64_t batch) {
  CHORUS_CHECK(a.rows == c.rows && a.cols == b.rows && b.cols == c.cols,
               "plan_gemm: A is [{}, {}], B is [{}, {}] and C is [{}, {}]; expected A [m, k], B [k, n], C [m, n]",
               a.rows, a.cols, b.rows, b.cols, c.rows, c.cols);
  for (const MatrixLayout* x : {&a, &b, &c}) {
    CHORUS_CHECK(x->rows >= 0 && x->cols >= 0 && x->row_stride >= 0 && x->col_stride >= 0 && x->batch_stride >= 0,
                 "plan_gemm: sizes [{}, {}] with strides ({}, {}) and batch stride {}: negative values are not "
                 "supported",
                 x->rows, x->cols, x->row_stride, x->col_stride, x->batch_stride);
  }
  CHORUS_CHECK(batch >= 0, "plan_gemm: batch {} is negative", batch);

  GemmPlan plan;
  plan.batch = batch;
  plan.k = a.cols;
  // C first: it decides the orientation. Row-major C (the usual case) computes C^T = B^T A^T.
  MatrixLayout cc = c;
  if (!batches_disjoint(cc, batch)) {
    plan.copy_c = true;
    cc = dense(c, true);
  }
  std::optional<ColumnMajor> c_t = column_major(cc.cols, cc.rows, cc.col_stride, cc.row_stride);
  std::optional<ColumnMajor> c_n = column_major(cc.rows, cc.cols, cc.row_stride, cc.col_stride);
  if (!(c_t && c_t->op == GemmOp::N) && !(c_n && c_n->op == GemmOp::N)) {
    plan.copy_c = true;
    cc = dense(c, true);
    c_t = column_major(cc.cols, cc.rows, cc.col_stride, cc.row_stride);  // N, ld = n
  }
  plan.first_is_b = c_t && c_t->op == GemmOp::N;
  // The two factors in call order, each as the matrix cuBLAS sees as op(first) / op(second):
  // C^T = B^T A^T, or C = A B.
  MatrixLayout first = plan.first_is_b ? transposed(b) : a;
  MatrixLayout second = plan.first_is_b ? transposed(a) : b;
  bool& copy_first = plan.first_is_b ? plan.copy_b : plan.copy_a;
  bool& copy_second = plan.first_is_b ? plan.copy_a : plan.copy_b;
  std::optional<ColumnMajor> f = column_major(first.rows, first.cols, first.row_stride, first.col_stride);
  if (!f) {
    copy_first = true;
    first = plan.first_is_b ? transposed(dense(b)) : dense(a);
    f = column_major(first.rows, first.cols, first.row_stride, first.col_stride);
  }
  std::optional<ColumnMajor> s = column_major(second.rows, second.cols, second.row_stride, second.col_stride);
  if (!s) {
    copy_second = true;
    second = plan.first_is_b ? transposed(dense(a)) : dense(b);
    s = column_major(second.rows, second.cols, second.row_stride, second.col_stride);
  }
  plan.m = plan.first_is_b ? c.cols : c.rows;
  plan.n = plan.first_is_b ? c.rows : c.cols;
  plan.transa = f->op;
  plan.transb = s->op;
  plan.lda = f->ld;
  plan.ldb = s->ld;
  plan.ldc = plan.first_is_b ? c_t->ld : c_n->ld;
  // A batch of one never steps: its strides are 0 whatever the views say.
  plan.stride_a = batch > 1 ? first.batch_stride : 0;
  plan.stride_b = batch > 1 ? second.batch_stride : 0;
  plan.stride_c = batch > 1 ? cc.batch_stride : 0;
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  plan.fits_int32 = plan.m <= kIntMax && plan.n <= kIntMax && plan.k <= kIntMax && plan.lda <= kIntMax &&
                    plan.ldb <= kIntMax && plan.ldc <= kIntMax && batch <= kIntMax;
  return plan;
}

}  // namespace chorus::cuda
