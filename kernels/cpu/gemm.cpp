// Matrix products: float32 through oneDNN's dnnl_sgemm (its own run-time ISA dispatch: AVX-512 where
// the CPU has it, about twice Eigen's AVX2 rate there; gemm_bench), everything else through Eigen. A strided 2-D view whose columns are contiguous maps as a
// row-major matrix, one whose rows are contiguous (a transposed view) maps as column-major: either
// way Eigen's packed GEMM reads it in place, so t() and transpose() never cost a copy. Only views
// contiguous in neither dim are copied first.
#include <Eigen/Core>
#include <dnnl.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/onednn_conv.h"
#include "kernels/cpu/parallel.h"

namespace chorus::kernels::cpu {
namespace {

template <typename T, int Order>
using MatMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned,
                          Eigen::OuterStride<>>;

// Calls f(map) with an Eigen map of the 2-D view at `ptr` (rows x cols, strides rs, cs).
template <typename T, typename P, typename F>
void with_map(P* ptr, int64_t rows, int64_t cols, int64_t rs, int64_t cs, const F& f) {
  using Q = std::remove_const_t<P>;
  if (cs == 1 || cols == 1) {
    MatMap<Q, Eigen::RowMajor> m(const_cast<Q*>(ptr), rows, cols, Eigen::OuterStride<>(std::max<int64_t>(rs, cols)));
    f(m);
  } else {  // rs == 1 (checked by the caller)
    MatMap<Q, Eigen::ColMajor> m(const_cast<Q*>(ptr), rows, cols, Eigen::OuterStride<>(std::max<int64_t>(cs, rows)));
    f(m);
  }
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

// with_map reads a view in place only when one dim is unit-stride and the other steps over whole
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

bool sgemm(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (k == 0 || m == 0 || n == 0) return false;
  int64_t ars, acs, brs, bcs, crs, ccs;
  strides_2d(a, ars, acs);
  strides_2d(b, brs, bcs);
  strides_2d(c, crs, ccs);
  const auto* pa = static_cast<const float*>(a.raw_data_ptr());
  const auto* pb = static_cast<const float*>(b.raw_data_ptr());
  auto* pc = static_cast<float*>(c.raw_data_ptr());
  dnnl_status_t status;
  if (ccs == 1 || n == 1) {  // C row-major: C = A B
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
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  int64_t ars, acs, brs, bcs, crs, ccs;
  strides_2d(a, ars, acs);
  strides_2d(b, brs, bcs);
  strides_2d(c, crs, ccs);
  with_map<T>(static_cast<const T*>(a.raw_data_ptr()), m, k, ars, acs, [&](const auto& A) {
    with_map<T>(static_cast<const T*>(b.raw_data_ptr()), k, n, brs, bcs, [&](const auto& B) {
      with_map<T>(static_cast<T*>(c.raw_data_ptr()), m, n, crs, ccs, [&](auto& C) {
        if (k == 0) {
          if (beta == T(0)) C.setZero();
          else C *= beta;
          return;
        }
        if (beta == T(0)) {
          C.noalias() = alpha * (A * B);
        } else {
          if (beta != T(1)) C *= beta;
          C.noalias() += alpha * (A * B);
        }
      });
    });
  });
}

}  // namespace

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
