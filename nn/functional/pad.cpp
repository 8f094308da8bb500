// F::pad. Constant padding concatenates blocks of the fill value (after narrowing away negative
// amounts); the other modes gather each output position's source index along one dim at a time.
// Gathering through index_select makes the backward index_add, which sums the gradients of every
// output position that copied the same input element (an edge under Replicate, a mirrored element
// under Reflect), which is what PyTorch's dedicated pad kernels compute.
#include "nn/functional/pad.h"

#include <algorithm>

#include "autograd/ops/common.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

const char* pad_mode_name(PadMode mode) {
  switch (mode) {
    case PadMode::Constant: return "constant";
    case PadMode::Reflect: return "reflect";
    case PadMode::Replicate: return "replicate";
    case PadMode::Circular: return "circular";
  }
  return "?";
}

namespace {

std::string pad_str(const std::vector<int64_t>& pad) {
  std::string s = "{";
  for (size_t i = 0; i < pad.size(); ++i) s += (i ? ", " : "") + std::to_string(pad[i]);
  return s + "}";
}

Tensor pad_constant_dim(const Tensor& x, int64_t dim, int64_t before, int64_t after, double value) {
  Tensor y = x;
  // Cropping first: a negative amount on one side combines with a positive one on the other.
  if (before < 0) y = narrow(y, dim, -before, y.size(dim) + before);
  if (after < 0) y = narrow(y, dim, 0, y.size(dim) + after);
  if (before <= 0 && after <= 0) return y;
  TensorList parts;
  auto block = [&](int64_t n) {
    Shape s = y.sizes();
    s[dim] = n;
    return full(s, value, TensorOptions{.dtype = y.dtype(), .device = y.device()});
  };
  if (before > 0) parts.push_back(block(before));
  parts.push_back(y);
  if (after > 0) parts.push_back(block(after));
  return cat(parts, dim);
}

// The input position each output position of one dim reads from.
int64_t source_index(PadMode mode, int64_t i, int64_t n) {
  switch (mode) {
    case PadMode::Reflect:
      if (i < 0) return -i;
      if (i >= n) return 2 * (n - 1) - i;
      return i;
    case PadMode::Replicate: return std::clamp<int64_t>(i, 0, n - 1);
    case PadMode::Circular: return ((i % n) + n) % n;
    case PadMode::Constant: break;
  }
  return i;
}

Tensor pad_gather_dim(const Tensor& x, int64_t dim, int64_t before, int64_t after, PadMode mode) {
  const int64_t n = x.size(dim), out = n + before + after;
  std::vector<int64_t> idx(static_cast<size_t>(out));
  for (int64_t j = 0; j < out; ++j) idx[static_cast<size_t>(j)] = source_index(mode, j - before, n);
  return index_select(x, dim, tensor(idx).to(x.device()));
}

}  // namespace

Tensor pad(const Tensor& input, const std::vector<int64_t>& pad, PadMode mode, double value) {
  ops::check_defined(input, "pad", "input");
  const char* mname = pad_mode_name(mode);
  if (pad.size() % 2 != 0) fail("pad: the padding list {} must have an even length (before, after pairs)", pad_str(pad));
  const int64_t k = static_cast<int64_t>(pad.size()) / 2;
  if (k > input.dim()) {
    fail("pad: padding {} pads {} dims, but the input of shape {} has only {}", pad_str(pad), k,
         shape_str(input.sizes()), input.dim());
  }
  if (mode != PadMode::Constant) {
    if (k < 1 || k > 3 || (input.dim() != k + 1 && input.dim() != k + 2)) {
      fail("pad: {} padding of {} trailing dims expects a {}-D or {}-D input (unbatched or batched), got shape {}; "
           "{} padding covers 1 to 3 dims",
           mname, k, k + 1, k + 2, shape_str(input.sizes()), mname);
    }
    if (value != 0.0) fail("pad: a fill value ({}) is only used in constant mode, not {}", value, mname);
  }
  Tensor y = input;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t dim = input.dim() - 1 - i;
    const int64_t before = pad[static_cast<size_t>(2 * i)], after = pad[static_cast<size_t>(2 * i + 1)];
    const int64_t n = input.size(dim);
    if (n + before + after < 0 || (mode != PadMode::Constant && n + before + after <= 0)) {
      fail("pad: padding ({}, {}) of dim {} (size {}) leaves a negative or empty size {}", before, after, dim, n,
           n + before + after);
    }
    const int64_t crop = std::max<int64_t>(0, -before) + std::max<int64_t>(0, -after);
    if (crop > n) {
      fail("pad: padding ({}, {}) of dim {} crops {} elements from a dim of size {} (input shape {})", before, after,
           dim, crop, n, shape_str(input.sizes()));
    }
    if (mode == PadMode::Reflect && (before >= n || after >= n)) {
      fail("pad: reflect padding ({}, {}) of dim {} must be smaller than the dim's size {} (input shape {})", before,
           after, dim, n, shape_str(input.sizes()));
    }
    if (mode == PadMode::Circular && (before > n || after > n)) {
      fail("pad: circular padding ({}, {}) of dim {} must be at most the dim's size {} (input shape {})", before,
           after, dim, n, shape_str(input.sizes()));
    }
    if (mode == PadMode::Replicate && n == 0 && before + after > 0) {
      fail("pad: replicate padding of dim {} needs a non-empty dim (input shape {})", dim, shape_str(input.sizes()));
    }
    if (before == 0 && after == 0) continue;
    y = mode == PadMode::Constant ? pad_constant_dim(y, dim, before, after, value)
                                  : pad_gather_dim(y, dim, before, after, mode);
  }
  return y;
}

}  // namespace chorus::nn::functional
