#include "autograd/ops/common.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace chorus::ops {

void check_defined(const Tensor& t, const char* op, const char* arg) {
  if (!t.defined()) fail("{}: argument '{}' is an undefined tensor", op, arg);
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() != b.device()) {
    fail("{}: expected all tensors on the same device, got {} and {}", op, a.device().str(), b.device().str());
  }
}

void check_kernels(const Tensor& t, const char* op) {
  if (!t.device().is_cpu()) kernels::kernel_table(t.device(), op);  // throws "no CUDA device ..." if none
}

void random_fill(kernels::RandomKind kind, const Tensor& t, double a, double b, Generator& gen) {
  const uint64_t first = gen.reserve_blocks(kernels::philox_blocks(kind, t.dtype(), t.numel()));
  switch (kind) {
    case kernels::RandomKind::Uniform: kernels::uniform_at(t, a, b, gen.seed(), first); break;
    case kernels::RandomKind::Normal: kernels::normal_at(t, a, b, gen.seed(), first); break;
    case kernels::RandomKind::Int:
      kernels::random_int_at(t, static_cast<int64_t>(a), static_cast<int64_t>(b), gen.seed(), first);
      break;
  }
}

namespace {
enum class Category { Bool = 0, Integral = 1, Floating = 2 };
Category category(DType d) {
  if (d == DType::Bool) return Category::Bool;
  return is_floating(d) ? Category::Floating : Category::Integral;
}
}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  const bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return promote_types(a.dtype(), b.dtype());
  // One side is 0-d: it decides only if its category is higher.
  const Tensor& dim_t = a0 ? b : a;
  const Tensor& zero_t = a0 ? a : b;
  if (category(zero_t.dtype()) > category(dim_t.dtype())) {
    return zero_t.dtype();
  }
  return dim_t.dtype();
}

DType result_type(const Tensor& a, const Scalar& b) {
  Category sc = b.kind() == Scalar::Kind::Bool ? Category::Bool
                : b.kind() == Scalar::Kind::Int ? Category::Integral
                                                : Category::Floating;
  if (sc > category(a.dtype())) return sc == Category::Floating ? DType::Float32 : DType::Int64;
  return a.dtype();
}

Tensor cast(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : to_dtype(t, dtype); }

DType product_dtype(const Tensor& t) {
  const bool half = t.dtype() == kFloat16 || t.dtype() == kBFloat16;
  return half && t.device().is_cuda() ? t.dtype() : compute_dtype(t.dtype());
}

Tensor scalar_to_tensor(const Scalar& value, DType dtype, Device device) {
  Tensor t = make_tensor({}, dtype, device);
  kernels::fill(t, value);  // on the device: a scalar never goes through a host temporary
  return t;
}

Tensor new_output(const Shape& shape, DType dtype, Device device) { return make_tensor(shape, dtype, device); }

MemoryFormat output_format(const Shape& shape, std::initializer_list<const Tensor*> inputs) {
  if (shape.size() != 4) return MemoryFormat::Contiguous;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->sizes() == shape) return t->suggest_memory_format();
  }
  return MemoryFormat::Contiguous;
}

Tensor new_output(const Shape& shape, DType dtype, Device device, std::initializer_list<const Tensor*> inputs) {
  return make_tensor(shape, dtype, device, output_format(shape, inputs));
}

Tensor new_output_like(const Shape& shape, const Strides& strides, DType dtype, Device device) {
  const size_t n = shape.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  // Outermost first; ties (and size-1 dims, whose stride means nothing) keep their order.
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const int64_t sx = shape[x] == 1 ? 0 : strides[x], sy = shape[y] == 1 ? 0 : strides[y];
    return sx > sy;
  });
  Strides dense_strides(n);
  int64_t expected = 1;
  bool dense = true;
  for (size_t i = n; i-- > 0;) {
    const size_t d = order[i];
    if (shape[d] != 1 && strides[d] != expected) dense = false;
    dense_strides[d] = expected;
    expected *= shape[d];
  }
  if (!dense || is_contiguous_strides(shape, dense_strides)) return new_output(shape, dtype, device);
  const Tensor flat = new_output({numel_of(shape)}, dtype, device);
  return Tensor(std::make_shared<TensorImpl>(flat.storage(), 0, shape, dense_strides, dtype));
}

std::string dtypes_str(const Tensor& a, const Tensor& b) {
  return fmt::format("{} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
}

Tensor reshaped_result(const Tensor& fresh, const Shape& shape) {
  return Tensor(std::make_shared<TensorImpl>(fresh.storage(), fresh.storage_offset(), shape,
                                             contiguous_strides(shape), fresh.dtype()));
}

Tensor make_view(const Tensor& base, const Shape& sizes, const Strides& strides, int64_t storage_offset) {
  // Every view comes from here, so this is where the tensor layer learns how to bring a view's
  // history up to date (it cannot depend on autograd itself).
  static const bool refresh_installed = [] {
    detail::set_view_history_refresh(&autograd::refresh_view_history);
    return true;
  }();
  (void)refresh_installed;
  Tensor v(std::make_shared<TensorImpl>(base.storage(), storage_offset, sizes, strides, base.dtype()));
  // A view of a view records the root: its own geometry says where it lies in the shared storage,
  // so the intermediate views are not needed to re-derive it.
  const AutogradMeta* base_meta = base.unsafe_impl()->autograd_meta();
  AutogradMeta& meta = v.unsafe_impl()->ensure_autograd_meta();
  meta.view_base = base_meta != nullptr && base_meta->is_view() ? base_meta->view_base : base;
  meta.view_version = v.version();
  return v;
}

}  // namespace chorus::ops
