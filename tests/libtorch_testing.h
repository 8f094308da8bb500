// What the tests that link libtorch 1.13 (Debian's libtorch-dev) share: chorus tensors as torch
// tensors, and the difference between a chorus result and libtorch's. Include this first, instead
// of <catch2/catch.hpp>, after only the torch headers a test needs beyond these (torch/nn/...,
// torch/optim/...): glog (through torch's headers) defines a CHECK that aborts, and Catch2's CHECK
// must replace it, so the order matters. [Narrow torch headers] Not <torch/torch.h>: it parses
// everything libtorch's C++ API has in 18 s (clang-14, -fsyntax-only), <torch/types.h> and
// <torch/utils.h> (tensors, their ops, set_num_threads, NoGradGuard) in 9 s (docs/build.md).
#pragma once

#include <torch/types.h>
#include <torch/utils.h>
#undef CHECK
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/tensor.h"

namespace chorus::testing {

// A float64 CPU copy of t as a torch tensor (detached; any dtype, device or strides).
inline torch::Tensor to_torch(const Tensor& t) {
  const Tensor c = t.detach().to(kFloat64).to(Device::cpu()).contiguous();
  std::vector<int64_t> sizes(c.sizes().begin(), c.sizes().end());
  return torch::from_blob(const_cast<double*>(c.data_ptr<double>()), sizes, torch::kFloat64).clone();
}

// The worst element-wise difference, each element's relative to its own size where that is above
// 1 and absolute below: max_i |ours_i - theirs_i| / max(1, |theirs_i|), in float64. So
// `max_diff(a, b) <= tol` is torch.allclose(a, b, rtol=tol, atol=tol) up to the factor of at most 2
// between max(1, |b|) and 1 + |b|; a small element is held to tol itself, not to tol times the
// tensor's largest (which would hide its errors). Infinity when the shapes differ or NaN is not in
// the same places (NaN where both have it counts as equal; equal infinities count as equal).
inline double max_diff(const Tensor& ours, const torch::Tensor& theirs) {
  const torch::Tensor a = to_torch(ours), b = theirs.detach().to(torch::kFloat64);
  if (a.sizes() != b.sizes()) return INFINITY;
  if (a.numel() == 0) return 0;
  if (!torch::equal(a.isnan(), b.isnan())) return INFINITY;
  const torch::Tensor same = (a == b) | (a.isnan() & b.isnan());
  const torch::Tensor diff = torch::where(same, torch::zeros_like(a), (a - b).abs());
  const torch::Tensor scale = torch::clamp_min(b.nan_to_num().abs(), 1.0);
  return (diff / scale).max().item<double>();
}

}  // namespace chorus::testing
