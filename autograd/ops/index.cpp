// Joining and index-driven ops: cat, stack, split, chunk, index_select, gather, scatter,
// scatter_add, masked_fill, t[indices], one_hot. Every index is bounds-checked here, with the bad
// index and the valid range in the message, before a kernel touches memory.
#include "autograd/ops/common.h"

#include <fmt/format.h>

namespace chorus {
namespace {

using namespace ops;

// Contiguous int64 copy of an index tensor; rejects other dtypes naming the op.
Tensor index_as_int64(const Tensor& index, const char* name) {
  check_defined(index, name, "index");
  if (index.dtype() != kInt64 && index.dtype() != kInt32) {
    fail("{}: expected an int64 (or int32) index tensor, got {}", name, dtype_name(index.dtype()));
  }
  return contiguous(cast(alias_without_history(index), kInt64));
}

// Index checks read device indices back to the host (a synchronization; PyTorch checks them on the
// device instead, with an asynchronous device-side assert).
void check_index_range(const Tensor& index, int64_t size, const char* name, int64_t dim) {
  const Tensor idx = index.cpu();
  const int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    if (p[i] < 0 || p[i] >= size) {
      fail("{}: index {} is out of bounds for dim {} with size {} (expected indices in [0, {}))", name, p[i], dim,
           size, size);
    }
  }
}

// index with negative values wrapped (index_select and t[idx] accept -1 like PyTorch).
Tensor wrap_negative(const Tensor& idx, int64_t size, const char* name, int64_t dim) {
  Tensor out = idx.cpu().clone();
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (p[i] < -size || p[i] >= size) {
      fail("{}: index {} is out of bounds for dim {} with size {} (expected indices in [{}, {}))", name, p[i], dim,
           size, -size, size);
    }
    if (p[i] < 0) p[i] += size;
  }
  return out.to(idx.device());
}

void check_gather_shapes(const char* name, const Tensor& self, int64_t dim, const Tensor& index, const Tensor* src) {
  if (index.dim() != self.dim()) {
    fail("{}: index tensor must have the same number of dimensions as the input: index {} vs input {}", name,
         shape_str(index.sizes()), shape_str(self.sizes()));
  }
  for (int64_t d = 0; d < index.dim(); ++d) {
    if (d != dim && index.size(d) > self.size(d)) {
      fail("{}: size of index {} does not fit the input {} at dim {} (index sizes must be <= input sizes except "
           "at dim {})", name, shape_str(index.sizes()), shape_str(self.sizes()), d, dim);
    }
    if (src != nullptr && index.size(d) > src->size(d)) {
      fail("{}: size of index {} exceeds the source {} at dim {}", name, shape_str(index.sizes()),
           shape_str(src->sizes()), d);
    }
  }
}

// [One node for a split]
// The pieces of `t` along `d`, views with one history between them, as PyTorch's SplitBackward.
// Were each piece a narrow() of its own, each would have its own SliceBackward, which makes a
// zero tensor of t's whole shape to put its gradient in, and the engine would then add those
// whole-size tensors: k pieces, k whole-size fills and adds. An LSTM splits its input projection
// into one piece per time step, so its backward grew with the square of the sequence length. Here
// the one node cats the pieces' gradients (the engine gives a piece nothing used zeros of its own
// shape). An in-place op on a piece rebases it onto t's history as on any view.
TensorList split_pieces(const Tensor& t, int64_t d, const std::vector<int64_t>& sizes) {
  TensorList out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    Shape shape = t.sizes();
    shape[d] = s;
    out.push_back(make_view(t, shape, t.strides(), t.storage_offset() + start * t.stride(d)));
    start += s;
  }
  if (autograd::any_requires_grad({&t})) {
    autograd::record("SplitBackward", {t}, out, [d](const TensorList& g) -> TensorList { return {cat(g, d)}; });
  }
  return out;
}

}  // namespace

Tensor cat(const TensorList& tensors, int64_t dim) {
  if (tensors.empty()) fail("cat: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) check_defined(tensors[i], "cat", "tensors");
  const Tensor& first = tensors[0];
  if (first.dim() == 0) fail("cat: zero-dimensional tensor (at position 0) cannot be concatenated");
  const int64_t d = wrap_dim("cat", dim, first.dim());
  DType dt = first.dtype();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_same_device(first, t, "cat");
    if (t.dim() != first.dim()) {
      fail("cat: tensors must have the same number of dimensions: got {} (tensor 0, shape {}) and {} (tensor {}, shape {})",
           first.dim(), shape_str(first.sizes()), t.dim(), i, shape_str(t.sizes()));
    }
    for (int64_t k = 0; k < t.dim(); ++k) {
      if (k != d && t.size(k) != first.size(k)) {
        fail("cat: sizes of tensors must match except in dimension {}: expected size {} but got size {} for tensor {} "
             "(shapes {} and {})", d, first.size(k), t.size(k), i, shape_str(first.sizes()), shape_str(t.sizes()));
      }
    }
    dt = promote_types(dt, t.dtype());
    total += t.size(d);
  }
  Shape shape = first.sizes();
  shape[d] = total;
  Tensor out = new_output(shape, dt, first.device());
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    Tensor target = alias_without_history(out);
    kernels::copy(narrow(target, d, offset, t.size(d)), t);
    sizes.push_back(t.size(d));
    offset += t.size(d);
  }
  if (autograd::any_requires_grad(tensors) && is_floating(dt)) {
    autograd::record("CatBackward", tensors, {out}, [sizes, d](const TensorList& g) -> TensorList {
      TensorList grads;
      int64_t off = 0;
      for (int64_t s : sizes) {
        grads.push_back(narrow(g[0], d, off, s));
        off += s;
      }
      return grads;
    });
  }
  return out;
}

Tensor stack(const TensorList& tensors, int64_t dim) {
  if (tensors.empty()) fail("stack: expected a non-empty list of tensors");
  check_defined(tensors[0], "stack", "tensors");
  const int64_t d = wrap_dim("stack", dim, tensors[0].dim() + 1);
  TensorList expanded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_defined(tensors[i], "stack", "tensors");
    if (tensors[i].sizes() != tensors[0].sizes()) {
      fail("stack: expects each tensor to be equal size, but got {} at entry 0 and {} at entry {}",
           shape_str(tensors[0].sizes()), shape_str(tensors[i].sizes()), i);
    }
    expanded.push_back(unsqueeze(tensors[i], d));
  }
  return cat(expanded, d);
}

TensorList split(const Tensor& t, int64_t split_size, int64_t dim) {
  check_defined(t, "split", "input");
  if (t.dim() == 0) fail("split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim("split", dim, t.dim());
  const int64_t size = t.size(d);
  if (split_size <= 0 && size > 0) fail("split: split_size must be positive, got {}", split_size);
  if (size == 0) return {t};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += split_size) sizes.push_back(std::min(split_size, size - start));
  return split_pieces(t, d, sizes);
}

TensorList split(const Tensor& t, const std::vector<int64_t>& split_sizes, int64_t dim) {
  check_defined(t, "split", "input");
  if (t.dim() == 0) fail("split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim("split", dim, t.dim());
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    if (s < 0) fail("split: split sizes must be non-negative, got [{}]", fmt::join(split_sizes, ", "));
    total += s;
  }
  if (total != t.size(d)) {
    fail("split: split sizes [{}] sum to {}, but dim {} has size {}", fmt::join(split_sizes, ", "), total, d, t.size(d));
  }
  return split_pieces(t, d, split_sizes);
}

TensorList chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  check_defined(t, "chunk", "input");
  if (chunks <= 0) fail("chunk: number of chunks must be positive, got {}", chunks);
  if (t.dim() == 0) fail("chunk: cannot chunk a 0-d tensor");
  const int64_t d = wrap_dim("chunk", dim, t.dim());
  const int64_t size = t.size(d);
  const int64_t per = std::max<int64_t>((size + chunks - 1) / chunks, 1);
  return split(t, per, d);
}

Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  check_defined(t, "index_select", "input");
  check_kernels(t, "index_select");
  Tensor idx = index_as_int64(index, "index_select");
  check_same_device(t, idx, "index_select");
  if (idx.dim() > 1) fail("index_select: index must be 0-D or 1-D, got shape {}", shape_str(index.sizes()));
  Tensor x = t.dim() == 0 ? reshape(alias_without_history(t), {1}) : alias_without_history(t);
  const int64_t d = wrap_dim("index_select", dim, x.dim());
  idx = wrap_negative(idx.reshape({-1}), x.size(d), "index_select", d);
  Shape shape = x.sizes();
  shape[d] = idx.numel();
  Tensor out = new_output(shape, t.dtype(), t.device());
  kernels::index_select(out, x, d, idx);
  if (t.dim() == 0) out = reshaped_result(out, index.dim() == 0 ? Shape{} : Shape{idx.numel()});
  if (autograd::any_requires_grad({&t})) {
    const Shape in_shape = x.sizes();
    const Shape orig_shape = t.sizes();
    autograd::record("IndexSelectBackward", {t}, {out}, [in_shape, orig_shape, d, idx](const TensorList& g) -> TensorList {
      Tensor gi = zeros(in_shape, g[0].options());
      kernels::index_add(gi, d, idx, g[0].reshape([&] { Shape s = in_shape; s[d] = idx.numel(); return s; }()));
      return {gi.reshape(orig_shape)};
    });
  }
  return out;
}

Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  check_defined(t, "gather", "input");
  check_kernels(t, "gather");
  Tensor idx = index_as_int64(index, "gather");
  check_same_device(t, idx, "gather");
  const int64_t d = wrap_dim("gather", dim, t.dim());
  check_gather_shapes("gather", t, d, idx, nullptr);
  check_index_range(idx, t.dim() == 0 ? 1 : t.size(d), "gather", d);
  Tensor out = new_output(idx.sizes(), t.dtype(), t.device());
  if (out.numel() > 0) kernels::gather(out, alias_without_history(t), d, idx);
  if (autograd::any_requires_grad({&t})) {
    const Shape in_shape = t.sizes();
    // Saved with its version: idx may share the caller's index tensor, which they could modify.
    SavedTensor sidx(idx);
    autograd::record("GatherBackward", {t}, {out}, [in_shape, d, sidx](const TensorList& g) -> TensorList {
      Tensor gi = zeros(in_shape, g[0].options());
      kernels::scatter(gi, d, sidx.unpack("gather"), g[0].contiguous(), true);
      return {gi};
    });
  }
  return out;
}

namespace {
Tensor scatter_impl(const char* name, const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src,
                    bool accumulate, bool src_is_scalar) {
  check_defined(t, name, "input");
  check_kernels(t, name);
  Tensor idx = index_as_int64(index, name);
  check_same_device(t, idx, name);
  if (!src_is_scalar) check_same_device(t, src, name);
  const int64_t d = wrap_dim(name, dim, t.dim());
  check_gather_shapes(name, t, d, idx, src_is_scalar ? nullptr : &src);
  check_index_range(idx, t.dim() == 0 ? 1 : t.size(d), name, d);
  if (src.dtype() != t.dtype()) {
    fail("{}: expected self and src to have the same dtype, got {} and {}", name, dtype_name(t.dtype()),
         dtype_name(src.dtype()));
  }
  Tensor out = clone(alias_without_history(t));
  Tensor s = src_is_scalar ? expand(src, idx.sizes()) : alias_without_history(src);
  if (idx.numel() > 0) kernels::scatter(out, d, idx, s, accumulate);
  const bool need_src = !src_is_scalar && src.requires_grad();
  if (autograd::any_requires_grad({&t}) || (need_src && autograd::GradMode::is_enabled())) {
    TensorList inputs{t};
    if (!src_is_scalar) inputs.push_back(src);
    const Shape src_shape = src.sizes();
    // Saved with its version: idx may share the caller's index tensor, which they could modify.
    SavedTensor sidx(idx);
    autograd::record(accumulate ? "ScatterAddBackward" : "ScatterBackward", inputs, {out},
                     [d, sidx, name, accumulate, need_src, src_shape](const TensorList& g) -> TensorList {
                       Tensor idx = sidx.unpack(name);
                       Tensor gt = g[0];
                       if (!accumulate) {  // overwritten positions got no gradient from self
                         gt = g[0].clone();
                         Tensor z = zeros(idx.sizes(), g[0].options());
                         kernels::scatter(gt, d, idx, z, false);
                       }
                       TensorList r{gt};
                       if (need_src) {
                         Tensor gs = gather(g[0], d, idx);
                         if (gs.sizes() != src_shape) {
                           // src may be larger than index (only its leading index-shaped block is
                           // read); the rest of src gets a zero gradient.
                           Tensor padded = zeros(src_shape, gs.options());
                           Tensor block = padded;
                           for (int64_t k = 0; k < gs.dim(); ++k) block = narrow(block, k, 0, gs.size(k));
                           kernels::copy(block, gs);
                           gs = padded;
                         }
                         r.push_back(gs);
                       }
                       return r;
                     });
  }
  return out;
}
}  // namespace

Tensor scatter(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined(src, "scatter", "src");
  return scatter_impl("scatter", t, dim, index, src, false, false);
}
Tensor scatter(const Tensor& t, int64_t dim, const Tensor& index, const Scalar& value) {
  check_defined(t, "scatter", "input");
  return scatter_impl("scatter", t, dim, index, scalar_to_tensor(value, t.dtype(), t.device()), false, true);
}
Tensor scatter_add(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined(src, "scatter_add", "src");
  return scatter_impl("scatter_add", t, dim, index, src, true, false);
}

Tensor masked_fill(const Tensor& t, const Tensor& mask, const Scalar& value) {
  check_defined(t, "masked_fill", "input");
  check_defined(mask, "masked_fill", "mask");
  if (mask.dtype() != kBool) fail("masked_fill: expected a bool mask, got {}", dtype_name(mask.dtype()));
  if (!is_expandable_to(mask.sizes(), t.sizes())) {
    fail("masked_fill: mask of shape {} cannot be broadcast to the input's shape {}", shape_str(mask.sizes()),
         shape_str(t.sizes()));
  }
  return where(mask, scalar_to_tensor(value, t.dtype(), t.device()), t);
}

Tensor& masked_fill_(Tensor& t, const Tensor& mask, const Scalar& value) {
  check_defined(t, "masked_fill_", "self");
  const bool record = autograd::any_requires_grad({&t});
  autograd::check_inplace(t, "masked_fill_", record);
  Tensor result;
  {
    autograd::NoGradGuard guard;
    result = masked_fill(t, mask, value);
  }
  kernels::copy(t, result);
  t.bump_version();
  if (record) {
    SavedTensor m(mask);  // with its version: the caller may modify the mask afterwards
    autograd::record_inplace("MaskedFillBackward", t, {}, [m](const TensorList& g) -> TensorList {
      return {masked_fill(g[0], m.unpack("masked_fill_"), 0)};
    });
  }
  return t;
}

Tensor index(const Tensor& t, const Tensor& indices) {
  check_defined(t, "index", "input");
  check_defined(indices, "index", "indices");
  if (t.dim() == 0) fail("index: cannot index a 0-d tensor");
  if (indices.dtype() == kBool) {
    // Mask over the leading dims: keep the rows where it is true.
    const int64_t k = indices.dim();
    if (k > t.dim() || !std::equal(indices.sizes().begin(), indices.sizes().end(), t.sizes().begin())) {
      fail("index: the boolean mask of shape {} does not match the leading dims of the indexed tensor of shape {}",
           shape_str(indices.sizes()), shape_str(t.sizes()));
    }
    Tensor m = contiguous(indices).cpu();  // the result's size depends on the mask: read it on the host
    const bool* p = m.data_ptr<bool>();
    std::vector<int64_t> positions;
    for (int64_t i = 0; i < m.numel(); ++i) if (p[i]) positions.push_back(i);
    Shape flat{m.numel()};
    flat.insert(flat.end(), t.sizes().begin() + k, t.sizes().end());
    return index_select(reshape(t, flat), 0, tensor(positions, std::nullopt, {.dtype = kInt64, .device = t.device()}));
  }
  Tensor idx = index_as_int64(indices, "index");
  Tensor picked = index_select(t, 0, idx.reshape({-1}));
  Shape shape = indices.sizes();
  shape.insert(shape.end(), t.sizes().begin() + 1, t.sizes().end());
  return reshape(picked, shape);
}

Tensor one_hot(const Tensor& labels, int64_t num_classes) {
  Tensor idx = index_as_int64(labels, "one_hot");
  const Tensor host = idx.cpu();  // the checks read the values on the host (device labels too)
  const int64_t* p = host.data_ptr<int64_t>();
  int64_t mx = -1;
  for (int64_t i = 0; i < idx.numel(); ++i) {
    if (p[i] < 0) fail("one_hot: class values must be non-negative, got {}", p[i]);
    mx = std::max(mx, p[i]);
  }
  if (num_classes == -1) {
    if (idx.numel() == 0) fail("one_hot: cannot infer the number of classes from an empty tensor; pass num_classes");
    num_classes = mx + 1;
  } else if (mx >= num_classes) {
    fail("one_hot: class value {} is out of range for num_classes {}", mx, num_classes);
  }
  Shape shape = idx.sizes();
  shape.push_back(num_classes);
  Tensor out = zeros(shape, {.dtype = kInt64, .device = idx.device()});
  Tensor ones_src = ones(idx.sizes(), {.dtype = kInt64, .device = idx.device()}).unsqueeze(-1);
  kernels::scatter(out, out.dim() - 1, idx.unsqueeze(-1), ones_src, false);
  return out;
}

}  // namespace chorus
