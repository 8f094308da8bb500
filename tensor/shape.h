// Shapes and strides: contiguous strides, NumPy broadcasting, dim wrapping, and formatting them
// for error messages. Every op uses these helpers so that the checks and messages agree everywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace chorus {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel_of(const Shape& shape);
Strides contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"

// Broadcasts two shapes as NumPy does; throws chorus::Error naming `op` and both shapes when they
// do not broadcast.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// True when `from` can be expanded to `to` (trailing-aligned, sizes equal or 1).
bool is_expandable_to(const Shape& from, const Shape& to);

// Wraps a possibly negative dim into [0, ndim); throws naming the op, the dim and the valid range.
// A 0-d tensor accepts dims -1 and 0, as in PyTorch.
int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim);
// Wraps a list of dims, rejecting repeats; an empty list means all dims when `empty_means_all`.
// For a 0-d tensor the (valid) dims wrap to an empty list: there is no dim to reduce over.
std::vector<int64_t> wrap_dims(const char* op, const std::vector<int64_t>& dims, int64_t ndim,
                               bool empty_means_all = true);

// Strides of a view with `new_shape` over memory with `old_shape`/`old_strides`, or an empty
// optional-like result (ok=false) when no such strides exist (view on incompatible strides).
bool compute_view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape,
                          Strides& new_strides);
// Resolves one -1 in a requested shape against numel; throws naming the op when impossible.
Shape infer_shape(const char* op, const Shape& requested, int64_t numel);

}  // namespace chorus
