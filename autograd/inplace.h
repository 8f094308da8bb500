// In-place ops under autograd: the checks before writing (leaves, views of leaves) and the recording
// after, including PyTorch's CopySlices for an in-place op on a view, and the re-derivation of a
// view's history from its base once the shared memory has been written.
#pragma once

#include "autograd/node.h"

namespace chorus::autograd {

// [In-place ops on views]
// A view shares memory with its base, so writing through the view changes the base: the base's
// history has to change too, or gradients read through the base would miss the op. chorus does what
// PyTorch does:
//  - every view remembers its root base (AutogradMeta::view_base, never itself a view) and its own
//    geometry (sizes, strides, storage offset: where it lies in the shared storage);
//  - an in-place op on a view gives the base a CopySlices node: the base's gradient passes through
//    unchanged outside the view's region, and inside it goes through the op's backward, which
//    also gives the op's other inputs their gradients;
//  - the view's history becomes an as_strided view of the base's new history;
//  - every other view of the same memory notices the write through the storage version counter
//    and re-derives its history the same way the next time it is read (requires_grad(), grad_fn(),
//    or when an op records it), whether the write went through a view or through the base.

// Refuses, naming `op`, in grad mode: a leaf that requires grad; a view of such a leaf (both would
// lose the gradient of the values they had); and, when the op will record history (will_record), a
// view with several elements at one memory location (expand), whose gradient would be ambiguous.
void check_inplace(const Tensor& self, const char* op, bool will_record);

// Refuses, naming `op`, in any mode, a written tensor with several elements at one memory location
// (an expanded view): an op that reads what it writes (add_, clamp_, copy_ of differing values)
// would give an answer that depends on the order of the writes, a sequential CPU loop's one and a
// GPU's another (PyTorch's assert_no_internal_overlap). fill_ writes one value and stays allowed.
void check_no_internal_overlap(const Tensor& self, const char* op);

// Records an in-place op that has written `self`: `backward` maps the gradient of the new self to
// the gradients of {the old self, others...}. On a non-view this is record(name, {self, others...},
// {self}, backward); on a view it rebases the history onto the base (CopySlices).
void record_inplace(const char* name, const Tensor& self, const TensorList& others, BackwardFn backward);

// Makes a view's grad_fn an as_strided view of its base's current history (when the base requires
// grad) and marks it current. The tensor layer calls it through detail::set_view_history_refresh.
void refresh_view_history(const Tensor& view);

}  // namespace chorus::autograd
