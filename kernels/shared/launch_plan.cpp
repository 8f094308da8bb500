// Elementwise and reduction launch planning (see launch_plan.h). The collapsing rule is the one of
// kernels/cpu/loops.h: adjacent dims merge when every operand steps through them as one.
#include "kernels/shared/launch_plan.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "tensor/error.h"

namespace chorus::kernels::shared {
namespace {

constexpr size_t kMaxOperands = 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Largest byte offset operand k reaches inside a box of `sizes`.
int64_t max_offset(const std::vector<int64_t>& sizes, const std::vector<int64_t>& stride_bytes) {
  int64_t off = 0;
  for (size_t d = 0; d < sizes.size(); ++d) off += (sizes[d] - 1) * stride_bytes[d];
  return off;
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t s : v) n *= s;
  return n;
}

// Elements per load such that every operand of a contiguous box reads vector_elements *
// element_size bytes from an address aligned to that many bytes.
int vector_elements(const ElementwisePlan& plan, const std::vector<OperandLayout>& operands,
                    const std::vector<int64_t>& base_offset_bytes, int max_vector_bytes) {
  if (!plan.contiguous) return 1;
  int64_t widest = 1;
  for (const OperandLayout& op : operands) widest = std::max(widest, op.element_size_bytes);
  int64_t vec = std::max<int64_t>(1, max_vector_bytes / widest);
  auto aligned = [&](int64_t v) {
    for (size_t k = 0; k < operands.size(); ++k) {
      const uint64_t bytes = static_cast<uint64_t>(v * operands[k].element_size_bytes);
      if ((operands[k].address + static_cast<uint64_t>(base_offset_bytes[k])) % bytes != 0) return false;
    }
    return true;
  };
  while (vec > 1 && !aligned(vec)) vec /= 2;
  return static_cast<int>(vec);
}

// Cuts the box (start, sizes) in two until each piece fits 32-bit index math.
void split_box(const ElementwisePlan& plan, const std::vector<int64_t>& start, const std::vector<int64_t>& sizes,
               int64_t max_index, std::vector<SubLaunch>& out) {
  const size_t nd = sizes.size();
  bool fits = product(sizes) <= max_index;
  for (size_t k = 0; k < plan.stride_bytes.size() && fits; ++k) {
    fits = max_offset(sizes, plan.stride_bytes[k]) <= max_index;
  }
  if (fits) {
    SubLaunch s;
    s.numel = product(sizes);
    s.start = start;
    s.sizes = sizes;
    out.push_back(std::move(s));
    return;
  }
  // Split the dim that spans the most bytes in any operand (the most elements when all of them are
  // broadcast), as PyTorch's TensorIterator does; the outermost wins a tie.
  size_t dim = 0;
  int64_t best = -1;
  for (size_t d = 0; d < nd; ++d) {
    if (sizes[d] < 2) continue;
    int64_t span = 0;
    for (const auto& st : plan.stride_bytes) span = std::max(span, (sizes[d] - 1) * st[d]);
    if (span == 0) span = sizes[d] - 1;  // broadcast in every operand: only the count matters
    if (span > best) {
      best = span;
      dim = d;
    }
  }
  // Halves, the cut rounded down to a multiple of 4096 elements when that large, so the pieces of
  // a contiguous tensor keep the 16-byte alignment of its start.
  int64_t cut = sizes[dim] / 2;
  if (cut >= 8192) cut -= cut % 4096;
  std::vector<int64_t> lo_sizes = sizes, hi_sizes = sizes, hi_start = start;
  lo_sizes[dim] = cut;
  hi_sizes[dim] = sizes[dim] - cut;
  hi_start[dim] += cut;
  split_box(plan, start, lo_sizes, max_index, out);
  split_box(plan, hi_start, hi_sizes, max_index, out);
}

}  // namespace

ElementwisePlan plan_elementwise(const std::vector<int64_t>& out_shape, const std::vector<OperandLayout>& operands,
                                 const ElementwisePlanOptions& options) {
  const size_t nd = out_shape.size();
  const size_t n_ops = operands.size();
  CHORUS_CHECK(n_ops >= 1 && n_ops <= kMaxOperands, "plan_elementwise: {} operands, expected 1 to {}", n_ops,
               kMaxOperands);
  CHORUS_CHECK(options.max_index >= 1 && options.max_vector_bytes >= 1,
               "plan_elementwise: max_index {} and max_vector_bytes {} must be positive", options.max_index,
               options.max_vector_bytes);
  // Broadcast byte strides, trailing-aligned.
  std::vector<std::vector<int64_t>> strides(n_ops, std::vector<int64_t>(nd, 0));
  for (size_t k = 0; k < n_ops; ++k) {
    const OperandLayout& op = operands[k];
    CHORUS_CHECK(op.sizes.size() == op.strides.size() && op.sizes.size() <= nd && op.element_size_bytes > 0,
                 "plan_elementwise: operand {} has sizes {} and strides {} (element size {}) for an output of "
                 "shape {}",
                 k, op.sizes, op.strides, op.element_size_bytes, out_shape);
    const size_t off = nd - op.sizes.size();
    for (size_t d = 0; d < op.sizes.size(); ++d) {
      CHORUS_CHECK(op.sizes[d] == out_shape[d + off] || op.sizes[d] == 1,
                   "plan_elementwise: operand {} of shape {} does not broadcast to {}", k, op.sizes, out_shape);
      CHORUS_CHECK(op.strides[d] >= 0, "plan_elementwise: operand {} has a negative stride ({})", k, op.strides);
      strides[k][d + off] = op.sizes[d] == 1 ? 0 : op.strides[d] * op.element_size_bytes;
    }
  }
  ElementwisePlan plan;
  plan.numel = product(out_shape);
  plan.stride_bytes.assign(n_ops, {});
  // Walk the dims in the output's memory order (outermost first, a stable sort: a row-major output
  // keeps the logical order), so a channels-last output runs along C innermost in dense runs.
  std::vector<size_t> order(nd);
  for (size_t d = 0; d < nd; ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return strides[0][x] > strides[0][y]; });
  // Merge adjacent dims every operand steps through as one; drop size-1 dims.
  for (size_t d : order) {
    if (out_shape[d] == 1) continue;
    bool merge = !plan.shape.empty();
    for (size_t k = 0; k < n_ops && merge; ++k) {
      merge = plan.stride_bytes[k].back() == strides[k][d] * out_shape[d];
    }
    if (merge) {
      plan.shape.back() *= out_shape[d];
      for (size_t k = 0; k < n_ops; ++k) plan.stride_bytes[k].back() = strides[k][d];
    } else {
      plan.shape.push_back(out_shape[d]);
      for (size_t k = 0; k < n_ops; ++k) plan.stride_bytes[k].push_back(strides[k][d]);
    }
  }
  if (plan.shape.empty()) {  // a single element (or a 0-d tensor)
    plan.shape.push_back(1);
    for (size_t k = 0; k < n_ops; ++k) plan.stride_bytes[k].push_back(0);
  }
  CHORUS_CHECK(plan.shape.size() <= static_cast<size_t>(kMaxLaunchDims),
               "plan_elementwise: {} dims remain after collapsing shape {}; a launch takes at most {}",
               plan.shape.size(), out_shape, kMaxLaunchDims);
  plan.contiguous = plan.shape.size() == 1;
  for (size_t k = 0; k < n_ops && plan.contiguous; ++k) {
    plan.contiguous = plan.numel == 1 || plan.stride_bytes[k][0] == operands[k].element_size_bytes;
  }
  if (plan.numel == 0) return plan;
  split_box(plan, std::vector<int64_t>(plan.shape.size(), 0), plan.shape, options.max_index, plan.launches);
  for (SubLaunch& s : plan.launches) {
    s.base_offset_bytes.assign(n_ops, 0);
    for (size_t k = 0; k < n_ops; ++k) {
      for (size_t d = 0; d < s.start.size(); ++d) s.base_offset_bytes[k] += s.start[d] * plan.stride_bytes[k][d];
    }
    s.vector_elements = vector_elements(plan, operands, s.base_offset_bytes, options.max_vector_bytes);
  }
  return plan;
}

GridConfig elementwise_grid(int64_t numel, int threads_per_block, int sm_count, int elements_per_thread,
                            int blocks_per_sm) {
  CHORUS_CHECK(threads_per_block > 0 && sm_count > 0 && elements_per_thread > 0 && blocks_per_sm > 0,
               "elementwise_grid: threads_per_block {}, sm_count {}, elements_per_thread {} and blocks_per_sm {} "
               "must be positive",
               threads_per_block, sm_count, elements_per_thread, blocks_per_sm);
  GridConfig g;
  g.threads_per_block = threads_per_block;
  g.elements_per_thread = elements_per_thread;
  if (numel <= 0) return g;
  const int64_t tiles = ceil_div(numel, g.tile_elements());
  g.blocks = std::min<int64_t>(tiles, static_cast<int64_t>(sm_count) * blocks_per_sm);
  return g;
}

template <int N>
IndexCalculator<N> index_calculator(const ElementwisePlan& plan, const SubLaunch& launch) {
  CHORUS_CHECK(static_cast<size_t>(N) == plan.stride_bytes.size(),
               "index_calculator: built for {} operands, the plan has {}", N, plan.stride_bytes.size());
  IndexCalculator<N> calc;
  const int nd = static_cast<int>(launch.sizes.size());
  calc.ndim = nd;
  for (int d = 0; d < nd; ++d) {  // innermost first
    const int src = nd - 1 - d;
    calc.sizes[d] = static_cast<uint32_t>(launch.sizes[src]);
    // A dim of size 1 is never stepped: its stride may exceed 32 bits, and does not matter.
    for (int k = 0; k < N; ++k) {
      calc.strides[d][k] = launch.sizes[src] == 1 ? 0u : static_cast<uint32_t>(plan.stride_bytes[k][src]);
    }
  }
  return calc;
}

template IndexCalculator<1> index_calculator<1>(const ElementwisePlan&, const SubLaunch&);
template IndexCalculator<2> index_calculator<2>(const ElementwisePlan&, const SubLaunch&);
template IndexCalculator<3> index_calculator<3>(const ElementwisePlan&, const SubLaunch&);
template IndexCalculator<4> index_calculator<4>(const ElementwisePlan&, const SubLaunch&);
template IndexCalculator<5> index_calculator<5>(const ElementwisePlan&, const SubLaunch&);
template IndexCalculator<6> index_calculator<6>(const ElementwisePlan&, const SubLaunch&);
template IndexCalculator<7> index_calculator<7>(const ElementwisePlan&, const SubLaunch&);
template IndexCalculator<8> index_calculator<8>(const ElementwisePlan&, const SubLaunch&);

// ------------------------------------------------------------------ reductions
namespace {

struct Dim {
  int64_t size, stride, index;  // index: the dim's number in the input
};

// Collapses dims (outermost first) into one when each steps over whole runs of the next; returns
// false when they cannot. An empty group is size 1, stride 0.
bool collapse(const std::vector<Dim>& dims, int64_t& size, int64_t& stride) {
  size = 1;
  stride = 0;
  if (dims.empty()) return true;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    if (dims[i].stride != dims[i + 1].stride * dims[i + 1].size) return false;
  }
  size = 1;
  for (const Dim& d : dims) size *= d.size;
  stride = dims.back().stride;
  return true;
}

}  // namespace

ReductionPlan plan_reduction(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                             const std::vector<int64_t>& reduced_dims) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  CHORUS_CHECK(strides.size() == sizes.size(), "plan_reduction: {} sizes but {} strides", sizes.size(),
               strides.size());
  std::vector<bool> is_reduced(sizes.size(), false);
  for (size_t i = 0; i < reduced_dims.size(); ++i) {
    const int64_t d = reduced_dims[i];
    CHORUS_CHECK(d >= 0 && d < nd && (i == 0 || reduced_dims[i - 1] < d),
                 "plan_reduction: reduced dims {} must be sorted, unique and in [0, {})", reduced_dims, nd);
    is_reduced[d] = true;
  }
  ReductionPlan plan;
  int64_t kept_count = 1, reduced_count = 1;
  for (int64_t d = 0; d < nd; ++d) (is_reduced[d] ? reduced_count : kept_count) *= sizes[d];
  // Kept dims in order, then reduced dims: the layout of the copy, should one be needed.
  for (int64_t d = 0; d < nd; ++d)
    if (!is_reduced[d]) plan.permutation.push_back(d);
  for (int64_t d = 0; d < nd; ++d)
    if (is_reduced[d]) plan.permutation.push_back(d);
  const auto rows_of_copy = [&] {
    plan.outer = kept_count;
    plan.reduced = reduced_count;
    plan.inner = 1;
    plan.outer_stride = reduced_count;
    plan.reduced_stride = 1;
    plan.inner_stride = 0;
  };
  if (kept_count == 0 || reduced_count == 0) {  // nothing is read: no copy either
    rows_of_copy();
    return plan;
  }
  // Size-1 dims play no part; the rest, split into kept-before, reduced, kept-after when the
  // reduced dims are one run, else into kept and reduced.
  std::vector<Dim> before, reduced, after, kept;
  for (int64_t d = 0; d < nd; ++d) {
    CHORUS_CHECK(strides[d] >= 0, "plan_reduction: negative strides {} are not supported", strides);
    if (sizes[d] == 1) continue;
    const Dim dim{sizes[d], strides[d], d};
    if (is_reduced[d]) {
      reduced.push_back(dim);
    } else {
      kept.push_back(dim);
      (reduced.empty() ? before : after).push_back(dim);
    }
  }
  bool one_run = true;
  for (size_t i = 0; i + 1 < reduced.size(); ++i) {
    for (const Dim& k : kept) one_run = one_run && !(k.index > reduced[i].index && k.index < reduced[i + 1].index);
  }
  int64_t r_size, r_stride;
  if (!collapse(reduced, r_size, r_stride)) {
    plan.needs_copy = true;
    rows_of_copy();
    return plan;
  }
  int64_t o_size, o_stride, i_size, i_stride;
  if (one_run && collapse(before, o_size, o_stride) && collapse(after, i_size, i_stride)) {
    // The natural order: out[o * inner + i] with o over the kept dims before the reduced run.
  } else if (collapse(kept, o_size, o_stride)) {  // rows: all kept dims as one outer dim
    i_size = 1;
    i_stride = 0;
  } else {
    plan.needs_copy = true;
    rows_of_copy();
    return plan;
  }
  plan.outer = o_size;
  plan.reduced = r_size;
  plan.inner = i_size;
  plan.outer_stride = o_stride;
  plan.reduced_stride = r_stride;
  plan.inner_stride = i_stride;
  return plan;
}

}  // namespace chorus::kernels::shared
