// Tensor metadata and autograd-metadata accessors. Everything that runs a kernel (copies, views
// with history, printing, item) is implemented in the op layer, autograd/ops/.
#include "tensor/tensor.h"

namespace chorus {

TensorImpl::TensorImpl(Storage storage, int64_t storage_offset, Shape sizes, Strides strides,
                       DType dtype)
    : storage_(std::move(storage)),
      storage_offset_(storage_offset),
      sizes_(std::move(sizes)),
      strides_(std::move(strides)),
      dtype_(dtype) {
  refresh();
}

void TensorImpl::set_sizes_and_strides(Shape sizes, Strides strides, int64_t storage_offset) {
  sizes_ = std::move(sizes);
  strides_ = std::move(strides);
  storage_offset_ = storage_offset;
  refresh();
}

void TensorImpl::refresh() {
  numel_ = numel_of(sizes_);
  // Contiguous means row-major dense; dims of size 1 may have any stride (as in PyTorch).
  is_contiguous_ = is_contiguous_strides(sizes_, strides_);
}

AutogradMeta& TensorImpl::ensure_autograd_meta() {
  if (!autograd_) autograd_ = std::make_unique<AutogradMeta>();
  return *autograd_;
}

namespace {
TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl, const char* what) {
  if (!impl) fail("{}: called on an undefined tensor", what);
  return *impl;
}
const Tensor kUndefined;
const std::shared_ptr<autograd::Node> kNoNode;
}  // namespace

const Shape& Tensor::sizes() const { return checked(impl_, "sizes").sizes(); }
const Strides& Tensor::strides() const { return checked(impl_, "strides").strides(); }
int64_t Tensor::dim() const { return static_cast<int64_t>(checked(impl_, "dim").sizes().size()); }
// (A 0-d tensor has no dims: wrap_dim takes 0 and -1 there, as PyTorch's does for ops that treat a
// scalar as one element, but size(0) and stride(0) have nothing to return.)
int64_t Tensor::size(int64_t d) const {
  if (dim() == 0) fail("size: dimension {} was given, but the tensor has no dimensions (0-d)", d);
  return sizes()[wrap_dim("size", d, dim())];
}
int64_t Tensor::stride(int64_t d) const {
  if (dim() == 0) fail("stride: dimension {} was given, but the tensor has no dimensions (0-d)", d);
  return strides()[wrap_dim("stride", d, dim())];
}
int64_t Tensor::numel() const { return checked(impl_, "numel").numel(); }
int64_t Tensor::storage_offset() const { return checked(impl_, "storage_offset").storage_offset(); }
DType Tensor::dtype() const { return checked(impl_, "dtype").dtype(); }
Device Tensor::device() const { return checked(impl_, "device").device(); }
TensorOptions Tensor::options() const { return {.dtype = dtype(), .device = device()}; }
size_t Tensor::element_size() const { return chorus::element_size(dtype()); }
size_t Tensor::nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
bool Tensor::is_contiguous() const { return checked(impl_, "is_contiguous").is_contiguous(); }
bool Tensor::is_contiguous(MemoryFormat format) const {
  const TensorImpl& impl = checked(impl_, "is_contiguous");
  switch (format) {
    case MemoryFormat::Contiguous: return impl.is_contiguous();
    case MemoryFormat::ChannelsLast: return is_channels_last_strides(impl.sizes(), impl.strides());
    case MemoryFormat::Preserve: break;
  }
  fail("is_contiguous: MemoryFormat::Preserve is not a layout; ask about Contiguous or ChannelsLast");
}
MemoryFormat Tensor::suggest_memory_format() const {
  const TensorImpl& impl = checked(impl_, "suggest_memory_format");
  return !impl.is_contiguous() && is_channels_last_strides(impl.sizes(), impl.strides()) ? MemoryFormat::ChannelsLast
                                                                                         : MemoryFormat::Contiguous;
}
bool Tensor::is_floating_point() const { return is_floating(dtype()); }
const Storage& Tensor::storage() const { return checked(impl_, "storage").storage(); }
void TensorImpl::released_storage_error() const {
  fail("a tensor of shape {} on {} was used while its storage is released (its memory freed between uses, as "
       "FullyShardedDataParallel does with a unit's gathered parameters); use it inside the wrapper's forward and "
       "backward, or read the parameters through full_state_dict()",
       shape_str(sizes_), device().str());
}

void* Tensor::raw_data_ptr() const { return checked(impl_, "data_ptr").data(); }

void Tensor::check_dtype_for_access(DType requested, const char* what) const {
  if (dtype() != requested) {
    fail("{}: tensor has dtype {}, but {} was requested", what, dtype_name(dtype()),
         dtype_name(requested));
  }
}

namespace {
detail::ViewHistoryRefresh g_view_history_refresh = nullptr;

// A view whose storage was written in place since its history was last derived gets it re-derived
// from the base before anyone reads it.
void refresh_if_stale_view(const std::shared_ptr<TensorImpl>& impl) {
  const AutogradMeta* meta = impl->autograd_meta();
  if (meta != nullptr && meta->is_view() && meta->view_version != impl->storage()->version() &&
      g_view_history_refresh != nullptr) {
    g_view_history_refresh(Tensor(impl));
  }
}
}  // namespace

void detail::set_view_history_refresh(ViewHistoryRefresh refresh) { g_view_history_refresh = refresh; }

bool Tensor::requires_grad() const {
  checked(impl_, "requires_grad");
  refresh_if_stale_view(impl_);
  const AutogradMeta* meta = impl_->autograd_meta();
  return meta != nullptr && (meta->requires_grad || meta->grad_fn != nullptr);
}

bool Tensor::is_leaf() const {
  checked(impl_, "is_leaf");
  refresh_if_stale_view(impl_);
  const AutogradMeta* meta = impl_->autograd_meta();
  return meta == nullptr || meta->grad_fn == nullptr;
}

const Tensor& Tensor::grad() const {
  const AutogradMeta* meta = checked(impl_, "grad").autograd_meta();
  return meta ? meta->grad : kUndefined;
}

Tensor& Tensor::mutable_grad() { return checked(impl_, "mutable_grad").ensure_autograd_meta().grad; }

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined() && grad.sizes() != sizes()) {
    fail("set_grad: gradient has shape {} but the tensor has shape {}", shape_str(grad.sizes()),
         shape_str(sizes()));
  }
  mutable_grad() = grad;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  checked(impl_, "grad_fn");
  refresh_if_stale_view(impl_);
  const AutogradMeta* meta = impl_->autograd_meta();
  return meta ? meta->grad_fn : kNoNode;
}

uint32_t Tensor::output_nr() const {
  checked(impl_, "output_nr");
  refresh_if_stale_view(impl_);
  const AutogradMeta* meta = impl_->autograd_meta();
  return meta ? meta->output_nr : 0;
}

uint32_t Tensor::version() const { return storage()->version(); }
void Tensor::bump_version() const { storage()->bump_version(); }

bool Tensor::retains_grad() const {
  const AutogradMeta* meta = checked(impl_, "retains_grad").autograd_meta();
  return meta != nullptr && meta->retains_grad;
}

void Tensor::set_data(const Tensor& new_data) const {
  checked(impl_, "set_data");
  checked(new_data.impl_ptr(), "set_data");
  // New data of another dtype or device: the leaf's AccumulateGrad node (kept alive by graphs built
  // before) expects gradients of the old kind; the next graph gets a new one (PyTorch's set_data
  // does the same).
  if (AutogradMeta* meta = impl_->autograd_meta();
      meta != nullptr && (new_data.dtype() != impl_->dtype() || new_data.device() != impl_->device())) {
    meta->grad_accumulator.reset();
  }
  impl_->set_data(*new_data.unsafe_impl());
}

Tensor make_tensor(const Shape& shape, DType dtype, Device device) {
  return make_tensor(shape, dtype, device, MemoryFormat::Contiguous);
}

Tensor make_tensor(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  for (int64_t s : shape) {
    if (s < 0) fail("empty: negative dimension {} in shape {}", s, shape_str(shape));
  }
  Strides strides = strides_for(shape, format);  // checks the rank for ChannelsLast before allocating
  // The byte count must not wrap (float32 [2^62] is 2^64 bytes: 0 after the wrap, and a 64-byte
  // block written 2^62 times), nor come near SIZE_MAX where the allocator rounds it up.
  size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(numel_of(shape)), element_size(dtype), &nbytes) ||
      nbytes > (size_t{1} << 62)) {
    fail("empty: a {} tensor of shape {} needs more bytes than a process can address", dtype_name(dtype),
         shape_str(shape));
  }
  auto storage = std::make_shared<StorageImpl>(nbytes, device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, shape, std::move(strides), dtype));
}

Tensor alias_without_history(const Tensor& t) {
  const TensorImpl& impl = checked(t.impl_ptr(), "detach");
  return Tensor(std::make_shared<TensorImpl>(impl.storage(), impl.storage_offset(), impl.sizes(),
                                             impl.strides(), impl.dtype()));
}

}  // namespace chorus
