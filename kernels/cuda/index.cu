// index_select, gather, scatter (assign or accumulate) and index_add on CUDA: one strided kernel
// over the iterated shape, with the coordinate of `dim` on the indexed side replaced by the index.
// Accumulation uses atomicAdd where CUDA has one (int32, int64, float32, float64); other dtypes
// accumulate in one sequential thread, as the cpu kernel does, so duplicates always add up.
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/kernels.h"
#include "kernels/shared/pointwise_math.h"

namespace chorus::kernels::cuda_impl {
namespace {

constexpr int kMaxDims = 16;

// The iterated shape, and the strides (elements) of the plain side and of the indexed side.
struct Geometry {
  int nd = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t plain_strides[kMaxDims] = {};
  int64_t indexed_strides[kMaxDims] = {};
};

enum class Mode { Read, Write, Add };  // plain = indexed[q] / indexed[q] = plain / indexed[q] += plain

template <typename T>
constexpr bool kHasAtomicAdd = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> ||
                               std::is_same_v<T, int64_t>;

template <typename T>
__device__ __forceinline__ void add_to(T* p, T v, bool atomic) {
  if constexpr (kHasAtomicAdd<T>) {
    if (atomic) {
      if constexpr (std::is_same_v<T, int64_t>) {
        atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
      } else {
        atomicAdd(p, v);
      }
      return;
    }
  }
  if constexpr (std::is_same_v<T, bool>) *p = sh::LogicalOr{}(*p, v);
  else if constexpr (sh::is_reduced_float_v<T>)
    *p = sh::Cast<T>{}(sh::Add{}(sh::Cast<float>{}(*p), sh::Cast<float>{}(v)));
  else *p = sh::Add{}(*p, v);
}

template <typename T, Mode M>
__global__ void indexed_kernel(Geometry g, int64_t numel, int dim, const int64_t* index, bool per_element_index,
                               T* plain, T* indexed, bool atomic) {
  for (int64_t linear = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; linear < numel;
       linear += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = linear, p = 0, q = 0, at_dim = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t c = rem % g.sizes[d];
      rem /= g.sizes[d];
      p += c * g.plain_strides[d];
      if (d == dim) at_dim = c;
      else q += c * g.indexed_strides[d];
    }
    q += index[per_element_index ? linear : at_dim] * g.indexed_strides[dim];
    if constexpr (M == Mode::Read) plain[p] = indexed[q];
    else if constexpr (M == Mode::Write) indexed[q] = plain[p];
    else add_to(indexed + q, plain[p], atomic);
  }
}

Geometry geometry(const Shape& shape, const Tensor& plain, const Tensor& indexed) {
  CHORUS_CHECK(static_cast<int>(shape.size()) <= kMaxDims, "index kernels on CUDA: at most {} dims", kMaxDims);
  Geometry g;
  g.nd = static_cast<int>(shape.size());
  for (int d = 0; d < g.nd; ++d) {
    g.sizes[d] = shape[d];
    g.plain_strides[d] = plain.strides()[d];
    g.indexed_strides[d] = indexed.strides()[d];
  }
  return g;
}

Tensor contiguous_index(const Tensor& index) {
  if (index.is_contiguous()) return index;
  Tensor d = make_tensor(index.sizes(), kInt64, index.device());
  copy(d, index);
  return d;
}

template <Mode M>
void run_indexed(const char* what, const Shape& shape, const Tensor& plain, const Tensor& indexed, int64_t dim,
                 const Tensor& index, bool per_element_index) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return;
  const Tensor idx = contiguous_index(index);
  const Geometry g = geometry(shape, plain, indexed);
  CHORUS_DISPATCH_ALL(indexed.dtype(), what, [&]<typename T>() {
    LaunchContext ctx(indexed.device());
    const bool atomic = M == Mode::Add && kHasAtomicAdd<T>;
    // Accumulating without atomics: one thread, in order, so repeated indices all add.
    const bool sequential = M == Mode::Add && !atomic;
    const unsigned blocks = sequential ? 1u : grid_for(numel, 256, ctx.sms);
    const unsigned threads = sequential ? 1u : 256u;
    indexed_kernel<T, M><<<blocks, threads, 0, ctx.stream>>>(g, numel, static_cast<int>(dim),
                                                             static_cast<const int64_t*>(idx.raw_data_ptr()),
                                                             per_element_index, static_cast<T*>(plain.raw_data_ptr()),
                                                             static_cast<T*>(indexed.raw_data_ptr()), atomic);
    check_launch(what);
  });
}

}  // namespace

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  run_indexed<Mode::Read>("index_select", out.sizes(), out, in, dim, index, false);
}

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  run_indexed<Mode::Read>("gather", index.sizes(), out, in, dim, index, true);
}

void scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  if (accumulate) run_indexed<Mode::Add>("scatter_add", index.sizes(), src, self, dim, index, true);
  else run_indexed<Mode::Write>("scatter", index.sizes(), src, self, dim, index, true);
}

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  run_indexed<Mode::Add>("index_add", src.sizes(), src, out, dim, index, false);
}

}  // namespace chorus::kernels::cuda_impl
