// gemm and bmm on CUDA through cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx), following the call
// plan of kernels/cuda/gemm_plan.h (operand order, transposes, leading dims, batch strides), with
// operands no column-major view describes first copied densely on the device, as the plan says.
// float32 may use TF32 (cublas.h), float64 is plain. One handle per device and thread. cuBLAS itself is
// opened at the first call (cublas_api.h: not linked, so that CPU-only processes do not load it).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <memory>

#include "kernels/cuda/cublas.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/kernels.h"
#include "tensor/error.h"
#include "tensor/runtime.h"

namespace chorus::cuda {
namespace {
std::atomic<bool> g_allow_tf32{true};
}  // namespace
void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }
}  // namespace chorus::cuda

namespace chorus::kernels::cuda_impl {
namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    const ::chorus::cuda::CublasApi& api = ::chorus::cuda::cublas();
    fail("cuBLAS {}: {} ({})", what, api.status_string(status), api.status_name(status));
  }
}

// This thread's handle for `device` (which is current), created at first use. Handles are kept for
// the thread's life and not destroyed at its exit (the driver may be gone by then at process exit).
cublasHandle_t handle_for(int device) {
  constexpr int kMaxDevices = 64;
  thread_local std::array<cublasHandle_t, kMaxDevices> handles{};
  CHORUS_CHECK(device >= 0 && device < kMaxDevices, "cuBLAS: device index {} out of range", device);
  if (handles[device] == nullptr) {
    // cublasCreate allocates device memory and makes a blocking copy (the host waits for the legacy
    // default stream): counted as a host synchronization, as sim models it ([A library handle is
    // made at a thread's first call], kernels/sim/sim_kernels.cpp).
    check_cublas(::chorus::cuda::cublas().create(&handles[device]), "cublasCreate");
    note_host_sync();
  }
  return handles[device];
}

cublasOperation_t op_of(::chorus::cuda::GemmOp op) { return op == ::chorus::cuda::GemmOp::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

Tensor restrided(const Tensor& t, const Shape& sizes, const Strides& strides, int64_t offset_elements = 0) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset() + offset_elements, sizes, strides,
                                             t.dtype()));
}

// The dense buffer the plan reads instead of `t` ([batch,] rows, cols): t's first matrix only when
// t is an input broadcast over the batch (batch stride 0).
Tensor dense_operand(const Tensor& t, bool batched, bool is_output, bool copy_values) {
  Tensor view = t;
  if (batched && !is_output && t.stride(0) == 0) {
    view = restrided(t, {t.size(1), t.size(2)}, {t.stride(1), t.stride(2)});
  }
  Tensor out = make_tensor(view.sizes(), view.dtype(), view.device());
  if (copy_values) copy(out, view);
  return out;
}

::chorus::cuda::MatrixLayout layout_of(const Tensor& t, bool batched) {
  const int o = batched ? 1 : 0;
  return {t.size(o), t.size(o + 1), t.stride(o), t.stride(o + 1), batched ? t.stride(0) : 0};
}

void run_gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta, bool batched) {
  const DType dtype = c.dtype();
  CHORUS_CHECK(dtype == kFloat32 || dtype == kFloat64 || dtype == kFloat16 || dtype == kBFloat16,
               "matmul on CUDA: expected float32, float64, float16 or bfloat16, got {}", dtype_name(dtype));
  const int64_t batch = batched ? a.size(0) : 1;
  const ::chorus::cuda::GemmPlan plan =
      ::chorus::cuda::plan_gemm(layout_of(a, batched), layout_of(b, batched), layout_of(c, batched), batch);
  if (plan.m == 0 || plan.n == 0 || plan.batch == 0) return;
  if (plan.k == 0 && beta == 0.0) {  // C = 0 (as the cpu kernel; NaN in the old C does not survive)
    fill(c, Scalar(0));
    return;
  }
  CHORUS_CHECK(plan.fits_int32, "matmul on CUDA: sizes or leading dims above 2^31 are not supported yet");
  const Tensor aa = plan.copy_a ? dense_operand(a, batched, false, true) : a;
  const Tensor bb = plan.copy_b ? dense_operand(b, batched, false, true) : b;
  const Tensor cc = plan.copy_c ? dense_operand(c, batched, true, beta != 0.0) : c;
  const void* first = plan.first_is_b ? bb.raw_data_ptr() : aa.raw_data_ptr();
  const void* second = plan.first_is_b ? aa.raw_data_ptr() : bb.raw_data_ptr();
  void* out = cc.raw_data_ptr();

  const Device device = c.device();
  DeviceGuard guard(device);
  cublasHandle_t handle = handle_for(device.index);
  const ::chorus::cuda::CublasApi& api = ::chorus::cuda::cublas();
  check_cublas(api.set_stream(handle, static_cast<cudaStream_t>(current_stream(device).handle())), "cublasSetStream");

  // float16 / bfloat16 data: tensor cores with float32 accumulation and float32 alpha/beta (as
  // PyTorch's default, reduced-precision reductions off).
  const bool is_float = dtype != kFloat64;
  const cudaDataType_t type = dtype == kFloat32   ? CUDA_R_32F
                              : dtype == kFloat16 ? CUDA_R_16F
                              : dtype == kBFloat16 ? CUDA_R_16BF
                                                   : CUDA_R_64F;
  const cublasComputeType_t compute =
      dtype == kFloat64 ? CUBLAS_COMPUTE_64F
      : (dtype == kFloat32 && ::chorus::cuda::allow_tf32()) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                            : CUBLAS_COMPUTE_32F;
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_p = is_float ? static_cast<const void*>(&alpha_f) : static_cast<const void*>(&alpha);
  const void* beta_p = is_float ? static_cast<const void*>(&beta_f) : static_cast<const void*>(&beta);
  const int m = static_cast<int>(plan.m), n = static_cast<int>(plan.n), k = static_cast<int>(plan.k);
  const int lda = static_cast<int>(plan.lda), ldb = static_cast<int>(plan.ldb), ldc = static_cast<int>(plan.ldc);
  if (plan.batch == 1) {
    check_cublas(api.gemm_ex(handle, op_of(plan.transa), op_of(plan.transb), m, n, k, alpha_p, first, type, lda,
                             second, type, ldb, beta_p, out, type, ldc, compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  } else {
    CHORUS_CHECK(plan.batch <= 2147483647LL, "bmm on CUDA: batch above 2^31 is not supported");
    check_cublas(api.gemm_strided_batched_ex(handle, op_of(plan.transa), op_of(plan.transb), m, n, k, alpha_p,
                                             first, type, lda, plan.stride_a, second, type, ldb, plan.stride_b,
                                             beta_p, out, type, ldc, plan.stride_c, static_cast<int>(plan.batch),
                                             compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
  }
  if (!cc.is_same(c)) copy(c, cc);
}

}  // namespace

void gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta) {
  run_gemm(c, a, b, alpha, beta, false);
}

void bmm(const Tensor& c, const Tensor& a, const Tensor& b) { run_gemm(c, a, b, 1.0, 0.0, true); }

}  // namespace chorus::kernels::cuda_impl
