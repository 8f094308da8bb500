#include "tensor/shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <iterator>

#include "tensor/error.h"

namespace chorus {

int64_t numel_of(const Shape& shape) {
  // Shapes can come from outside bytes (files, the network): a product beyond int64 is an error,
  // not a wrapped count. A zero dim makes the whole product 0 whatever the others are.
  if (std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n)) fail("shape {} has more elements than an int64 can count", shape_str(shape));
  }
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    if (i > 0 && __builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride)) {
      fail("shape {} has more elements than an int64 can count", shape_str(shape));
    }
  }
  return strides;
}

const char* memory_format_name(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::Contiguous: return "contiguous";
    case MemoryFormat::ChannelsLast: return "channels_last";
    case MemoryFormat::Preserve: return "preserve";
  }
  return "unknown";
}

Strides channels_last_strides(const Shape& shape, const char* op) {
  if (shape.size() != 4) {
    fail("{}: the channels_last memory format needs a 4-D [N, C, H, W] tensor, got shape {}", op, shape_str(shape));
  }
  // Memory order N, H, W, C: the same product rule as contiguous_strides over the permuted sizes.
  const Strides nhwc = contiguous_strides({shape[0], shape[2], shape[3], shape[1]});
  return {nhwc[0], nhwc[3], nhwc[1], nhwc[2]};
}

namespace {
// Whether `strides` are dense in the dim order `order` (outermost first); size-1 dims may have any stride.
bool dense_in_order(const Shape& shape, const Strides& strides, std::initializer_list<size_t> order) {
  int64_t expected = 1;
  for (auto it = std::rbegin(order); it != std::rend(order); ++it) {
    const size_t d = *it;
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}
}  // namespace

bool is_channels_last_strides(const Shape& shape, const Strides& strides) {
  if (shape.size() != 4 || strides.size() != 4) return false;
  if (numel_of(shape) == 0) return true;
  return dense_in_order(shape, strides, {0, 2, 3, 1});
}

bool is_contiguous_strides(const Shape& shape, const Strides& strides) {
  if (numel_of(shape) == 0) return true;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Strides strides_for(const Shape& shape, MemoryFormat format) {
  switch (format) {
    case MemoryFormat::Contiguous: return contiguous_strides(shape);
    case MemoryFormat::ChannelsLast: return channels_last_strides(shape);
    case MemoryFormat::Preserve: break;
  }
  fail("strides_for: MemoryFormat::Preserve names no layout of its own (it keeps an input's); pass Contiguous or "
       "ChannelsLast");
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      fail("{}: shapes {} and {} do not broadcast (dim {} is {} vs {}; sizes must be equal or 1)", op,
           shape_str(a), shape_str(b), i, da, db);
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool is_expandable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  size_t off = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] != to[i + off] && from[i] != 1) return false;
  }
  return true;
}

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  int64_t range = std::max<int64_t>(ndim, 1);
  if (dim < -range || dim >= range) {
    fail("{}: dim {} is out of range for a tensor with {} dims (expected a dim in [{}, {}])", op, dim,
         ndim, -range, range - 1);
  }
  return dim < 0 ? dim + range : dim;
}

std::vector<int64_t> wrap_dims(const char* op, const std::vector<int64_t>& dims, int64_t ndim,
                               bool empty_means_all) {
  std::vector<int64_t> out;
  if (dims.empty() && empty_means_all) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims) {
    int64_t w = wrap_dim(op, d, ndim);
    if (std::find(out.begin(), out.end(), w) != out.end()) {
      fail("{}: dim {} appears more than once in the dims list [{}]", op, w, fmt::join(dims, ", "));
    }
    out.push_back(w);
  }
  // A 0-dim tensor takes dim 0 (or -1) as PyTorch does, but has no dim to reduce: reducing over it
  // is reducing over nothing (the kernels must not see a dim the tensor does not have).
  if (ndim == 0) return {};
  std::sort(out.begin(), out.end());
  return out;
}

// Walks the old dims in chunks that are contiguous among themselves and matches them against the
// new dims with the same element count (the algorithm PyTorch's view uses).
bool compute_view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape,
                          Strides& new_strides) {
  new_strides.assign(new_shape.size(), 0);
  if (old_shape.empty()) {
    std::fill(new_strides.begin(), new_strides.end(), 1);
    return true;
  }
  int64_t numel = numel_of(old_shape);
  if (numel == 0) {
    new_strides = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    bool chunk_end = tensor_d == 0 ||
                     (old_shape[tensor_d - 1] != 1 &&
                      old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (chunk_end) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Shape infer_shape(const char* op, const Shape& requested, int64_t numel) {
  Shape out = requested;
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer_at >= 0) fail("{}: only one dimension can be -1, got shape {}", op, shape_str(requested));
      infer_at = static_cast<int>(i);
    } else if (out[i] < 0) {
      fail("{}: invalid size {} at dim {} in shape {}", op, out[i], i, shape_str(requested));
    } else {
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || numel % known != 0) {
      fail("{}: shape {} is invalid for input of size {}", op, shape_str(requested), numel);
    }
    out[infer_at] = numel / known;
  } else if (known != numel) {
    fail("{}: shape {} is invalid for input of size {}", op, shape_str(requested), numel);
  }
  return out;
}

}  // namespace chorus
