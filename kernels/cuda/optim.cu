// Fused optimizer steps on CUDA over contiguous float32/float64 parameter, gradient and state
// buffers, each element updated by kernels/shared/optim_math.h (the cpu kernels' arithmetic; the
// library builds with --fmad=false so no multiply-add is fused): one launch per parameter
// (sgd_step, adam_step), or a multi-tensor apply over a whole list (sgd_step_multi,
// adam_step_multi), planned by kernels/shared/multi_tensor_plan.h.
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/multi_tensor_plan.h"
#include "kernels/shared/optim_math.h"

namespace chorus::kernels::cuda_impl {
namespace {

template <typename T>
__global__ void sgd_kernel(T* w, const T* g, T* v, int64_t n, sh::SgdUpdate<T> update) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (v != nullptr) update(w[i], g[i], v[i]);
    else update(w[i], g[i]);
  }
}

template <typename T>
__global__ void adam_kernel(T* w, const T* g, T* m, T* v, T* vmax, int64_t n, sh::AdamUpdate<T> update) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (vmax != nullptr) update(w[i], g[i], m[i], v[i], vmax[i]);
    else update(w[i], g[i], m[i], v[i]);
  }
}

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data_ptr()) : nullptr;
}

// ------------------------------------------------------------------ multi-tensor apply
// [Multi-tensor apply] The addresses of Depth lists (param, grad, state buffers) for up to
// kMaxTensors tensors, and which tensor and chunk each block updates, passed by value as the kernel
// argument: one launch needs no device-side metadata buffer, no copy before it and nothing kept
// alive after it. Kernel arguments are limited to 4 KiB, so the more lists, the fewer tensors per
// launch (PyTorch's depth_to_max_tensors); the plan splits longer lists into several launches.
constexpr int kMaxTensorsForDepth[] = {110, 64, 48, 36, 30};
constexpr int kMaxBlocksPerLaunch = 320;
constexpr int64_t kChunkElements = 65536;
constexpr int kMultiThreads = 512;

template <int Depth>
struct TensorListArgs {
  static constexpr int kMaxTensors = kMaxTensorsForDepth[Depth - 1];
  void* addresses[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  unsigned char block_tensor[kMaxBlocksPerLaunch];
  int block_chunk[kMaxBlocksPerLaunch];
};
static_assert(sizeof(TensorListArgs<5>) + sizeof(sh::AdamUpdate<double>) + sizeof(int64_t) <= 4096,
              "kernel arguments over CUDA's 4 KiB limit");
static_assert(kMaxTensorsForDepth[0] <= 256, "block_tensor is one byte");

// Element i of the block's tensor, in each list: the update functors below take them in list order.
template <typename T, int Depth, typename Update>
__global__ void multi_tensor_kernel(TensorListArgs<Depth> args, Update update) {
  const int t = args.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(args.block_chunk[blockIdx.x]) * kChunkElements;
  const int64_t end = args.numel[t] < begin + kChunkElements ? args.numel[t] : begin + kChunkElements;
  T* p[Depth];
#pragma unroll
  for (int d = 0; d < Depth; ++d) p[d] = static_cast<T*>(args.addresses[d][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if constexpr (Depth == 2) update(p[0][i], p[1][i]);
    else if constexpr (Depth == 3) update(p[0][i], p[1][i], p[2][i]);
    else if constexpr (Depth == 4) update(p[0][i], p[1][i], p[2][i], p[3][i]);
    else update(p[0][i], p[1][i], p[2][i], p[3][i], p[4][i]);
  }
}

// lists[0] are the parameters; every list has their length (the op layer checked it).
template <typename T, int Depth, typename Update>
void multi_tensor_apply(const std::array<const TensorList*, Depth>& lists, const Update& update, const char* what) {
  const TensorList& params = *lists[0];
  std::vector<int64_t> numels;
  for (const Tensor& p : params) numels.push_back(p.numel());
  const auto launches = sh::plan_multi_tensor(
      numels, {.max_tensors = TensorListArgs<Depth>::kMaxTensors, .max_blocks = kMaxBlocksPerLaunch,
               .chunk_elements = kChunkElements});
  if (launches.empty()) return;
  LaunchContext ctx(params.front().device());
  for (const sh::MultiTensorLaunch& launch : launches) {
    TensorListArgs<Depth> args{};
    for (size_t j = 0; j < launch.tensors.size(); ++j) {
      const int t = launch.tensors[j];
      for (int d = 0; d < Depth; ++d) args.addresses[d][j] = (*lists[d])[t].raw_data_ptr();
      args.numel[j] = numels[t];
    }
    for (size_t b = 0; b < launch.block_tensor.size(); ++b) {
      args.block_tensor[b] = static_cast<unsigned char>(launch.block_tensor[b]);
      args.block_chunk[b] = static_cast<int>(launch.block_chunk[b]);  // < 2^31 chunks of 65536: any tensor
    }
    multi_tensor_kernel<T, Depth><<<static_cast<unsigned>(launch.block_tensor.size()), kMultiThreads, 0,
                                    ctx.stream>>>(args, update);
    check_launch(what);
  }
}

}  // namespace

void sgd_step_multi(const TensorList& params, const TensorList& grads, const TensorList& momentum_buffers, double lr,
                    double weight_decay, double momentum, double dampening, bool nesterov, bool first_step) {
  if (params.empty()) return;
  auto run = [&]<typename T>() {
    const auto update = sh::make_sgd_update<T>(lr, momentum, dampening, weight_decay, nesterov, first_step);
    if (momentum_buffers.empty()) {
      multi_tensor_apply<T, 2>({&params, &grads}, update, "sgd_step_multi");
    } else {
      multi_tensor_apply<T, 3>({&params, &grads, &momentum_buffers}, update, "sgd_step_multi");
    }
  };
  if (params.front().dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void adam_step_multi(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                     const TensorList& exp_avg_sqs, const TensorList& max_exp_avg_sqs, double lr, double beta1,
                     double beta2, double eps, double weight_decay, double step_size, double bias_correction2_sqrt,
                     bool decoupled) {
  if (params.empty()) return;
  auto run = [&]<typename T>() {
    const sh::AdamUpdate<T> update{static_cast<T>(beta1),     static_cast<T>(beta2),
                                   static_cast<T>(eps),       static_cast<T>(step_size),
                                   static_cast<T>(bias_correction2_sqrt), static_cast<T>(weight_decay),
                                   static_cast<T>(1 - lr * weight_decay), decoupled};
    if (max_exp_avg_sqs.empty()) {
      multi_tensor_apply<T, 4>({&params, &grads, &exp_avgs, &exp_avg_sqs}, update, "adam_step_multi");
    } else {
      multi_tensor_apply<T, 5>({&params, &grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs}, update,
                               "adam_step_multi");
    }
  };
  if (params.front().dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr, double weight_decay,
              double momentum, double dampening, bool nesterov, bool first_step) {
  const int64_t n = param.numel();
  if (n == 0) return;
  auto run = [&]<typename T>() {
    const auto update = sh::make_sgd_update<T>(lr, momentum, dampening, weight_decay, nesterov, first_step);
    LaunchContext ctx(param.device());
    sgd_kernel<T><<<grid_for(n, 256, ctx.sms), 256, 0, ctx.stream>>>(
        static_cast<T*>(param.raw_data_ptr()), static_cast<const T*>(grad.raw_data_ptr()),
        ptr_or_null<T>(momentum_buffer), n, update);
    check_launch("sgd_step");
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,
               double step_size, double bias_correction2_sqrt, bool decoupled) {
  const int64_t n = param.numel();
  if (n == 0) return;
  auto run = [&]<typename T>() {
    const sh::AdamUpdate<T> update{static_cast<T>(beta1),     static_cast<T>(beta2),
                                   static_cast<T>(eps),       static_cast<T>(step_size),
                                   static_cast<T>(bias_correction2_sqrt), static_cast<T>(weight_decay),
                                   static_cast<T>(1 - lr * weight_decay), decoupled};
    LaunchContext ctx(param.device());
    adam_kernel<T><<<grid_for(n, 256, ctx.sms), 256, 0, ctx.stream>>>(
        static_cast<T*>(param.raw_data_ptr()), static_cast<const T*>(grad.raw_data_ptr()),
        static_cast<T*>(exp_avg.raw_data_ptr()), static_cast<T*>(exp_avg_sq.raw_data_ptr()),
        ptr_or_null<T>(max_exp_avg_sq), n, update);
    check_launch("adam_step");
  };
  if (param.dtype() == kFloat32) run.template operator()<float>();
  else run.template operator()<double>();
}

}  // namespace chorus::kernels::cuda_impl
