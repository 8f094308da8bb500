// cuBLAS and cuDNN called directly: the "raw library" rows of tests/bench:gpu_bench. Built with the
// library calls only where a CUDA toolkit was found (CHORUS_GPU_BENCH_CUDA); elsewhere available()
// is false and gpu_bench never calls the rest.
#include "tests/bench/gpu_bench_raw.h"

#include <string>

#include "tensor/error.h"

#ifdef CHORUS_GPU_BENCH_CUDA

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <vector>

#include "kernels/cuda/cublas.h"
#include "kernels/cuda/cudnn_plan.h"
#include "kernels/kernel_types.h"
#include "tensor/ops.h"
#include "tensor/runtime.h"

namespace chorus::bench::raw {
namespace {

namespace cp = ::chorus::kernels::cudnn_plan;

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("gpu_bench raw cuBLAS {}: {}", what, cublasGetStatusString(s));
}
void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) fail("gpu_bench raw cuDNN {}: {}", what, cudnnGetErrorString(s));
}

cudaStream_t stream_of(const Tensor& t) { return static_cast<cudaStream_t>(current_stream(t.device()).handle()); }

// One handle for the whole run: the benchmark is single-threaded on one device, and a handle
// created per call would put cuBLAS's setup cost into the timings.
cublasHandle_t cublas() {
  static cublasHandle_t h = [] {
    cublasHandle_t handle = nullptr;
    check(cublasCreate(&handle), "cublasCreate");
    return handle;
  }();
  return h;
}
cudnnHandle_t cudnn() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t handle = nullptr;
    check(cudnnCreate(&handle), "cudnnCreate");
    return handle;
  }();
  return h;
}

cudnnDataType_t cudnn_type(cp::DataType t) {
  switch (t) {
    case cp::DataType::Float: return CUDNN_DATA_FLOAT;
    case cp::DataType::Double: return CUDNN_DATA_DOUBLE;
    case cp::DataType::Half: return CUDNN_DATA_HALF;
    case cp::DataType::BFloat16: return CUDNN_DATA_BFLOAT16;
  }
  return CUDNN_DATA_FLOAT;
}

}  // namespace

bool available() { return true; }
void set_chorus_tf32(bool allow) { ::chorus::cuda::set_allow_tf32(allow); }
void set_chorus_cudnn_tf32(bool allow) { ::chorus::cuda::set_cudnn_allow_tf32(allow); }

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, GemmMath math) {
  const bool batched = a.dim() == 3;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t batch = batched ? a.size(0) : 1;
  const cudaDataType_t type = math == GemmMath::BFloat16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = math == GemmMath::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.f, beta = 0.f;
  check(cublasSetStream(cublas(), stream_of(a)), "cublasSetStream");
  // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: B's buffer first, no transposes.
  if (batched) {
    check(cublasGemmStridedBatchedEx(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b.raw_data_ptr(), type, n,
                                     k * n, a.raw_data_ptr(), type, k, m * k, &beta, out.raw_data_ptr(), type, n, m * n,
                                     batch, compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  } else {
    check(cublasGemmEx(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b.raw_data_ptr(), type, n, a.raw_data_ptr(),
                       type, k, &beta, out.raw_data_ptr(), type, n, compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }
}

struct Conv::Impl {
  Tensor x, w, y, dy, dx, dw, workspace;
  cp::ConvPlan plan;
  cudnnTensorDescriptor_t xd = nullptr, yd = nullptr;
  cudnnFilterDescriptor_t wd = nullptr;
  // One descriptor per direction: each carries the math type its search result ran with.
  std::array<cudnnConvolutionDescriptor_t, 3> cd{};
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  std::array<int, 3> math{};  // cudnnMathType_t of each direction's choice
  size_t workspace_bytes = 0;
};

Conv::Conv(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, const Tensor& dx, const Tensor& dw,
           int64_t stride, int64_t pad, bool allow_tf32)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.x = x, s.w = w, s.y = y, s.dy = dy, s.dx = dx, s.dw = dw;
  const kernels::Window2d window{.in_h = x.size(2), .in_w = x.size(3), .out_h = y.size(2), .out_w = y.size(3),
                                 .kernel_h = w.size(2), .kernel_w = w.size(3), .stride_h = stride, .stride_w = stride,
                                 .pad_h = pad, .pad_w = pad};
  s.plan = cp::plan_conv2d(x.sizes(), x.strides(), w.sizes(), w.strides(), y.sizes(), y.strides(), x.dtype(), window, 1,
                           allow_tf32);
  check(cudnnCreateTensorDescriptor(&s.xd), "cudnnCreateTensorDescriptor");
  check(cudnnCreateTensorDescriptor(&s.yd), "cudnnCreateTensorDescriptor");
  check(cudnnSetTensorNdDescriptor(s.xd, cudnn_type(s.plan.x.type), 4, s.plan.x.dims.data(), s.plan.x.strides.data()),
        "cudnnSetTensorNdDescriptor");
  check(cudnnSetTensorNdDescriptor(s.yd, cudnn_type(s.plan.y.type), 4, s.plan.y.dims.data(), s.plan.y.strides.data()),
        "cudnnSetTensorNdDescriptor");
  check(cudnnCreateFilterDescriptor(&s.wd), "cudnnCreateFilterDescriptor");
  check(cudnnSetFilterNdDescriptor(s.wd, cudnn_type(s.plan.w.type), CUDNN_TENSOR_NCHW, 4, s.plan.w.dims.data()),
        "cudnnSetFilterNdDescriptor");
  for (auto& d : s.cd) {
    check(cudnnCreateConvolutionDescriptor(&d), "cudnnCreateConvolutionDescriptor");
    check(cudnnSetConvolutionNdDescriptor(d, 2, s.plan.conv.pad.data(), s.plan.conv.stride.data(),
                                          s.plan.conv.dilation.data(), CUDNN_CROSS_CORRELATION,
                                          cudnn_type(s.plan.conv.compute)),
          "cudnnSetConvolutionNdDescriptor");
    check(cudnnSetConvolutionMathType(d, static_cast<cudnnMathType_t>(s.plan.math)),
          "cudnnSetConvolutionMathType");
  }
  check(cudnnSetStream(cudnn(), stream_of(x)), "cudnnSetStream");

  // The search gets the same 1 GiB limit chorus's conv2d searches with by default, so both sides
  // choose among the same algorithms.
  const int64_t limit = int64_t(1) << 30;
  Tensor search = empty({limit}, {.dtype = kUInt8, .device = x.device()});
  int returned = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> f(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  check(cudnnFindConvolutionForwardAlgorithmEx(cudnn(), s.xd, x.raw_data_ptr(), s.wd, w.raw_data_ptr(), s.cd[0], s.yd,
                                               y.raw_data_ptr(), static_cast<int>(f.size()), &returned, f.data(),
                                               search.raw_data_ptr(), limit),
        "cudnnFindConvolutionForwardAlgorithmEx");
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bd(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  int returned_bd = 0;
  check(cudnnFindConvolutionBackwardDataAlgorithmEx(cudnn(), s.wd, w.raw_data_ptr(), s.yd, dy.raw_data_ptr(), s.cd[1],
                                                    s.xd, dx.raw_data_ptr(), static_cast<int>(bd.size()), &returned_bd,
                                                    bd.data(), search.raw_data_ptr(), limit),
        "cudnnFindConvolutionBackwardDataAlgorithmEx");
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  int returned_bf = 0;
  check(cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnn(), s.xd, x.raw_data_ptr(), s.yd, dy.raw_data_ptr(), s.cd[2],
                                                      s.wd, dw.raw_data_ptr(), static_cast<int>(bf.size()), &returned_bf,
                                                      bf.data(), search.raw_data_ptr(), limit),
        "cudnnFindConvolutionBackwardFilterAlgorithmEx");
  // cuDNN returns the results fastest first; the first that ran is the choice.
  auto first_ok = [](const auto& results, int n, const char* what) {
    for (int i = 0; i < n; ++i) {
      if (results[i].status == CUDNN_STATUS_SUCCESS) return results[i];
    }
    fail("gpu_bench raw cuDNN: no {} algorithm ran", what);
  };
  const auto cf = first_ok(f, returned, "forward");
  const auto cbd = first_ok(bd, returned_bd, "backward-data");
  const auto cbf = first_ok(bf, returned_bf, "backward-filter");
  s.fwd = cf.algo, s.bwd_data = cbd.algo, s.bwd_filter = cbf.algo;
  s.math = {static_cast<int>(cf.mathType), static_cast<int>(cbd.mathType), static_cast<int>(cbf.mathType)};
  check(cudnnSetConvolutionMathType(s.cd[0], cf.mathType), "cudnnSetConvolutionMathType");
  check(cudnnSetConvolutionMathType(s.cd[1], cbd.mathType), "cudnnSetConvolutionMathType");
  check(cudnnSetConvolutionMathType(s.cd[2], cbf.mathType), "cudnnSetConvolutionMathType");
  s.workspace_bytes = std::max({cf.memory, cbd.memory, cbf.memory});
  search = Tensor();
  s.workspace = empty({static_cast<int64_t>(s.workspace_bytes)}, {.dtype = kUInt8, .device = x.device()});
}

Conv::~Conv() {
  if (!impl_) return;
  for (auto d : impl_->cd) cudnnDestroyConvolutionDescriptor(d);
  cudnnDestroyFilterDescriptor(impl_->wd);
  cudnnDestroyTensorDescriptor(impl_->xd);
  cudnnDestroyTensorDescriptor(impl_->yd);
}

void Conv::run() {
  Impl& s = *impl_;
  const float one = 1.f, zero = 0.f;
  void* ws = s.workspace.raw_data_ptr();
  check(cudnnSetStream(cudnn(), stream_of(s.x)), "cudnnSetStream");
  check(cudnnConvolutionForward(cudnn(), &one, s.xd, s.x.raw_data_ptr(), s.wd, s.w.raw_data_ptr(), s.cd[0], s.fwd, ws,
                                s.workspace_bytes, &zero, s.yd, s.y.raw_data_ptr()),
        "cudnnConvolutionForward");
  check(cudnnConvolutionBackwardData(cudnn(), &one, s.wd, s.w.raw_data_ptr(), s.yd, s.dy.raw_data_ptr(), s.cd[1],
                                     s.bwd_data, ws, s.workspace_bytes, &zero, s.xd, s.dx.raw_data_ptr()),
        "cudnnConvolutionBackwardData");
  check(cudnnConvolutionBackwardFilter(cudnn(), &one, s.xd, s.x.raw_data_ptr(), s.yd, s.dy.raw_data_ptr(), s.cd[2],
                                       s.bwd_filter, ws, s.workspace_bytes, &zero, s.wd, s.dw.raw_data_ptr()),
        "cudnnConvolutionBackwardFilter");
}

std::string Conv::algorithms() const {
  // As gpu_bench notes chorus's choices (m: the math type).
  return "fwd " + std::to_string(impl_->fwd) + " m" + std::to_string(impl_->math[0]) + " / bwd-data " +
         std::to_string(impl_->bwd_data) + " m" + std::to_string(impl_->math[1]) + " / bwd-filter " +
         std::to_string(impl_->bwd_filter) + " m" + std::to_string(impl_->math[2]);
}

}  // namespace chorus::bench::raw

#else  // no CUDA toolkit: nothing to call

namespace chorus::bench::raw {

namespace {
[[noreturn]] void none() { fail("gpu_bench: built without CUDA: no raw cuBLAS/cuDNN baselines"); }
}  // namespace

bool available() { return false; }
void set_chorus_tf32(bool) {}
void set_chorus_cudnn_tf32(bool) {}
void gemm(const Tensor&, const Tensor&, const Tensor&, GemmMath) { none(); }
struct Conv::Impl {};
Conv::Conv(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t,
           bool) {
  none();
}
Conv::~Conv() = default;
void Conv::run() { none(); }
std::string Conv::algorithms() const { return {}; }

}  // namespace chorus::bench::raw

#endif
