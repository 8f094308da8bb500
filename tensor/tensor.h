// Tensor: a cheap-to-copy handle to a TensorImpl {storage, offset, sizes, strides, dtype} plus the
// autograd metadata (requires_grad, grad, grad_fn, hooks). Views share storage. The methods mirror
// PyTorch's names; most forward to the free functions of tensor/ops.h, which are implemented by the
// op layer in autograd/ops (argument checks, kernel dispatch, backward recording).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/scalar.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace chorus {

namespace autograd {
class Node;
}

class Generator;
class Tensor;
class TensorImpl;

// Options for factories, with designated initializers: zeros({2, 3}, {.dtype = kFloat64}).
struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  bool requires_grad = false;
  MemoryFormat memory_format = MemoryFormat::Contiguous;  // empty/zeros/ones/full/rand: the layout made
};

// Removes a hook registered on a tensor; removing twice is harmless.
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove() {
    if (remover_) {
      auto r = std::move(remover_);
      remover_ = nullptr;
      r();
    }
  }

 private:
  std::function<void()> remover_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (like an empty at::Tensor)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const;
  const Shape& shape() const { return sizes(); }
  const Strides& strides() const;
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t storage_offset() const;
  DType dtype() const;
  Device device() const;
  TensorOptions options() const;  // dtype and device (requires_grad false)
  size_t element_size() const;
  size_t nbytes() const;
  bool is_contiguous() const;
  // Dense in `format`'s layout (Contiguous: as is_contiguous(); ChannelsLast: 4-D with NHWC strides).
  bool is_contiguous(MemoryFormat format) const;
  // The layout a result made from this tensor should have: ChannelsLast when it is channels-last
  // dense and not also plain contiguous (e.g. [N, C, 1, 1] is both: Contiguous), else Contiguous.
  MemoryFormat suggest_memory_format() const;
  bool is_floating_point() const;
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  const Storage& storage() const;
  // Raw access: data_ptr<float>() checks the dtype; the untyped form is for kernels.
  void* raw_data_ptr() const;
  template <typename T>
  T* data_ptr() const {
    check_dtype_for_access(dtype_of<T>::value, "data_ptr");
    return static_cast<T*>(raw_data_ptr());
  }
  // The single element of a one-element tensor, converted to T.
  Scalar item() const;
  template <typename T>
  T item() const {
    return item().to<T>();
  }
  std::string str() const;  // PyTorch-style printing, the same text as operator<<
  TensorImpl* unsafe_impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);
  bool is_leaf() const;
  const Tensor& grad() const;  // undefined when no gradient has been accumulated
  Tensor& mutable_grad();      // set or clear .grad directly (optimizers, DDP)
  void set_grad(const Tensor& grad);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  uint32_t output_nr() const;
  uint32_t version() const;  // storage version counter
  void bump_version() const;
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  void retain_grad() const;
  bool retains_grad() const;
  // Sees (returns undefined) or replaces (returns a tensor) the gradient flowing into this tensor.
  HookHandle register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // Leaves only: runs right after .grad was updated by backward (where data parallelism attaches).
  HookHandle register_post_accumulate_grad_hook(std::function<void(Tensor&)> hook) const;
  Tensor detach() const;  // same storage, no history
  // Makes this tensor (and every handle sharing its impl) hold new_data's storage, geometry and
  // dtype, keeping its autograd identity: what Module::to() uses so layers' members stay valid.
  void set_data(const Tensor& new_data) const;
  Tensor& detach_();

  // ---- conversion and copies ----
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype) const;
  Tensor cpu() const;                     // to(Device::cpu())
  Tensor cuda(int index = 0) const;       // to(Device::cuda(index))
  Tensor contiguous() const;
  // This tensor when it is already dense in `format`, else a copy in that layout (recorded for
  // autograd; Preserve is refused: a layout is required here). ChannelsLast needs a 4-D tensor.
  Tensor contiguous(MemoryFormat format) const;
  Tensor to(MemoryFormat format) const;  // contiguous(format), PyTorch's x.to(memory_format=...)
  Tensor clone() const;                  // keeps a channels-last tensor channels-last (Preserve)
  Tensor clone(MemoryFormat format) const;
  Tensor& copy_(const Tensor& src);  // broadcasting, across dtypes
  Tensor& fill_(const Scalar& value);
  Tensor& fill_(const Tensor& value);  // a 0-d tensor's value
  Tensor& zero_();

  // ---- views ----
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
               int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor as_strided(const Shape& sizes, const Strides& strides,
                    std::optional<int64_t> storage_offset = std::nullopt) const;
  Tensor operator[](int64_t index) const { return select(0, index); }

  // ---- elementwise ----
  Tensor add(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor add(const Scalar& other) const;
  Tensor sub(const Tensor& other, const Scalar& alpha = 1) const;
  Tensor sub(const Scalar& other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(const Scalar& other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(const Scalar& other) const;
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor log1p() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor pow(const Scalar& exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor expm1() const;
  Tensor erf() const;
  Tensor erfinv() const;
  Tensor log2() const;
  Tensor log10() const;
  Tensor floor() const;
  Tensor ceil() const;
  Tensor round() const;
  Tensor trunc() const;
  Tensor sign() const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;
  Tensor eq(const Tensor& other) const;
  Tensor eq(const Scalar& other) const;
  Tensor ne(const Tensor& other) const;
  Tensor lt(const Tensor& other) const;
  Tensor le(const Tensor& other) const;
  Tensor gt(const Tensor& other) const;
  Tensor gt(const Scalar& other) const;
  Tensor ge(const Tensor& other) const;
  Tensor masked_fill(const Tensor& mask, const Scalar& value) const;
  Tensor& add_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& add_(const Scalar& other);
  Tensor& sub_(const Tensor& other, const Scalar& alpha = 1);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(const Scalar& other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(const Scalar& other);
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  // In-place unary forms (x.relu_() is x.copy_(relu(x)), recorded as such; a leaf that requires
  // grad is refused, as every in-place op). Same dtype rules as the out-of-place op, cast back.
  Tensor& relu_();
  Tensor& exp_();
  Tensor& log_();
  Tensor& log1p_();
  Tensor& log2_();
  Tensor& log10_();
  Tensor& expm1_();
  Tensor& sqrt_();
  Tensor& rsqrt_();
  Tensor& tanh_();
  Tensor& sigmoid_();
  Tensor& neg_();
  Tensor& abs_();
  Tensor& sin_();
  Tensor& cos_();
  Tensor& floor_();
  Tensor& ceil_();
  Tensor& round_();
  Tensor& trunc_();
  Tensor& sign_();
  Tensor& erf_();
  Tensor& erfinv_();
  Tensor& masked_fill_(const Tensor& mask, const Scalar& value);
  // Random fills in place (tensor/ops.h): uniform in [from, to), normal, 0/1 with probability p.
  Tensor& uniform_(double from = 0.0, double to = 1.0, Generator* generator = nullptr);
  Tensor& normal_(double mean = 0.0, double std = 1.0, Generator* generator = nullptr);
  Tensor& bernoulli_(double p = 0.5, Generator* generator = nullptr);
  Tensor& bernoulli_(const Tensor& p, Generator* generator = nullptr);

  // ---- reductions ----
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  // The free functions of tensor/ops.h as methods, with PyTorch's names and defaults.
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  std::pair<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;  // values, int64 indices
  std::pair<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor amax(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor amin(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor prod(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor var(const std::vector<int64_t>& dims = {}, bool unbiased = true, bool keepdim = false) const;
  Tensor std(const std::vector<int64_t>& dims = {}, bool unbiased = true, bool keepdim = false) const;
  Tensor norm(double p = 2.0, const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor logsumexp(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor maximum(const Tensor& other) const;
  Tensor minimum(const Tensor& other) const;
  // x.where(condition, y): x where condition is true, else y (torch.Tensor.where).
  Tensor where(const Tensor& condition, const Tensor& other) const;
  Tensor where(const Tensor& condition, const Scalar& other) const;
  Tensor ne(const Scalar& other) const;
  Tensor lt(const Scalar& other) const;
  Tensor le(const Scalar& other) const;
  Tensor ge(const Scalar& other) const;
  Tensor view_as(const Tensor& other) const;  // view(other.sizes())
  Tensor type_as(const Tensor& other) const;  // to(other.dtype())
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& split_sizes, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor bmm(const Tensor& other) const;

  // ---- linear algebra and indexing ----
  Tensor matmul(const Tensor& other) const;
  Tensor mm(const Tensor& other) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor index(const Tensor& indices) const;  // t[indices] along dim 0 (int64 or bool mask)

 private:
  void check_dtype_for_access(DType requested, const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

using TensorList = std::vector<Tensor>;

// Autograd state of a tensor; absent (null) for tensors that never required grad.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;                   // which output of grad_fn this tensor is
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: the AccumulateGrad node, shared by uses
  bool retains_grad = false;
  // Leaf hooks live on the tensor (the AccumulateGrad node runs them); non-leaf hooks live on grad_fn.
  int next_hook_id = 0;
  std::vector<std::pair<int, std::function<Tensor(const Tensor&)>>> hooks;
  std::vector<std::pair<int, std::function<void(Tensor&)>>> post_accumulate_hooks;
  // Views only: the tensor whose memory this one views, followed to the root (never itself a view),
  // and the storage version at which grad_fn was last known to match the base's history. An
  // in-place write anywhere in the storage bumps the version; the next read of this view's history
  // then re-derives it from the base (see [In-place ops on views] in autograd/inplace.h).
  Tensor view_base;
  uint32_t view_version = 0;
  bool is_view() const { return view_base.defined(); }
};

namespace detail {
// Set by autograd: brings a view's grad_fn up to date with its base after an in-place write. The
// tensor layer calls it from requires_grad(), is_leaf() and grad_fn(), and cannot depend on autograd.
using ViewHistoryRefresh = void (*)(const Tensor& view);
void set_view_history_refresh(ViewHistoryRefresh refresh);
}  // namespace detail

class TensorImpl {
 public:
  TensorImpl(Storage storage, int64_t storage_offset, Shape sizes, Strides strides, DType dtype);

  const Storage& storage() const { return storage_; }
  int64_t storage_offset() const { return storage_offset_; }
  const Shape& sizes() const { return sizes_; }
  const Strides& strides() const { return strides_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  int64_t numel() const { return numel_; }
  bool is_contiguous() const { return is_contiguous_; }
  void* data() const {
    void* base = storage_->data();
    if (base == nullptr && storage_->is_released()) [[unlikely]] released_storage_error();
    return static_cast<char*>(base) + storage_offset_ * static_cast<int64_t>(element_size(dtype_));
  }

  AutogradMeta* autograd_meta() const { return autograd_.get(); }
  AutogradMeta& ensure_autograd_meta();
  void reset_autograd_meta() { autograd_.reset(); }

  // A chorus::Error: the tensor's storage is released (Storage::release).
  [[noreturn]] void released_storage_error() const;
  void set_data(const TensorImpl& other) {
    storage_ = other.storage_;
    dtype_ = other.dtype_;
    set_sizes_and_strides(other.sizes_, other.strides_, other.storage_offset_);
  }
  // Used by detach_() and in-place shape changes; keeps the derived fields in sync.
  void set_sizes_and_strides(Shape sizes, Strides strides, int64_t storage_offset);

 private:
  void refresh();
  Storage storage_;
  int64_t storage_offset_;
  Shape sizes_;
  Strides strides_;
  DType dtype_;
  int64_t numel_ = 0;
  bool is_contiguous_ = true;
  std::unique_ptr<AutogradMeta> autograd_;
};

// Makes a tensor over fresh storage with contiguous strides (no initialization).
Tensor make_tensor(const Shape& shape, DType dtype, Device device);
// The same in `format`'s layout (Contiguous or ChannelsLast).
Tensor make_tensor(const Shape& shape, DType dtype, Device device, MemoryFormat format);
// A new handle over the same storage and geometry, with no autograd history.
Tensor alias_without_history(const Tensor& t);

std::ostream& operator<<(std::ostream& out, const Tensor& t);

// Arithmetic operators, as in libtorch.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Scalar& b);
Tensor operator-(const Tensor& a, const Scalar& b);
Tensor operator*(const Tensor& a, const Scalar& b);
Tensor operator/(const Tensor& a, const Scalar& b);
Tensor operator+(const Scalar& a, const Tensor& b);
Tensor operator-(const Scalar& a, const Tensor& b);
Tensor operator*(const Scalar& a, const Tensor& b);
Tensor operator/(const Scalar& a, const Tensor& b);
Tensor operator-(const Tensor& a);

}  // namespace chorus
