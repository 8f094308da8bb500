// In-place ops under autograd: check_inplace, record_inplace (CopySlices on views) and the
// re-derivation of a view's history from its base. The design is in inplace.h, [In-place ops on views].
#include "autograd/inplace.h"

#include <algorithm>

#include "autograd/grad_mode.h"
#include "kernels/dispatch.h"
#include "tensor/ops.h"

namespace chorus::autograd {
namespace {

// Where a tensor lies in its storage.
struct Geometry {
  Shape sizes;
  Strides strides;
  int64_t offset = 0;

  explicit Geometry(const Tensor& t) : sizes(t.sizes()), strides(t.strides()), offset(t.storage_offset()) {}

  // One past the last storage element it reaches (its offset when it is empty).
  int64_t end() const {
    int64_t last = offset;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == 0) return offset;
      last += (sizes[i] - 1) * strides[i];
    }
    return last + 1;
  }
};

// A base and one of its views laid over one fresh zero buffer, in the relative places they hold
// in their own storage: a gradient written into `view` lands on exactly the elements of `base` the
// view aliases, however the view was made (narrow, select, t(), a view of a view).
struct SharedZeros {
  Tensor base;
  Tensor view;
};

Tensor lay_over(const Tensor& buffer, const Geometry& g, int64_t first) {
  return Tensor(std::make_shared<TensorImpl>(buffer.storage(), g.offset - first, g.sizes, g.strides, buffer.dtype()));
}

SharedZeros shared_zeros(const Geometry& base, const Geometry& view, const TensorOptions& options) {
  const int64_t first = std::min(base.offset, view.offset);
  const int64_t end = std::max(base.end(), view.end());
  const Tensor buffer = zeros({end - first}, options);
  return {lay_over(buffer, base, first), lay_over(buffer, view, first)};
}

// Backward of a view regenerated from its base: the view's gradient, in place in a zero gradient
// of the base's shape.
BackwardFn view_of_base_backward(Geometry base, Geometry view) {
  return [base, view](const TensorList& g) -> TensorList {
    SharedZeros buffers = shared_zeros(base, view, g[0].options());
    kernels::copy(buffers.view, g[0]);
    return {buffers.base};
  };
}

// Backward of CopySlices: base_new = base_old with the view's region replaced by op(region, others).
// Outside the region the base's gradient passes through; inside, the op's backward maps the
// region's gradient to the gradient of the region's old values (written back in its place) and to
// the gradients of the op's other inputs.
BackwardFn copy_slices_backward(Geometry base, Geometry view, BackwardFn op_backward) {
  return [base, view, op_backward = std::move(op_backward)](const TensorList& g) -> TensorList {
    SharedZeros buffers = shared_zeros(base, view, g[0].options());
    kernels::copy(buffers.base, g[0]);
    Tensor region = empty(view.sizes, g[0].options());
    kernels::copy(region, buffers.view);  // a copy: the op's backward must not see the write-back below
    TensorList grads = op_backward({region});
    if (grads[0].defined()) {
      kernels::copy(buffers.view, grads[0]);
    } else {
      kernels::fill(buffers.view, 0);
    }
    grads[0] = buffers.base;
    return grads;
  };
}

// Two elements at one memory location (a stride 0 over more than one element, as expand makes).
bool has_internal_overlap(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.strides()[d] == 0 && t.sizes()[d] > 1) return true;
  }
  return false;
}

// An operand that is a view of the written memory may have re-derived its history while the op
// collected its edges (the version had already moved on), from the base's history before the op.
// Marking it out of date makes its next read derive it again, from the history that includes the op.
void mark_view_history_stale(const Tensor& t, const Tensor& written) {
  if (!t.defined() || t.storage() != written.storage()) return;
  AutogradMeta* meta = t.unsafe_impl()->autograd_meta();
  if (meta != nullptr && meta->is_view()) meta->view_version = t.version() - 1;
}

}  // namespace

void check_inplace(const Tensor& self, const char* op, bool will_record) {
  if (!GradMode::is_enabled()) return;
  if (self.requires_grad() && self.is_leaf()) {
    fail("{}: a leaf tensor that requires grad (shape {}) is being used in an in-place operation. "
         "Wrap the update in NoGradGuard (as optimizers do), or apply the op out of place.",
         op, shape_str(self.sizes()));
  }
  const AutogradMeta* meta = self.unsafe_impl()->autograd_meta();
  if (meta == nullptr || !meta->is_view()) return;
  const Tensor& base = meta->view_base;
  if (base.requires_grad() && base.is_leaf()) {
    fail("{}: a view of a leaf tensor that requires grad is being used in an in-place operation (a view "
         "of shape {} of a leaf of shape {}). Wrap the update in NoGradGuard (as optimizers do), or "
         "clone() the leaf and modify the clone.",
         op, shape_str(self.sizes()), shape_str(base.sizes()));
  }
  if (will_record && has_internal_overlap(self)) {
    fail("{}: more than one element of the written-to view (shape {}, strides {}) refers to a single "
         "memory location, so its gradient is ambiguous; clone() the view before modifying it.",
         op, shape_str(self.sizes()), shape_str(self.strides()));
  }
}

void check_no_internal_overlap(const Tensor& self, const char* op) {
  if (has_internal_overlap(self)) {
    fail("{}: more than one element of the written-to tensor (shape {}, strides {}) refers to a single memory "
         "location, so the result would depend on the order of the writes; clone() it before writing to it",
         op, shape_str(self.sizes()), shape_str(self.strides()));
  }
}

void record_inplace(const char* name, const Tensor& self, const TensorList& others, BackwardFn backward) {
  const AutogradMeta* meta = self.unsafe_impl()->autograd_meta();
  if (meta == nullptr || !meta->is_view()) {
    TensorList inputs{self};
    inputs.insert(inputs.end(), others.begin(), others.end());
    record(name, inputs, {self}, std::move(backward));
  } else {
    const Tensor base = meta->view_base;
    auto node = std::make_shared<FunctionNode>(
        "CopySlices", copy_slices_backward(Geometry(base), Geometry(self), std::move(backward)));
    node->next_edges().push_back(gradient_edge(base));
    for (const Tensor& other : others) node->next_edges().push_back(gradient_edge(other));
    AutogradMeta& base_meta = base.unsafe_impl()->ensure_autograd_meta();
    base_meta.grad_fn = node;
    base_meta.output_nr = node->add_output(base);
    base_meta.requires_grad = false;  // a non-leaf from now on, requiring grad through CopySlices
    refresh_view_history(self);
  }
  for (const Tensor& other : others) mark_view_history_stale(other, self);
}

void refresh_view_history(const Tensor& view) {
  AutogradMeta& meta = view.unsafe_impl()->ensure_autograd_meta();
  meta.view_version = view.version();  // first: the reads of the base below must not come back here
  const Tensor base = meta.view_base;
  if (!base.requires_grad()) return;  // nothing to derive: the view keeps what it has
  auto node = std::make_shared<FunctionNode>("AsStridedBackward",
                                             view_of_base_backward(Geometry(base), Geometry(view)));
  node->next_edges().push_back(gradient_edge(base));
  meta.grad_fn = node;
  meta.output_nr = node->add_output(view);
  meta.requires_grad = false;
}

}  // namespace chorus::autograd
