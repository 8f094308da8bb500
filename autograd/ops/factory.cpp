// Factories: empty, zeros, ones, full, ranges, eye, random tensors, tensors from host values.
#include <cmath>

#include "autograd/ops/common.h"

namespace chorus {
namespace {

using namespace ops;

Tensor finish(Tensor t, const TensorOptions& options) {
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

// Allocates on the requested device and fills there (kernels run on the device's current stream).
Tensor filled(const Shape& shape, const TensorOptions& options, const std::function<void(const Tensor&)>& fill_fn) {
  Tensor t = make_tensor(shape, options.dtype, options.device, options.memory_format);
  fill_fn(t);
  return finish(t, options);
}

}  // namespace

Tensor empty(const Shape& shape, const TensorOptions& options) {
  return finish(make_tensor(shape, options.dtype, options.device, options.memory_format), options);
}

Tensor full(const Shape& shape, const Scalar& value, const TensorOptions& options) {
  return filled(shape, options, [&](const Tensor& t) { kernels::fill(t, value); });
}
Tensor full(const Shape& shape, const Scalar& value) {
  const DType dtype = value.kind() == Scalar::Kind::Bool ? kBool : value.kind() == Scalar::Kind::Int ? kInt64 : kFloat32;
  return full(shape, value, TensorOptions{.dtype = dtype});
}
Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1, options); }
// The _like factories keep a channels-last tensor's layout (PyTorch's MemoryFormat::Preserve).
static TensorOptions like_options(const Tensor& t) {
  TensorOptions o = t.options();
  o.memory_format = t.suggest_memory_format();
  return o;
}
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), like_options(t)); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), like_options(t)); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), like_options(t)); }
Tensor full_like(const Tensor& t, const Scalar& value) { return full(t.sizes(), value, like_options(t)); }

Tensor scalar_tensor(const Scalar& value, const TensorOptions& options) { return full({}, value, options); }

Tensor arange(const Scalar& end, std::optional<TensorOptions> options) { return arange(0, end, 1, options); }

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, std::optional<TensorOptions> options) {
  const double s = start.to_double(), e = end.to_double(), st = step.to_double();
  if (st == 0) fail("arange: step must be nonzero");
  if (!std::isfinite(s) || !std::isfinite(e)) fail("arange: start ({}) and end ({}) must be finite", s, e);
  if ((st > 0 && e < s) || (st < 0 && e > s)) {
    fail("arange: upper bound and larger bound inconsistent with step sign (start {}, end {}, step {})", s, e, st);
  }
  TensorOptions opts;
  if (options) {
    opts = *options;
  } else {
    opts.dtype = start.is_integral() && end.is_integral() && step.is_integral() ? kInt64 : kFloat32;
  }
  const int64_t n = static_cast<int64_t>(std::ceil((e - s) / st));
  return filled({n}, opts, [&](const Tensor& t) { kernels::arange(t, s, st); });
}

Tensor linspace(double start, double end, int64_t steps, const TensorOptions& options) {
  if (steps < 0) fail("linspace: number of steps must be non-negative, got {}", steps);
  const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  return filled({steps}, options, [&](const Tensor& t) {
    kernels::arange(t, start, step);
    // The last value is exactly `end`, as in PyTorch (no accumulated rounding).
    if (steps > 1) kernels::fill(narrow(t, 0, steps - 1, 1), end);
  });
}

Tensor eye(int64_t n, std::optional<int64_t> m, const TensorOptions& options) {
  const int64_t cols = m.value_or(n);
  if (n < 0 || cols < 0) fail("eye: sizes must be non-negative, got n={} m={}", n, cols);
  return filled({n, cols}, options, [&](const Tensor& t) {
    kernels::fill(t, 0);
    const int64_t d = std::min(n, cols);
    if (d > 0) kernels::fill(as_strided(t, {d}, {cols + 1}, 0), 1);
  });
}

Tensor rand(const Shape& shape, const TensorOptions& options, Generator* generator) {
  if (!is_floating(options.dtype)) fail("rand: expected a floating-point dtype, got {}", dtype_name(options.dtype));
  Generator& gen = generator ? *generator : default_generator();
  return filled(shape, options, [&](const Tensor& t) { random_fill(kernels::RandomKind::Uniform, t, 0.0, 1.0, gen); });
}

Tensor randn(const Shape& shape, const TensorOptions& options, Generator* generator) {
  if (!is_floating(options.dtype)) fail("randn: expected a floating-point dtype, got {}", dtype_name(options.dtype));
  Generator& gen = generator ? *generator : default_generator();
  return filled(shape, options, [&](const Tensor& t) { random_fill(kernels::RandomKind::Normal, t, 0.0, 1.0, gen); });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options, Generator* generator) {
  if (high <= low) fail("randint: expected low < high, got low={} high={}", low, high);
  if (options.dtype == kBool) fail("randint: bool is not a valid dtype for randint");
  Generator& gen = generator ? *generator : default_generator();
  return filled(shape, options, [&](const Tensor& t) { random_fill(kernels::RandomKind::Int, t, static_cast<double>(low), static_cast<double>(high), gen); });
}

Tensor rand_like(const Tensor& t, Generator* generator) { return rand(t.sizes(), like_options(t), generator); }
Tensor randn_like(const Tensor& t, Generator* generator) { return randn(t.sizes(), like_options(t), generator); }

template <typename T>
Tensor tensor(const std::vector<T>& values, std::optional<Shape> shape, const TensorOptions& options) {
  Shape s = shape.value_or(Shape{static_cast<int64_t>(values.size())});
  if (numel_of(s) != static_cast<int64_t>(values.size())) {
    fail("tensor: {} values cannot fill shape {} ({} elements)", values.size(), shape_str(s), numel_of(s));
  }
  // Wrap the host values, then copy-convert into the requested dtype and device.
  std::vector<T> copy_of = values;
  Tensor src = from_blob(copy_of.data(), s, {.dtype = dtype_of<T>::value});
  Tensor out = make_tensor(s, options.dtype, kCPU);
  kernels::copy(out, src);
  if (!options.device.is_cpu()) out = to_device(out, options.device);
  return finish(out, options);
}

template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, std::optional<Shape>, const TensorOptions&);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, std::optional<Shape>, const TensorOptions&);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, std::optional<Shape>, const TensorOptions&);
template Tensor tensor<float>(const std::vector<float>&, std::optional<Shape>, const TensorOptions&);
template Tensor tensor<double>(const std::vector<double>&, std::optional<Shape>, const TensorOptions&);
template Tensor tensor<Half>(const std::vector<Half>&, std::optional<Shape>, const TensorOptions&);
template Tensor tensor<BFloat16>(const std::vector<BFloat16>&, std::optional<Shape>, const TensorOptions&);

// std::vector<bool> is bit-packed: specialize so from_blob sees one byte per element.
template <>
Tensor tensor<bool>(const std::vector<bool>& values, std::optional<Shape> shape, const TensorOptions& options) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  Tensor t = tensor<uint8_t>(bytes, shape, {.dtype = kUInt8});
  Tensor out = make_tensor(t.sizes(), options.dtype, kCPU);
  kernels::copy(out, t);
  if (!options.device.is_cpu()) out = to_device(out, options.device);
  return finish(out, options);
}

Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options, std::function<void(void*)> deleter) {
  return from_blob(data, shape, contiguous_strides(shape), options, std::move(deleter));
}

Tensor from_blob(void* data, const Shape& shape, const Strides& strides, const TensorOptions& options,
                 std::function<void(void*)> deleter) {
  if (shape.size() != strides.size()) {
    fail("from_blob: shape {} and strides {} have different lengths", shape_str(shape), shape_str(strides));
  }
  if (data == nullptr && numel_of(shape) > 0) fail("from_blob: data pointer is null for shape {}", shape_str(shape));
  int64_t extent = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) fail("from_blob: negative size or stride in {} / {}", shape_str(shape), shape_str(strides));
    if (shape[i] > 0) extent += (shape[i] - 1) * strides[i];
  }
  const size_t nbytes = numel_of(shape) == 0 ? 0 : static_cast<size_t>(extent + 1) * element_size(options.dtype);
  auto storage = std::make_shared<StorageImpl>(data, nbytes, options.device, std::move(deleter));
  return finish(Tensor(std::make_shared<TensorImpl>(storage, 0, shape, strides, options.dtype)), options);
}

}  // namespace chorus
