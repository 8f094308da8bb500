// Index-driven kernels: index_select, gather, scatter / scatter_add, index_add. Indices are int64
// and already bounds-checked by the op layer.
#include <cstring>
#include <type_traits>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/loops.h"

namespace chorus::kernels::cpu {
namespace {

Tensor view_of(const Tensor& t, int64_t offset_elems, const Shape& sizes, const Strides& strides) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset() + offset_elems, sizes,
                                             strides, t.dtype()));
}

// t.select(dim, i) as a raw view (no autograd).
Tensor select_view(const Tensor& t, int64_t dim, int64_t i) {
  Shape s = t.sizes();
  Strides st = t.strides();
  s.erase(s.begin() + dim);
  st.erase(st.begin() + dim);
  return view_of(t, i * t.stride(dim), s, st);
}

// [Row-block index kernels] A contiguous tensor, seen around dim, is [outer, size(dim), inner]:
// slice j of block o is the `inner` consecutive elements from (o * size(dim) + j) * inner. With
// contiguous operands index_select and index_add move whole slices at once, instead of building
// a strided view and running the generic loop for every index (an embedding's backward added its
// 1024 rows of 256 one generic kernel call each: 2-3% of a BERT-mini step).
struct RowBlocks {
  int64_t outer = 1, inner = 1;
};

RowBlocks row_blocks(const Tensor& t, int64_t dim) {
  RowBlocks r;
  for (int64_t d = 0; d < dim; ++d) r.outer *= t.size(d);
  for (int64_t d = dim + 1; d < t.dim(); ++d) r.inner *= t.size(d);
  return r;
}

const int64_t* index_data(const Tensor& index, Tensor& holder) {
  holder = index.is_contiguous() ? index : [&] {
    Tensor d = make_tensor(index.sizes(), kInt64, kCPU);
    copy(d, index);
    return d;
  }();
  return holder.data_ptr<int64_t>();
}

}  // namespace

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  Tensor holder;
  const int64_t* idx = index_data(index, holder);
  const int64_t n = index.numel();
  if (n > 0 && out.is_contiguous() && in.is_contiguous()) {  // [Row-block index kernels]
    const RowBlocks r = row_blocks(in, dim);
    const int64_t in_rows = in.size(dim);
    const size_t bytes = static_cast<size_t>(r.inner) * in.element_size();
    const char* src = static_cast<const char*>(in.raw_data_ptr());
    char* dst = static_cast<char*>(out.raw_data_ptr());
    parallel_for(0, r.outer * n, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(r.inner, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t k = lo; k < hi; ++k) {
                     const int64_t o = k / n, i = k % n;
                     std::memcpy(dst + k * bytes, src + (o * in_rows + idx[i]) * bytes, bytes);
                   }
                 });
    return;
  }
  const int64_t slice = n == 0 ? 0 : out.numel() / n;
  // Each selected slice is one strided copy; copy() is parallel inside for big slices, and we
  // parallelize across slices when they are small.
  if (slice < kGrainSize) {
    parallel_for(0, n, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(slice, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) copy(select_view(out, dim, i), select_view(in, dim, idx[i]));
    });
  } else {
    for (int64_t i = 0; i < n; ++i) copy(select_view(out, dim, i), select_view(in, dim, idx[i]));
  }
}

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  // Iterate over index's shape; the source offset is in's strides with the dim coordinate replaced.
  const int64_t nd = index.dim();
  Shape shape = index.sizes();
  Tensor holder;
  const int64_t* idx = index_data(index, holder);
  CHORUS_DISPATCH_ALL(in.dtype(), "gather", [&]<typename T>() {
    const T* src = static_cast<const T*>(in.raw_data_ptr());
    T* dst = static_cast<T*>(out.raw_data_ptr());
    parallel_for(0, index.numel(), kGrainSize, [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> coord(nd);
      for (int64_t linear = lo; linear < hi; ++linear) {
        int64_t rem = linear, src_off = 0, dst_off = 0;
        for (int64_t d = nd - 1; d >= 0; --d) {
          coord[d] = rem % shape[d];
          rem /= shape[d];
        }
        for (int64_t d = 0; d < nd; ++d) {
          src_off += (d == dim ? idx[linear] : coord[d]) * in.strides()[d];
          dst_off += coord[d] * out.strides()[d];
        }
        dst[dst_off] = src[src_off];
      }
    });
  });
}

void scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  // Sequential: two indices may name the same destination, and scatter_add must add both.
  const int64_t nd = index.dim();
  Shape shape = index.sizes();
  Tensor holder;
  const int64_t* idx = index_data(index, holder);
  CHORUS_DISPATCH_ALL(self.dtype(), "scatter", [&]<typename T>() {
    T* dst = static_cast<T*>(self.raw_data_ptr());
    const T* from = static_cast<const T*>(src.raw_data_ptr());
    std::vector<int64_t> coord(nd);
    for (int64_t linear = 0; linear < index.numel(); ++linear) {
      int64_t rem = linear, dst_off = 0, src_off = 0;
      for (int64_t d = nd - 1; d >= 0; --d) {
        coord[d] = rem % shape[d];
        rem /= shape[d];
      }
      for (int64_t d = 0; d < nd; ++d) {
        dst_off += (d == dim ? idx[linear] : coord[d]) * self.strides()[d];
        src_off += coord[d] * src.strides()[d];
      }
      if (accumulate) {
        if constexpr (std::is_same_v<T, bool>) dst[dst_off] = dst[dst_off] || from[src_off];
        else if constexpr (is_reduced_float_v<T>)
          dst[dst_off] = T(static_cast<float>(dst[dst_off]) + static_cast<float>(from[src_off]));
        else dst[dst_off] = static_cast<T>(dst[dst_off] + from[src_off]);
      } else {
        dst[dst_off] = from[src_off];
      }
    }
  });
}

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor holder;
  const int64_t* idx = index_data(index, holder);
  const int64_t n = index.numel();
  if (n > 0 && out.is_contiguous() && src.is_contiguous()) {  // [Row-block index kernels]
    // Threads split the inner columns, and each adds the indices in order, so a row named twice
    // sums in the same order as the one-slice-at-a-time loop below (bit-identical results).
    const RowBlocks r = row_blocks(out, dim);
    const int64_t out_rows = out.size(dim);
    CHORUS_DISPATCH_ALL(out.dtype(), "index_add", [&]<typename T>() {
      using C = std::conditional_t<is_reduced_float_v<T>, float, T>;  // binary Add's arithmetic
      T* dst = static_cast<T*>(out.raw_data_ptr());
      const T* from = static_cast<const T*>(src.raw_data_ptr());
      parallel_for(0, r.inner, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(r.outer * n, 1)),
                   [&](int64_t lo, int64_t hi) {
                     for (int64_t o = 0; o < r.outer; ++o) {
                       for (int64_t i = 0; i < n; ++i) {
                         T* d = dst + (o * out_rows + idx[i]) * r.inner;
                         const T* s = from + (o * n + i) * r.inner;
                         for (int64_t c = lo; c < hi; ++c)
                           d[c] = static_cast<T>(static_cast<C>(d[c]) + static_cast<C>(s[c]));
                       }
                     }
                   });
    });
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    Tensor o = select_view(out, dim, idx[i]);
    binary(BinaryOp::Add, o, o, select_view(src, dim, i));
  }
}

}  // namespace chorus::kernels::cpu
