// Views (no copy: the result shares storage) and the copies that go with them: contiguous, clone,
// dtype/device conversion, copy_, fill_. A view's backward maps the gradient back to the input's
// geometry.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "autograd/ops/common.h"
#include "tensor/fault.h"
#include "tensor/runtime.h"
#include "tensor/stream_sanitizer.h"

namespace chorus {
namespace {

using namespace ops;

Tensor view_with_history(const Tensor& t, const Shape& sizes, const Strides& strides, int64_t offset,
                         const char* node, autograd::BackwardFn backward) {
  Tensor out = make_view(t, sizes, strides, offset);
  if (autograd::any_requires_grad({&t})) autograd::record(node, {t}, {out}, std::move(backward));
  return out;
}

autograd::BackwardFn reshape_back(const Shape& shape) {
  return [shape](const TensorList& g) -> TensorList { return {reshape(g[0], shape)}; };
}

}  // namespace

Tensor view(const Tensor& t, const Shape& shape) {
  check_defined(t, "view", "input");
  Shape s = infer_shape("view", shape, t.numel());
  Strides st;
  if (!compute_view_strides(t.sizes(), t.strides(), s, st)) {
    fail("view: view size {} is not compatible with input tensor's size {} and strides {} (at least one "
         "dimension spans across two contiguous subspaces). Use reshape() instead.",
         shape_str(s), shape_str(t.sizes()), shape_str(t.strides()));
  }
  return view_with_history(t, s, st, t.storage_offset(), "ViewBackward", reshape_back(t.sizes()));
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  check_defined(t, "reshape", "input");
  Shape s = infer_shape("reshape", shape, t.numel());
  Strides st;
  if (compute_view_strides(t.sizes(), t.strides(), s, st)) return view(t, s);
  return view(clone(t), s);  // copies only when it must
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  check_defined(t, "permute", "input");
  const int64_t nd = t.dim();
  if (static_cast<int64_t>(dims.size()) != nd) {
    fail("permute: number of dims in the permutation ({}) does not match the tensor's dims ({}) for shape {}",
         dims.size(), nd, shape_str(t.sizes()));
  }
  std::vector<int64_t> wrapped(nd), inverse(nd);
  std::vector<bool> used(nd, false);
  Shape s(nd);
  Strides st(nd);
  for (int64_t i = 0; i < nd; ++i) {
    int64_t d = wrap_dim("permute", dims[i], nd);
    if (used[d]) fail("permute: dim {} repeated in permutation [{}]", d, fmt::join(dims, ", "));
    used[d] = true;
    wrapped[i] = d;
    inverse[d] = i;
    s[i] = t.sizes()[d];
    st[i] = t.strides()[d];
  }
  return view_with_history(t, s, st, t.storage_offset(), "PermuteBackward",
                           [inverse](const TensorList& g) -> TensorList { return {permute(g[0], inverse)}; });
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  check_defined(t, "transpose", "input");
  const int64_t nd = t.dim();
  if (nd == 0) return view(t, {});
  int64_t a = wrap_dim("transpose", dim0, nd), b = wrap_dim("transpose", dim1, nd);
  std::vector<int64_t> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[a], perm[b]);
  return permute(t, perm);
}

Tensor t(const Tensor& x) {
  check_defined(x, "t", "input");
  if (x.dim() > 2) fail("t: expects a tensor with <= 2 dimensions, but got shape {} ({}-D)", shape_str(x.sizes()), x.dim());
  return x.dim() < 2 ? view(x, x.sizes()) : transpose(x, 0, 1);
}

Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  check_defined(t, "slice", "input");
  if (t.dim() == 0) fail("slice: cannot slice a 0-d tensor");
  const int64_t d = wrap_dim("slice", dim, t.dim());
  if (step <= 0) fail("slice: step must be positive, got {}", step);
  const int64_t size = t.size(d);
  int64_t lo = start.value_or(0), hi = end.value_or(size);
  if (lo < 0) lo += size;
  if (hi < 0) hi += size;
  lo = std::clamp<int64_t>(lo, 0, size);
  hi = std::clamp<int64_t>(hi, lo, size);
  Shape s = t.sizes();
  Strides st = t.strides();
  s[d] = hi == lo ? 0 : (hi - lo - 1) / step + 1;  // (no overflow for a step near INT64_MAX)
  if (s[d] > 1) st[d] *= step;  // (one element or none: any stride; a huge step would overflow)
  const Shape in_shape = t.sizes();
  return view_with_history(t, s, st, t.storage_offset() + lo * t.stride(d), "SliceBackward",
                           [in_shape, d, lo, hi, step](const TensorList& g) -> TensorList {
                             Tensor gi = zeros(in_shape, g[0].options());
                             Tensor target = slice(gi, d, lo, hi, step);
                             kernels::copy(target, g[0]);
                             return {gi};
                           });
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  check_defined(t, "narrow", "input");
  if (t.dim() == 0) fail("narrow: cannot narrow a 0-d tensor");
  const int64_t d = wrap_dim("narrow", dim, t.dim());
  const int64_t size = t.size(d);
  if (start < -size || start > size) {
    fail("narrow: start {} is out of range for dim {} of size {} (expected [{}, {}])", start, d, size, -size, size);
  }
  if (start < 0) start += size;
  if (length < 0 || length > size - start) {
    fail("narrow: start ({}) + length ({}) exceeds dimension size ({}) of dim {} in shape {}", start, length, size,
         d, shape_str(t.sizes()));
  }
  return slice(t, d, start, start + length, 1);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  check_defined(t, "select", "input");
  if (t.dim() == 0) fail("select: cannot select on a 0-d tensor");
  const int64_t d = wrap_dim("select", dim, t.dim());
  const int64_t size = t.size(d);
  if (index < -size || index >= size) {
    fail("select: index {} is out of range for dim {} with size {} (expected an index in [{}, {}])", index, d, size,
         -size, size - 1);
  }
  if (index < 0) index += size;
  Shape s = t.sizes();
  Strides st = t.strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  const Shape in_shape = t.sizes();
  return view_with_history(t, s, st, t.storage_offset() + index * t.stride(d), "SelectBackward",
                           [in_shape, d, index](const TensorList& g) -> TensorList {
                             Tensor gi = zeros(in_shape, g[0].options());
                             kernels::copy(select(gi, d, index), g[0]);
                             return {gi};
                           });
}

Tensor squeeze(const Tensor& t) {
  check_defined(t, "squeeze", "input");
  Shape s;
  Strides st;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.sizes()[d] != 1) {
      s.push_back(t.sizes()[d]);
      st.push_back(t.strides()[d]);
    }
  }
  return view_with_history(t, s, st, t.storage_offset(), "SqueezeBackward", reshape_back(t.sizes()));
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  check_defined(t, "squeeze", "input");
  const int64_t d = wrap_dim("squeeze", dim, t.dim());
  if (t.dim() == 0 || t.sizes()[d] != 1) return view(t, t.sizes());
  Shape s = t.sizes();
  Strides st = t.strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return view_with_history(t, s, st, t.storage_offset(), "SqueezeBackward", reshape_back(t.sizes()));
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  check_defined(t, "unsqueeze", "input");
  const int64_t d = wrap_dim("unsqueeze", dim, t.dim() + 1);
  Shape s = t.sizes();
  Strides st = t.strides();
  const int64_t stride = d < t.dim() ? t.sizes()[d] * t.strides()[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return view_with_history(t, s, st, t.storage_offset(), "UnsqueezeBackward", reshape_back(t.sizes()));
}

Tensor expand(const Tensor& t, const Shape& shape) {
  check_defined(t, "expand", "input");
  if (shape.size() < t.sizes().size()) {
    fail("expand: the number of sizes provided ({}) must be greater or equal to the number of dimensions in the "
         "tensor ({}), got {} for a tensor of shape {}", shape.size(), t.dim(), shape_str(shape), shape_str(t.sizes()));
  }
  const size_t off = shape.size() - t.sizes().size();
  Shape s(shape.size());
  Strides st(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < off) {
      if (shape[i] < 0) fail("expand: -1 is not allowed in a leading, non-existing dimension ({})", shape_str(shape));
      s[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t have = t.sizes()[i - off];
    if (shape[i] < -1) {
      fail("expand: size {} at dimension {} is negative (target sizes {}; -1 keeps the existing size)", shape[i], i,
           shape_str(shape));
    }
    const int64_t want = shape[i] == -1 ? have : shape[i];
    if (have != want && have != 1) {
      fail("expand: the expanded size of the tensor ({}) must match the existing size ({}) at non-singleton "
           "dimension {}; target sizes {}, tensor sizes {}", want, have, i, shape_str(shape), shape_str(t.sizes()));
    }
    s[i] = want;
    st[i] = have == want ? t.strides()[i - off] : 0;
  }
  // The engine sums the expanded gradient back to the input's shape.
  return view_with_history(t, s, st, t.storage_offset(), "ExpandBackward",
                           [](const TensorList& g) -> TensorList { return {g[0]}; });
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  check_defined(t, "flatten", "input");
  if (t.dim() == 0) return reshape(t, {1});
  const int64_t a = wrap_dim("flatten", start_dim, t.dim()), b = wrap_dim("flatten", end_dim, t.dim());
  if (a > b) fail("flatten: start_dim ({}) cannot come after end_dim ({})", a, b);
  Shape s(t.sizes().begin(), t.sizes().begin() + a);
  int64_t merged = 1;
  for (int64_t d = a; d <= b; ++d) merged *= t.sizes()[d];
  s.push_back(merged);
  s.insert(s.end(), t.sizes().begin() + b + 1, t.sizes().end());
  return reshape(t, s);
}

Tensor as_strided(const Tensor& t, const Shape& sizes, const Strides& strides, std::optional<int64_t> storage_offset) {
  check_defined(t, "as_strided", "input");
  if (sizes.size() != strides.size()) {
    fail("as_strided: sizes {} and strides {} have different lengths", shape_str(sizes), shape_str(strides));
  }
  const int64_t offset = storage_offset.value_or(t.storage_offset());
  int64_t max_index = offset;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0 || strides[i] < 0) {
      fail("as_strided: negative size or stride (sizes {}, strides {})", shape_str(sizes), shape_str(strides));
    }
    if (sizes[i] == 0) { max_index = -1; break; }
    int64_t reach = 0;
    if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &reach) || __builtin_add_overflow(max_index, reach, &max_index)) {
      fail("as_strided: sizes {} with strides {} and offset {} reach past any storage (the last element's index "
           "overflows int64)", shape_str(sizes), shape_str(strides), offset);
    }
  }
  const int64_t capacity = static_cast<int64_t>(t.storage()->nbytes() / t.element_size());
  if (offset < 0 || max_index >= capacity) {
    fail("as_strided: sizes {} with strides {} and offset {} reach element {}, but the storage holds only {} "
         "elements", shape_str(sizes), shape_str(strides), offset, max_index, capacity);
  }
  const Shape in_shape = t.sizes();
  const bool in_contig = t.is_contiguous();
  const int64_t in_offset = t.storage_offset();
  if (autograd::any_requires_grad({&t}) && !in_contig) {
    fail("as_strided: backward needs a contiguous input, got strides {} for shape {}; call contiguous() first",
         shape_str(t.strides()), shape_str(t.sizes()));
  }
  return view_with_history(t, sizes, strides, offset, "AsStridedBackward",
                           [in_shape, sizes, strides, offset, in_offset](const TensorList& g) -> TensorList {
                             // Scatter-add each output element into the input position it reads, so
                             // overlapping windows accumulate.
                             const int64_t n = numel_of(in_shape);
                             Tensor positions = arange(0, n, 1, TensorOptions{.dtype = kInt64, .device = g[0].device()});
                             Tensor picked = as_strided(positions, sizes, strides, offset - in_offset).contiguous();
                             Tensor gi = zeros({n}, g[0].options());
                             kernels::index_add(gi, 0, picked.reshape({-1}), g[0].contiguous().reshape({-1}));
                             return {gi.reshape(in_shape)};
                           });
}

Tensor contiguous(const Tensor& t) {
  check_defined(t, "contiguous", "input");
  return t.is_contiguous() ? t : clone(t, MemoryFormat::Contiguous);
}

Tensor contiguous(const Tensor& t, MemoryFormat format) {
  check_defined(t, "contiguous", "input");
  if (format == MemoryFormat::Preserve) {
    fail("contiguous: MemoryFormat::Preserve is not a layout to make a tensor dense in; pass Contiguous or "
         "ChannelsLast");
  }
  if (format == MemoryFormat::ChannelsLast) channels_last_strides(t.sizes(), "contiguous");  // the rank check
  return t.is_contiguous(format) ? t : clone(t, format);
}

Tensor clone(const Tensor& t, MemoryFormat format) {
  check_defined(t, "clone", "input");
  if (format == MemoryFormat::Preserve) format = t.suggest_memory_format();
  Tensor out = make_tensor(t.sizes(), t.dtype(), t.device(), format);
  kernels::copy(out, t);
  if (autograd::any_requires_grad({&t})) {
    autograd::record("CloneBackward", {t}, {out}, [](const TensorList& g) -> TensorList { return {g[0]}; });
  }
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  check_defined(t, "to", "input");
  if (t.dtype() == dtype) return t;
  Tensor out = make_tensor(t.sizes(), dtype, t.device(), t.suggest_memory_format());
  kernels::copy(out, t);
  if (autograd::any_requires_grad({&t}) && is_floating(dtype)) {
    // The engine casts the gradient back to the input's dtype.
    autograd::record("ToCopyBackward", {t}, {out}, [](const TensorList& g) -> TensorList { return {g[0]}; });
  }
  return out;
}

namespace {

// Copies contiguous `src` into contiguous `dst` (same dtype and numel) on another device, ordered
// on the current streams. Host-to-device returns once the runtime has read the host memory (CUDA
// stages pageable memory and may first wait for the stream's earlier work, as sim always does);
// device-to-host blocks until the data is there, as PyTorch's blocking copies do.
//
// [A copy from page-locked memory waits for it] A copy from page-locked host memory (a CPU tensor
// over host_malloc's memory, a reused staging buffer) is not staged: the runtime returns at once
// and the device reads the memory when the stream gets there (cudaMemcpyAsync, and sim). So the
// host waits for the stream before returning, as PyTorch's blocking copy does for every copy
// (copy_ with non_blocking=False: cudaMemcpyAsync then cudaStreamSynchronize): the caller may
// then write the memory at once. Until 2026-12-05 to()/copy_ returned with the copy still queued,
// and a write to the source right after it changed what the device got (a read-only audit found
// it). Pageable memory needs no wait (read before the call returns). fault::Point::kPinnedCopyWaits
// removes it (sim_runtime_test).
void copy_across_devices(const Tensor& dst, const Tensor& src) {
  const size_t nbytes = static_cast<size_t>(src.numel()) * src.element_size();
  if (nbytes == 0) return;
  const Device from = src.device(), to = dst.device();
  if (from.is_cpu()) {
    DeviceRuntime& rt = runtime_for(to, "to");
    const Stream stream = current_stream(to);
    if (stream_sanitizer::active(to.type)) {
      stream_sanitizer::on_launch("copy from the host", to, stream.handle(), {stream_sanitizer::access_of(dst, true)});
    }
    {
      const StreamDeviceGuard on_device(stream);
      rt.memcpy_async(dst.raw_data_ptr(), src.raw_data_ptr(), nbytes, CopyKind::HostToDevice, stream.handle());
    }
    // [A copy from page-locked memory waits for it]
    if (rt.is_page_locked(src.raw_data_ptr())) {
      if (!fault::removed(fault::Point::kPinnedCopyWaits)) stream.synchronize();
    } else {
      note_host_sync();  // pageable: the runtime may have waited for the stream (sim always does)
    }
  } else if (to.is_cpu()) {
    DeviceRuntime& rt = runtime_for(from, "to");
    const Stream stream = current_stream(from);
    if (stream_sanitizer::active(from.type)) {
      stream_sanitizer::on_launch("copy to the host", from, stream.handle(), {stream_sanitizer::access_of(src, false)});
    }
    {
      const StreamDeviceGuard on_device(stream);
      rt.memcpy_async(dst.raw_data_ptr(), src.raw_data_ptr(), nbytes, CopyKind::DeviceToHost, stream.handle());
    }
    stream.synchronize();
  } else if (from.type != to.type) {
    copy_across_devices(dst, to_device(src, kCPU));  // no direct path between device types
  } else {
    // Another device of the same type: the copy runs on the destination's current stream after the
    // work the source's current stream has submitted, and the host waits for it so that `src` may
    // be freed on return.
    DeviceRuntime& rt = runtime_for(to, "to");
    Event ready;
    ready.record(current_stream(from));
    const Stream stream = current_stream(to);
    stream.wait(ready);
    if (stream_sanitizer::active(to.type)) {
      stream_sanitizer::on_launch("copy between devices", to, stream.handle(),
                                  {stream_sanitizer::access_of(src, false), stream_sanitizer::access_of(dst, true)});
    }
    {
      const StreamDeviceGuard on_device(stream);
      rt.memcpy_async(dst.raw_data_ptr(), src.raw_data_ptr(), nbytes, CopyKind::DeviceToDevice, stream.handle());
    }
    stream.synchronize();
  }
}

}  // namespace

Tensor to_device(const Tensor& t, Device device) {
  check_defined(t, "to", "input");
  if (t.device() == device) return t;
  if (!device.is_cpu()) runtime_for(device, "to");  // "no CUDA device ..." before anything else
  // A channels-last tensor arrives channels-last (its dense memory is copied as it is).
  const MemoryFormat format = t.suggest_memory_format();
  Tensor src = contiguous(alias_without_history(t), format);
  Tensor out = make_tensor(t.sizes(), t.dtype(), device, format);
  copy_across_devices(out, src);
  if (autograd::any_requires_grad({&t}) && is_floating(t.dtype())) {
    autograd::record("ToCopyBackward", {t}, {out}, [from = t.device()](const TensorList& g) -> TensorList {
      return {to_device(g[0], from)};
    });
  }
  return out;
}

namespace {

// dst = src (broadcast), for copy_ and fill_ with a tensor value; `op` names the op in errors.
Tensor& copy_into(Tensor& dst, const Tensor& src, const char* op, const char* backward_name) {
  check_kernels(dst, op);
  check_kernels(src, op);
  if (!is_expandable_to(src.sizes(), dst.sizes())) {
    fail("{}: source of shape {} cannot be broadcast to the destination's shape {}", op, shape_str(src.sizes()),
         shape_str(dst.sizes()));
  }
  const bool record = autograd::any_requires_grad({&dst, &src}) && is_floating(dst.dtype());
  autograd::check_inplace(dst, op, record);
  if (dst.device() != src.device()) {
    kernels::copy(dst, to_device(alias_without_history(src), dst.device()));  // then convert and broadcast there
  } else if (dst.storage() == src.storage() &&
             !(dst.storage_offset() == src.storage_offset() && dst.strides() == src.strides())) {
    kernels::copy(dst, clone(alias_without_history(src)));  // overlapping memory: go through a temporary
  } else if (dst.storage() == src.storage() && dst.sizes() == src.sizes() && dst.dtype() == src.dtype()) {
    // The same view (offset and strides too, above): nothing to copy, as PyTorch's copy_ returns at
    // once for the same tensor; the version still moves and autograd still records below.
  } else {
    kernels::copy(dst, src);
  }
  dst.bump_version();
  if (record) {
    autograd::record_inplace(backward_name, dst, {src}, [from = src.device()](const TensorList& g) -> TensorList {
      return {zeros_like(g[0]), to_device(g[0], from)};  // the engine sums a broadcast src's gradient
    });
  }
  return dst;
}

}  // namespace

Tensor& copy_(Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_", "self");
  check_defined(src, "copy_", "src");
  autograd::check_no_internal_overlap(dst, "copy_");  // (fill_ with a tensor value below writes one value: allowed)
  return copy_into(dst, src, "copy_", "CopyBackwards");
}

Tensor& fill_(Tensor& t, const Tensor& value) {
  check_defined(t, "fill_", "self");
  check_defined(value, "fill_", "value");
  if (value.dim() != 0) {
    fail("fill_: only supports a 0-dimension value tensor, but got one with {} dimensions (shape {})", value.dim(),
         shape_str(value.sizes()));
  }
  return copy_into(t, value, "fill_", "FillBackward");
}

Tensor& fill_(Tensor& t, const Scalar& value) {
  check_defined(t, "fill_", "self");
  check_kernels(t, "fill_");
  const bool record = autograd::any_requires_grad({&t});
  autograd::check_inplace(t, "fill_", record);
  kernels::fill(t, value);
  t.bump_version();
  if (record) {
    autograd::record_inplace("FillBackward", t, {}, [](const TensorList& g) -> TensorList { return {zeros_like(g[0])}; });
  }
  return t;
}

Tensor& zero_(Tensor& t) { return fill_(t, 0); }

}  // namespace chorus
