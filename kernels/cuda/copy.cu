// Copies (any strides, broadcast source, every dtype pair through the shared Cast), fills, arange and
// the Philox random fills on CUDA. Random fills give element i the draw of Philox block
// first_block + i / kPerBlock (kernels/shared/philox.h), as the cpu kernels: the same numbers for the same seed.
// Built with nvcc's default --fmad=true (a library of its own): the uniform draws' `lo + span * u` is
// then one fused multiply-add, as g++ contracts it in the cpu kernels (-mfma, -ffp-contract=fast).
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/philox.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::cuda_impl {

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && dst.sizes() == src.sizes()) {
    // The same memory: nothing to copy (a cudaMemcpyAsync onto itself would be an overlapping copy,
    // undefined). Partly overlapping areas never get here from copy_ (it copies through a temporary);
    // sim refuses them ([A copy between overlapping areas], kernels/sim/sim_kernels.cpp).
    if (dst.raw_data_ptr() == src.raw_data_ptr()) return;
    LaunchContext ctx(dst.device());
    check_cuda(cudaMemcpyAsync(dst.raw_data_ptr(), src.raw_data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                               ctx.stream),
               "copy (cudaMemcpyAsync)");
    return;
  }
  CHORUS_DISPATCH_ALL(dst.dtype(), "copy", [&]<typename D>() {
    CHORUS_DISPATCH_ALL(src.dtype(), "copy", [&]<typename S>() { unary_launch<D, S>("copy", dst, src, sh::Cast<D>{}); });
  });
}

namespace {
template <typename T>
struct FillElem {
  T value;
  __device__ __forceinline__ void operator()(char* const (&p)[1]) const { *reinterpret_cast<T*>(p[0]) = value; }
};

template <typename T>
__global__ void arange_kernel(T* out, int64_t n, double start, double step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // One fused multiply-add: the cpu kernel's `start + i * step` is contracted to vfmadd by g++
    // (kernels/cpu builds with -mfma, and g++'s C++ default is -ffp-contract=fast), so the bits match.
    out[i] = sh::Cast<T>{}(__fma_rn(static_cast<double>(i), step, start));
  }
}

// One thread per Philox block: kPerBlock consecutive elements from one philox4x32_10 call.
template <typename T, typename Draw>
__global__ void philox_kernel(T* out, int64_t n, uint64_t seed, uint64_t first_block, Draw draw) {
  constexpr int per_block = Draw::kPerBlock;
  const int64_t blocks = (n + per_block - 1) / per_block;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const sh::PhiloxBlock words = sh::philox4x32_10(seed, first_block + static_cast<uint64_t>(b));
#pragma unroll
    for (int j = 0; j < per_block; ++j) {
      const int64_t i = b * per_block + j;
      if (i < n) out[i] = sh::Cast<T>{}(draw(words, j));
    }
  }
}

// Writes a dense buffer (out itself when contiguous), then copies it into out's view.
template <typename T, typename Draw>
void philox_fill(const Tensor& out, uint64_t seed, uint64_t first_block, const Draw& draw, const char* what) {
  if (out.numel() == 0) return;
  Tensor dense = out.is_contiguous() ? out : empty_like_dense(out);
  const int64_t n = dense.numel();
  {
    LaunchContext ctx(out.device());
    const int64_t blocks = (n + Draw::kPerBlock - 1) / Draw::kPerBlock;
    philox_kernel<T, Draw><<<grid_for(blocks, 256, ctx.sms), 256, 0, ctx.stream>>>(
        static_cast<T*>(dense.raw_data_ptr()), n, seed, first_block, draw);
    check_launch(what);
  }
  if (!out.is_same(dense)) copy(out, dense);
}
}  // namespace

void fill(const Tensor& dst, const Scalar& value) {
  if (dst.numel() == 0) return;
  CHORUS_DISPATCH_ALL(dst.dtype(), "fill_", [&]<typename T>() {
    launch_elementwise<1>("fill_", {&dst}, FillElem<T>{value.to<T>()});
  });
}

void arange(const Tensor& out, double start, double step) {
  if (out.numel() == 0) return;
  Tensor dense = out.is_contiguous() ? out : empty_like_dense(out);
  CHORUS_DISPATCH_ALL(out.dtype(), "arange", [&]<typename T>() {
    LaunchContext ctx(out.device());
    arange_kernel<T><<<grid_for(dense.numel(), 256, ctx.sms), 256, 0, ctx.stream>>>(
        static_cast<T*>(dense.raw_data_ptr()), dense.numel(), start, step);
    check_launch("arange");
  });
  if (!out.is_same(dense)) copy(out, dense);
}

void uniform_at(const Tensor& out, double low, double high, uint64_t seed, uint64_t first_block) {
  CHORUS_DISPATCH_ALL(out.dtype(), "rand", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      philox_fill<T>(out, seed, first_block, sh::UniformDoubleDraw{low, high}, "rand");
    } else if constexpr (std::is_same_v<T, float> || sh::is_reduced_float_v<T>) {
      philox_fill<T>(out, seed, first_block,
                     sh::UniformFloatDraw{static_cast<float>(low), static_cast<float>(high - low)}, "rand");
    } else {
      fail("rand: expected a floating-point dtype, got {}", dtype_name(out.dtype()));
    }
  });
}

void normal_at(const Tensor& out, double mean, double std, uint64_t seed, uint64_t first_block) {
  CHORUS_DISPATCH_ALL(out.dtype(), "randn", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      philox_fill<T>(out, seed, first_block, sh::NormalDoubleDraw{mean, std}, "randn");
    } else if constexpr (std::is_same_v<T, float> || sh::is_reduced_float_v<T>) {
      philox_fill<T>(out, seed, first_block,
                     sh::NormalFloatDraw{static_cast<float>(mean), static_cast<float>(std)}, "randn");
    } else {
      fail("randn: expected a floating-point dtype, got {}", dtype_name(out.dtype()));
    }
  });
}

void random_int_at(const Tensor& out, int64_t low, int64_t high, uint64_t seed, uint64_t first_block) {
  const sh::RandintDraw draw{low, static_cast<uint64_t>(high - low)};
  CHORUS_DISPATCH_ALL(out.dtype(), "randint",
                      [&]<typename T>() { philox_fill<T>(out, seed, first_block, draw, "randint"); });
}

}  // namespace chorus::kernels::cuda_impl
