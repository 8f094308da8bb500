// The elementwise iteration every pointwise CPU kernel uses. Operands are broadcast to one shape
// (stride 0 on broadcast dims), dims that are contiguous across all operands are merged, and the
// work is cut into runs along the innermost dim. The inner loop is a template parameter, so the
// per-element work is inlined and vectorized: no virtual call or std::function per element.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <vector>

#include "kernels/cpu/capability.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/shared/pointwise_math.h"
#include "kernels/shared/storage_dispatch.h"
#include "tensor/tensor.h"

// Marks the per-element lambdas given to simd_for: they must be inlined into its vector loop (a
// call per element would not vectorize), including into the AVX-512 variant.
#define CHORUS_ELEMENT __attribute__((always_inline))

// The first statement of a lambda given to simd_for_uncontracted (and of any function whose a * b + c
// must round twice). g++ decides contraction where the code ends up, so simd_for_uncontracted's own
// `optimize("fp-contract=off")` covers the lambda inlined into it; clang decides it where the
// expression is written (the lambda), so the lambda must say it itself.
#if defined(__clang__)
#define CHORUS_UNCONTRACTED _Pragma("clang fp contract(off)")
#define CHORUS_UNCONTRACTED_BEGIN
#define CHORUS_UNCONTRACTED_END
#else
#define CHORUS_UNCONTRACTED
#define CHORUS_UNCONTRACTED_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define CHORUS_UNCONTRACTED_END _Pragma("GCC pop_options")
#endif

namespace chorus::kernels::cpu {

// [ISA variants] (capability.h): the vector loops every contiguous run goes through, written once
// here and expanded twice: for the build's floor (AVX2 + FMA) and inside an AVX-512 region (once, the
// floor's, in the sanitizer builds: CHORUS_AVX512_VARIANT in capability.h). `body(i)`
// is inlined into whichever runs; it must have no dependence between iterations (as `#pragma omp
// simd` says).
//   simd_for(begin, end, body)                 body(i) for every i
//   simd_sum<Acc>(begin, end, body)            the sum of body(i) in Acc, one partial sum per lane
//                                              of two vectors (so its last bits depend on the
//                                              variant's width). Written as explicit lanes: GCC 12
//                                              left `omp simd reduction(+:acc)` over an inlined
//                                              lambda scalar (a layer norm row at 4 ns an element)
//   simd_max<T>(begin, end, init, body)        the largest of init and body(i) by `>` (a NaN is
//                                              never taken, as a scalar `v > m ? v : m` loop)
//   simd_for_uncontracted(begin, end, body)    simd_for with floating-point contraction off (no
//                                              a * b + c fused into one multiply-add), for updates
//                                              that must equal their written arithmetic in every
//                                              variant: the optimizer steps (optim_math_test).
//                                              For clang, body begins with CHORUS_UNCONTRACTED
//                                              (or its file turns contraction off: optim.cpp)
#define CHORUS_ISA_LOOPS                                                                      \
  template <typename Body>                                                                    \
  void simd_for(int64_t begin, int64_t end, const Body& body) {                               \
    _Pragma("omp simd") for (int64_t i = begin; i < end; ++i) body(i);                        \
  }                                                                                           \
  template <typename Acc, typename Body>                                                      \
  Acc simd_sum(int64_t begin, int64_t end, const Body& body) {                                \
    constexpr int kLanes = 2 * kVectorBytes / static_cast<int>(sizeof(Acc));                  \
    Acc lanes[kLanes] = {};                                                                   \
    int64_t i = begin;                                                                        \
    for (; i + kLanes <= end; i += kLanes) {                                                  \
      _Pragma("omp simd") for (int j = 0; j < kLanes; ++j) lanes[j] += body(i + j);           \
    }                                                                                         \
    Acc acc = 0;                                                                              \
    for (; i < end; ++i) acc += body(i);                                                      \
    for (int j = 0; j < kLanes; ++j) acc += lanes[j];                                         \
    return acc;                                                                               \
  }                                                                                           \
  template <typename T, typename Body>                                                        \
  T simd_max(int64_t begin, int64_t end, T init, const Body& body) {                          \
    constexpr int kLanes = 2 * kVectorBytes / static_cast<int>(sizeof(T));                    \
    T lanes[kLanes];                                                                          \
    for (int j = 0; j < kLanes; ++j) lanes[j] = init;                                         \
    int64_t i = begin;                                                                        \
    for (; i + kLanes <= end; i += kLanes) {                                                  \
      _Pragma("omp simd") for (int j = 0; j < kLanes; ++j) {                                  \
        const T v = body(i + j);                                                              \
        lanes[j] = v > lanes[j] ? v : lanes[j];                                               \
      }                                                                                       \
    }                                                                                         \
    T m = init;                                                                               \
    for (; i < end; ++i) {                                                                    \
      const T v = body(i);                                                                    \
      m = v > m ? v : m;                                                                      \
    }                                                                                         \
    for (int j = 0; j < kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;                         \
    return m;                                                                                 \
  }                                                                                           \
  CHORUS_UNCONTRACTED_BEGIN                                                                   \
  template <typename Body>                                                                    \
  void simd_for_uncontracted(int64_t begin, int64_t end, const Body& body) {                  \
    _Pragma("omp simd") for (int64_t i = begin; i < end; ++i) body(i);                        \
  }                                                                                           \
  CHORUS_UNCONTRACTED_END

namespace isa_avx2 {
inline constexpr int kVectorBytes = 32;
CHORUS_ISA_LOOPS
}  // namespace isa_avx2
#if CHORUS_AVX512_VARIANT
CHORUS_AVX512_BEGIN
namespace isa_avx512 {
inline constexpr int kVectorBytes = 64;
CHORUS_ISA_LOOPS
}  // namespace isa_avx512
CHORUS_AVX512_END
#else
namespace isa_avx512 = isa_avx2;  // a sanitizer build: the floor's loops only (capability.h)
#endif
#undef CHORUS_ISA_LOOPS

// The dispatch: one relaxed atomic load per call (per run of elements, not per element).
template <typename Body>
void simd_for(int64_t begin, int64_t end, const Body& body) {
  if (cpu_capability_fast() == CpuCapability::kAvx512) isa_avx512::simd_for(begin, end, body);
  else isa_avx2::simd_for(begin, end, body);
}

template <typename Acc, typename Body>
Acc simd_sum(int64_t begin, int64_t end, const Body& body) {
  if (cpu_capability_fast() == CpuCapability::kAvx512) return isa_avx512::simd_sum<Acc>(begin, end, body);
  return isa_avx2::simd_sum<Acc>(begin, end, body);
}

template <typename T, typename Body>
T simd_max(int64_t begin, int64_t end, T init, const Body& body) {
  if (cpu_capability_fast() == CpuCapability::kAvx512) return isa_avx512::simd_max<T>(begin, end, init, body);
  return isa_avx2::simd_max<T>(begin, end, init, body);
}

template <typename Body>
void simd_for_uncontracted(int64_t begin, int64_t end, const Body& body) {
  if (cpu_capability_fast() == CpuCapability::kAvx512) isa_avx512::simd_for_uncontracted(begin, end, body);
  else isa_avx2::simd_for_uncontracted(begin, end, body);
}

// Per-dim numbers (sizes, byte strides, indices) of an iteration: held inline up to kInline dims,
// on the heap beyond. make_iter and for_each_run run once per op (and per parallel chunk); with
// std::vectors they allocated about fifteen times for a binary op (the strides, their growth, the
// sort's buffer, the index), and in an ASan build, where each allocation records its stack,
// make_iter was a tenth of a small-op gradcheck's time (tests/nn:rnn_test, perf, 2026-12-03).
class IterDims {
 public:
  static constexpr size_t kInline = 8;
  IterDims() = default;
  explicit IterDims(size_t n, int64_t value = 0) { resize(n, value); }
  IterDims(const IterDims&) = default;
  IterDims& operator=(const IterDims&) = default;
  // A moved-from IterDims is empty (the default move would keep size_ over a moved-out heap_).
  IterDims(IterDims&& other) noexcept : size_(other.size_), inline_(other.inline_), heap_(std::move(other.heap_)) {
    other.size_ = 0;
    other.heap_.clear();
  }
  IterDims& operator=(IterDims&& other) noexcept {
    if (this != &other) {
      size_ = other.size_;
      inline_ = other.inline_;
      heap_ = std::move(other.heap_);
      other.size_ = 0;
      other.heap_.clear();
    }
    return *this;
  }
  void resize(size_t n, int64_t value = 0) {
    if (n > kInline) {
      if (size_ <= kInline) heap_.assign(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(size_));
      heap_.resize(n, value);
    } else if (size_ > kInline) {
      std::copy(heap_.begin(), heap_.begin() + static_cast<std::ptrdiff_t>(n), inline_.begin());
      heap_.clear();
    } else {
      for (size_t i = size_; i < n; ++i) inline_[i] = value;
    }
    size_ = n;
  }
  void push_back(int64_t value) {
    resize(size_ + 1);
    back() = value;
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return size_ > kInline ? heap_.data() : inline_.data(); }
  const int64_t* data() const { return size_ > kInline ? heap_.data() : inline_.data(); }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t& back() { return data()[size_ - 1]; }

 private:
  size_t size_ = 0;
  std::array<int64_t, kInline> inline_{};
  std::vector<int64_t> heap_;  // the numbers when size_ > kInline
};

template <int N>
struct StridedIter {
  IterDims shape;                    // merged dims, innermost last
  std::array<char*, N> base{};       // operand 0 is the output
  std::array<IterDims, N> stride;    // byte strides per operand per dim
  int64_t numel = 0;
};

// Builds the iteration of `operands` (all already broadcastable to `shape`; operand 0 has it).
template <int N>
StridedIter<N> make_iter(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  StridedIter<N> it;
  it.numel = numel_of(shape);
  const size_t nd = shape.size();
  // Broadcast strides in bytes, trailing-aligned.
  std::array<IterDims, N> strides;
  for (int k = 0; k < N; ++k) {
    const Tensor& t = *operands[k];
    it.base[k] = static_cast<char*>(t.raw_data_ptr());
    strides[k].resize(nd, 0);
    const size_t off = nd - t.sizes().size();
    const int64_t es = static_cast<int64_t>(t.element_size());
    for (size_t d = 0; d < t.sizes().size(); ++d) {
      strides[k][d + off] = t.sizes()[d] == 1 ? 0 : t.strides()[d] * es;
    }
  }
  // Walk the dims in the output's memory order (outermost first), as PyTorch's TensorIterator: a
  // channels-last output then runs along C innermost and merges into long dense runs, instead of
  // stepping through W with stride C. A row-major output keeps the logical order: a stable sort by
  // decreasing |stride| (insertion, as std::stable_sort would allocate its buffer; nd is small).
  IterDims order(nd);
  for (size_t d = 0; d < nd; ++d) {
    size_t j = d;
    while (j > 0 && std::abs(strides[0][static_cast<size_t>(order[j - 1])]) < std::abs(strides[0][d])) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = static_cast<int64_t>(d);
  }
  // Merge adjacent dims when every operand steps through them as one; drop size-1 dims.
  IterDims& merged = it.shape;
  std::array<IterDims, N>& mstride = it.stride;
  for (size_t i = 0; i < nd; ++i) {
    const auto d = static_cast<size_t>(order[i]);
    if (shape[d] == 1) continue;
    bool can_merge = !merged.empty();
    for (int k = 0; k < N && can_merge; ++k) {
      can_merge = mstride[k].back() == strides[k][d] * shape[d];
    }
    if (can_merge) {
      merged.back() *= shape[d];
      for (int k = 0; k < N; ++k) mstride[k].back() = strides[k][d];
    } else {
      merged.push_back(shape[d]);
      for (int k = 0; k < N; ++k) mstride[k].push_back(strides[k][d]);
    }
  }
  if (merged.empty()) {  // a single element
    merged.push_back(1);
    for (int k = 0; k < N; ++k) mstride[k].push_back(0);
  }
  return it;
}

// Calls loop(ptrs, inner_strides, n) for runs of the innermost dim covering linear indices
// [begin, end) of the iteration.
template <int N, typename Loop>
void for_each_run(const StridedIter<N>& it, int64_t begin, int64_t end, const Loop& loop) {
  const int nd = static_cast<int>(it.shape.size());
  const int64_t inner = it.shape[nd - 1];
  std::array<int64_t, N> inner_stride;
  for (int k = 0; k < N; ++k) inner_stride[k] = it.stride[k][nd - 1];
  // Multi-index of `begin` over the outer dims.
  IterDims idx(nd, 0);
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % it.shape[d];
    rem /= it.shape[d];
  }
  std::array<char*, N> ptr;
  for (int k = 0; k < N; ++k) {
    ptr[k] = it.base[k];
    for (int d = 0; d < nd; ++d) ptr[k] += idx[d] * it.stride[k][d];
  }
  int64_t pos = begin;
  while (pos < end) {
    int64_t n = std::min(inner - idx[nd - 1], end - pos);
    loop(ptr.data(), inner_stride.data(), n);
    pos += n;
    if (pos >= end) break;
    // Advance to the start of the next run: the innermost index wraps, carry into outer dims.
    for (int k = 0; k < N; ++k) ptr[k] += (inner - idx[nd - 1]) * inner_stride[k] - inner * inner_stride[k];
    idx[nd - 1] = 0;
    for (int d = nd - 2; d >= 0; --d) {
      ++idx[d];
      for (int k = 0; k < N; ++k) ptr[k] += it.stride[k][d];
      if (idx[d] < it.shape[d]) break;
      for (int k = 0; k < N; ++k) ptr[k] -= it.shape[d] * it.stride[k][d];
      idx[d] = 0;
    }
  }
}

template <int N, typename Loop>
void run_parallel(const StridedIter<N>& it, const Loop& loop, int64_t grain = kGrainSize) {
  parallel_for(0, it.numel, grain,
               [&](int64_t begin, int64_t end) { for_each_run<N>(it, begin, end, loop); });
}

// out[i] = f(a[i])
template <typename Out, typename A, typename F>
void unary_loop(const StridedIter<2>& it, const F& f) {
  run_parallel<2>(it, [&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(Out) && s[1] == sizeof(A)) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const A* a = reinterpret_cast<const A*>(p[1]);
      simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { o[i] = f(a[i]); });
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const A*>(p[1] + i * s[1]));
      }
    }
  });
}

// out[i] = f(a[i], b[i]), with fast paths for contiguous runs and a broadcast scalar on either side.
template <typename Out, typename A, typename B, typename F>
void binary_loop(const StridedIter<3>& it, const F& f) {
  run_parallel<3>(it, [&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const A* a = reinterpret_cast<const A*>(p[1]);
    const B* b = reinterpret_cast<const B*>(p[2]);
    // Each element is read before its own output is written and no other (in place: o == a or
    // o == b exactly), so the contiguous runs can be vector loops.
    if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == sizeof(B)) {
      simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { o[i] = f(a[i], b[i]); });
    } else if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == 0) {
      const B bv = *b;
      simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { o[i] = f(a[i], bv); });
    } else if (s[0] == sizeof(Out) && s[1] == 0 && s[2] == sizeof(B)) {
      const A av = *a;
      simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { o[i] = f(av, b[i]); });
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const A*>(p[1] + i * s[1]),
                                                     *reinterpret_cast<const B*>(p[2] + i * s[2]));
      }
    }
  });
}

// out[i] = f(a[i], b[i], c[i])
template <typename Out, typename A, typename B, typename C, typename F>
void ternary_loop(const StridedIter<4>& it, const F& f) {
  run_parallel<4>(it, [&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(Out) && s[1] == sizeof(A) && s[2] == sizeof(B) && s[3] == sizeof(C)) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const A* a = reinterpret_cast<const A*>(p[1]);
      const B* b = reinterpret_cast<const B*>(p[2]);
      const C* c = reinterpret_cast<const C*>(p[3]);
      simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { o[i] = f(a[i], b[i], c[i]); });
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      *reinterpret_cast<Out*>(p[0] + i * s[0]) = f(*reinterpret_cast<const A*>(p[1] + i * s[1]),
                                                   *reinterpret_cast<const B*>(p[2] + i * s[2]),
                                                   *reinterpret_cast<const C*>(p[3] + i * s[3]));
    }
  });
}

// ------------------------------------------------------------------ float16/bfloat16 storage
// [Half storage] (kernels/shared/pointwise_math.h): out[i] = round(f(float(a[i]), ...)) with f at
// float. A contiguous run goes through float buffers of kOpmathChunk elements: widen (exact), then
// f over the buffers in the very simd_for loop the float32 kernel runs over its arrays, then round.
// That keeps the bits equal to widening even where the float32 loop calls libmvec's vector erf/exp/
// tanh (vector_math.h), which differ from the scalar libm calls in the last place: the element
// positions that run vector or scalar code are the same, since every chunk but the last is a
// multiple of any vector width. Strided runs are scalar, as the float32 kernel's strided runs.
inline constexpr int64_t kOpmathChunk = 256;

template <typename Out, typename A, typename F>
void unary_loop_opmath(const StridedIter<2>& it, const F& f) {
  using shared::to_opmath;
  using M = shared::opmath_t<A>;
  using R = decltype(f(M()));
  run_parallel<2>(it, [&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(Out) && s[1] == sizeof(A)) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const A* a = reinterpret_cast<const A*>(p[1]);
      M abuf[kOpmathChunk];
      R rbuf[kOpmathChunk];
      for (int64_t c0 = 0; c0 < n; c0 += kOpmathChunk) {
        const int64_t len = std::min(kOpmathChunk, n - c0);
        simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { abuf[i] = to_opmath(a[c0 + i]); });
        simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { rbuf[i] = f(abuf[i]); });
        simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { o[c0 + i] = shared::Cast<Out>{}(rbuf[i]); });
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) =
            shared::Cast<Out>{}(f(to_opmath(*reinterpret_cast<const A*>(p[1] + i * s[1]))));
      }
    }
  });
}

// The three contiguous cases of binary_loop (both operands, a broadcast b, a broadcast a), each
// through float buffers as unary_loop_opmath. B may be float (a float32 Scalar operand).
template <typename Out, typename A, typename B, typename F>
void binary_loop_opmath(const StridedIter<3>& it, const F& f) {
  using shared::to_opmath;
  using MA = shared::opmath_t<A>;
  using MB = shared::opmath_t<B>;
  using R = decltype(f(MA(), MB()));
  run_parallel<3>(it, [&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const A* a = reinterpret_cast<const A*>(p[1]);
    const B* b = reinterpret_cast<const B*>(p[2]);
    const bool out_dense = s[0] == sizeof(Out);
    const bool a_dense = s[1] == sizeof(A), b_dense = s[2] == sizeof(B);
    if (out_dense && ((a_dense && b_dense) || (a_dense && s[2] == 0) || (s[1] == 0 && b_dense))) {
      MA abuf[kOpmathChunk];
      MB bbuf[kOpmathChunk];
      R rbuf[kOpmathChunk];
      const MA av = to_opmath(*a);
      const MB bv = to_opmath(*b);
      for (int64_t c0 = 0; c0 < n; c0 += kOpmathChunk) {
        const int64_t len = std::min(kOpmathChunk, n - c0);
        if (a_dense) simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { abuf[i] = to_opmath(a[c0 + i]); });
        if (b_dense) simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { bbuf[i] = to_opmath(b[c0 + i]); });
        if (a_dense && b_dense) simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { rbuf[i] = f(abuf[i], bbuf[i]); });
        else if (a_dense) simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { rbuf[i] = f(abuf[i], bv); });
        else simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { rbuf[i] = f(av, bbuf[i]); });
        simd_for(0, len, [&](int64_t i) CHORUS_ELEMENT { o[c0 + i] = shared::Cast<Out>{}(rbuf[i]); });
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) =
            shared::Cast<Out>{}(f(to_opmath(*reinterpret_cast<const A*>(p[1] + i * s[1])),
                                  to_opmath(*reinterpret_cast<const B*>(p[2] + i * s[2]))));
      }
    }
  });
}


// ------------------------------------------------------------------ normalizations on 16-bit storage
// The row and channel kernels (layer_norm, softmax, cross_entropy, batch_norm) take float16/bfloat16
// x with per-row statistics, per-column weight and bias, and parameter gradients in P = opmath_t<T>
// (float): PyTorch's mixed-type norms, what autocast and a bfloat16 model give. T is the storage.

using shared::dispatch_float_storage;  // (kernels/shared/storage_dispatch.h)

// A row of storage T seen at P = opmath_t<T>: float32/float64 rows are used in place; a 16-bit row is
// widened (exactly) into `buf`, so the row math is the float32 kernel's.
template <typename T>
const shared::opmath_t<T>* widened_row(const T* row, int64_t n, std::vector<shared::opmath_t<T>>& buf) {
  if constexpr (!shared::is_reduced_float_v<T>) {
    return row;
  } else {
    buf.resize(static_cast<size_t>(n));
    float* b = buf.data();
    simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { b[i] = shared::to_opmath(row[i]); });
    return b;
  }
}
// Where the row math writes an output row: the row itself, or `buf` for a 16-bit row (then
// store_row rounds it into place once).
template <typename T>
shared::opmath_t<T>* row_out(T* row, int64_t n, std::vector<shared::opmath_t<T>>& buf) {
  if constexpr (!shared::is_reduced_float_v<T>) {
    return row;
  } else {
    buf.resize(static_cast<size_t>(n));
    return buf.data();
  }
}
template <typename T>
void store_row(T* row, const shared::opmath_t<T>* values, int64_t n) {
  if constexpr (shared::is_reduced_float_v<T>) {
    simd_for(0, n, [&](int64_t i) CHORUS_ELEMENT { row[i] = shared::Cast<T>{}(values[i]); });
  }
}

}  // namespace chorus::kernels::cpu
