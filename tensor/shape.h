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

// How a tensor's elements are laid out in memory, as PyTorch's at::MemoryFormat. `Contiguous` is
// row-major (NCHW for images); `ChannelsLast` keeps the logical [N, C, H, W] sizes with NHWC memory
// (strides [H*W*C, 1, W*C, C]), the layout cuDNN's and oneDNN's fastest convolutions use;
// `Preserve` (for clone/to/_like) keeps a channels-last input channels-last and makes everything else
// contiguous.
enum class MemoryFormat { Contiguous, ChannelsLast, Preserve };
const char* memory_format_name(MemoryFormat format);  // "contiguous", "channels_last", "preserve"

// The strides of a dense channels-last tensor of 4-D `shape`; throws naming `op` for another rank.
Strides channels_last_strides(const Shape& shape, const char* op = "channels_last");
// Whether 4-D `strides` are channels-last dense (dims of size 1 may have any stride), as PyTorch's
// is_contiguous(memory_format=channels_last). False for any other rank.
bool is_channels_last_strides(const Shape& shape, const Strides& strides);
// Whether `strides` are row-major dense (dims of size 1 may have any stride).
bool is_contiguous_strides(const Shape& shape, const Strides& strides);
// The strides of a fresh tensor of `shape` in `format` (Preserve is not a layout: it throws).
Strides strides_for(const Shape& shape, MemoryFormat format);
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
