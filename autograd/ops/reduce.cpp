// Reductions: sum, mean, prod, var/std, amax/amin, max/min (with indices), argmax/argmin, norm,
// logsumexp, softmax and log_softmax. Composite ones (mean, var, std, logsumexp, p-norms) are built
// from differentiable ops, so their gradients come from the same formulas as everything else.
#include <cmath>
#include <limits>

#include "autograd/ops/common.h"

namespace chorus {
namespace {

using namespace ops;

Shape reduced_shape(const Shape& in, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
    bool r = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!r) out.push_back(in[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// Runs a kernel reduction into a fresh tensor of the reduced shape (keepdim applied as a view).
Tensor run_reduce(kernels::ReduceOp op, const Tensor& t, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype) {
  if (out_dtype == t.dtype() && compute_dtype(t.dtype()) != t.dtype()) {
    // float16/bfloat16 in and out: the kernels read the storage and round the result once (the bits
    // of reducing a float32 copy), without that copy.
    Tensor out = new_output(reduced_shape(t.sizes(), dims, false), out_dtype, t.device());
    kernels::reduce(op, out, t, dims);
    return keepdim ? reshaped_result(out, reduced_shape(t.sizes(), dims, true)) : out;
  }
  const DType cd = compute_dtype(t.dtype());
  const DType out_cd = compute_dtype(out_dtype);
  Tensor out = new_output(reduced_shape(t.sizes(), dims, false), out_cd, t.device());
  kernels::reduce(op, out, cast(t, cd), dims);
  out = cast(out, out_dtype);
  if (keepdim) out = reshaped_result(out, reduced_shape(t.sizes(), dims, true));
  return out;
}

// g (reduced shape) with the reduced dims put back as size 1, so it broadcasts against the input.
Tensor keep_dims(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& dims, bool keepdim) {
  return keepdim ? g : reshape(g, reduced_shape(in_shape, dims, true));
}

}  // namespace

Tensor sum(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  if (auto f32 = autocast::full_precision({&t})) return sum(autocast::cast(t, *f32), dims, keepdim);
  check_defined(t, "sum", "input");
  check_kernels(t, "sum");
  const std::vector<int64_t> d = wrap_dims("sum", dims, t.dim());
  const DType out_dtype = is_floating(t.dtype()) ? t.dtype() : kInt64;
  Tensor out = run_reduce(kernels::ReduceOp::Sum, t, d, keepdim, out_dtype);
  if (autograd::any_requires_grad({&t})) {
    const Shape in_shape = t.sizes();
    autograd::record("SumBackward", {t}, {out}, [in_shape, d, keepdim](const TensorList& g) -> TensorList {
      return {expand(keep_dims(g[0], in_shape, d, keepdim), in_shape)};
    });
  }
  return out;
}

Tensor mean(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  if (auto f32 = autocast::full_precision({&t})) return mean(autocast::cast(t, *f32), dims, keepdim);
  check_defined(t, "mean", "input");
  if (!is_floating(t.dtype())) {
    fail("mean: could not infer output dtype; input dtype must be floating point, got {}", dtype_name(t.dtype()));
  }
  const std::vector<int64_t> d = wrap_dims("mean", dims, t.dim());
  int64_t count = 1;
  for (int64_t i : d) count *= t.sizes()[i];
  return div(sum(t, d, keepdim), static_cast<double>(count));
}

Tensor prod(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  check_defined(t, "prod", "input");
  check_kernels(t, "prod");
  if (!dim) return prod(reshape(t, {-1}), 0, false);
  const std::vector<int64_t> d{wrap_dim("prod", *dim, t.dim())};
  const DType out_dtype = is_floating(t.dtype()) ? t.dtype() : kInt64;
  Tensor out = run_reduce(kernels::ReduceOp::Prod, t, t.dim() == 0 ? std::vector<int64_t>{} : d, keepdim, out_dtype);
  if (autograd::any_requires_grad({&t})) {
    SavedTensor st(t);
    const Shape in_shape = t.sizes();
    const int64_t dd = d[0];
    autograd::record("ProdBackward", {t}, {out}, [st, in_shape, dd, keepdim](const TensorList& g) -> TensorList {
      // Zero-safe: with no zero in a slice, d/dx_i = prod / x_i; with exactly one zero, only the
      // zero's position gets the product of the others; with two or more, everything is 0.
      Tensor x = st.unpack("prod");
      if (x.dim() == 0) return {g[0]};
      Tensor gk = keep_dims(g[0], in_shape, {dd}, keepdim);
      Tensor zero = eq(x, 0);
      Tensor nzeros = sum(zero, {dd}, true);
      Tensor x1 = where(zero, ones_like(x), x);
      Tensor p1 = prod(x1, dd, true);
      Tensor none = div(p1, x1);
      Tensor one = where(logical_and(eq(nzeros, 1), zero), expand(p1, x.sizes()), zeros_like(x));
      return {mul(gk, where(eq(nzeros, 0), none, one))};
    });
  }
  return out;
}

Tensor var(const Tensor& t, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  check_defined(t, "var", "input");
  if (!is_floating(t.dtype())) fail("var: expected a floating-point tensor, got {}", dtype_name(t.dtype()));
  const std::vector<int64_t> d = wrap_dims("var", dims, t.dim());
  int64_t count = 1;
  for (int64_t i : d) count *= t.sizes()[i];
  Tensor centered = sub(t, mean(t, d, true));
  // PyTorch divides by max(0, N - correction): one value unbiased, or none, gives 0 / 0 = NaN.
  const double denom = static_cast<double>(std::max<int64_t>(0, count - (unbiased ? 1 : 0)));
  return div(sum(mul(centered, centered), d, keepdim), denom);
}

Tensor std(const Tensor& t, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  return sqrt(var(t, dims, unbiased, keepdim));
}

namespace {
Tensor extreme(bool is_max, const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  const char* name = is_max ? "amax" : "amin";
  check_defined(t, name, "input");
  check_kernels(t, name);
  const std::vector<int64_t> d = wrap_dims(name, dims, t.dim());
  for (int64_t i : d) {
    if (t.sizes()[i] == 0) {
      fail("{}: cannot reduce over dim {} of size 0 (shape {}): the operation has no identity", name, i,
           shape_str(t.sizes()));
    }
  }
  if (t.numel() == 0 && d.empty()) fail("{}: cannot reduce an empty tensor", name);
  Tensor out = run_reduce(is_max ? kernels::ReduceOp::Max : kernels::ReduceOp::Min, t, d, keepdim, t.dtype());
  if (autograd::any_requires_grad({&t})) {
    SavedTensor st(t), so(out);
    const Shape in_shape = t.sizes();
    autograd::record(is_max ? "AmaxBackward" : "AminBackward", {t}, {out},
                     [st, so, in_shape, d, keepdim, name](const TensorList& g) -> TensorList {
                       // Equal extremes share the gradient evenly.
                       Tensor x = st.unpack(name);
                       Tensor m = keep_dims(so.unpack(name), in_shape, d, keepdim);
                       Tensor mask = eq(x, m).to(g[0].dtype());
                       Tensor count = sum(mask, d, true);
                       return {div(mul(mask, keep_dims(g[0], in_shape, d, keepdim)), count)};
                     });
  }
  return out;
}

std::pair<Tensor, Tensor> extreme_dim(bool is_max, const Tensor& t, int64_t dim, bool keepdim) {
  const char* name = is_max ? "max" : "min";
  check_defined(t, name, "input");
  check_kernels(t, name);
  Tensor x = t.dim() == 0 ? reshape(t, {1}) : t;
  const int64_t d = wrap_dim(name, dim, x.dim());
  if (x.sizes()[d] == 0) {
    fail("{}: cannot compute over dim {} of size 0 (shape {})", name, d, shape_str(t.sizes()));
  }
  const DType cd = compute_dtype(t.dtype());
  Shape out_shape = reduced_shape(x.sizes(), {d}, false);
  Tensor values = new_output(out_shape, cd, t.device());
  Tensor indices = new_output(out_shape, kInt64, t.device());
  kernels::arg_reduce(is_max, values, indices, cast(alias_without_history(x), cd), d);
  values = cast(values, t.dtype());
  Shape final_shape = t.dim() == 0 ? Shape{} : reduced_shape(x.sizes(), {d}, keepdim);
  values = reshaped_result(values, final_shape);
  indices = reshaped_result(indices, final_shape);
  if (autograd::any_requires_grad({&t})) {
    const Shape in_shape = t.sizes();
    // Saved with its version: the indices are returned to the caller, who may modify them.
    SavedTensor sidx(indices);
    autograd::record(is_max ? "MaxBackward" : "MinBackward", {t}, {values},
                     [in_shape, sidx, d, keepdim, name](const TensorList& g) -> TensorList {
                       if (in_shape.empty()) return {g[0]};
                       Tensor gk = keep_dims(g[0], in_shape, {d}, keepdim).contiguous();
                       Tensor ik = keep_dims(sidx.unpack(name), in_shape, {d}, keepdim).contiguous();
                       Tensor gi = zeros(in_shape, gk.options());
                       kernels::scatter(gi, d, ik, gk, false);
                       return {gi};
                     });
  }
  return {values, indices};
}
}  // namespace

Tensor amax(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) { return extreme(true, t, dims, keepdim); }
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) { return extreme(false, t, dims, keepdim); }
Tensor max(const Tensor& t) { return extreme(true, t, {}, false); }
Tensor min(const Tensor& t) { return extreme(false, t, {}, false); }
std::pair<Tensor, Tensor> max(const Tensor& t, int64_t dim, bool keepdim) { return extreme_dim(true, t, dim, keepdim); }
std::pair<Tensor, Tensor> min(const Tensor& t, int64_t dim, bool keepdim) { return extreme_dim(false, t, dim, keepdim); }

Tensor argmax(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  check_defined(t, "argmax", "input");
  if (!dim) {
    if (t.numel() == 0) fail("argmax: cannot compute on an empty tensor");
    return extreme_dim(true, alias_without_history(t).reshape({-1}), 0, false).second;
  }
  return extreme_dim(true, alias_without_history(t), *dim, keepdim).second;
}

Tensor argmin(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  check_defined(t, "argmin", "input");
  if (!dim) {
    if (t.numel() == 0) fail("argmin: cannot compute on an empty tensor");
    return extreme_dim(false, alias_without_history(t).reshape({-1}), 0, false).second;
  }
  return extreme_dim(false, alias_without_history(t), *dim, keepdim).second;
}

Tensor norm(const Tensor& t, double p, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(t, "norm", "input");
  if (!is_floating(t.dtype())) fail("norm: expected a floating-point tensor, got {}", dtype_name(t.dtype()));
  if (std::isinf(p)) return p > 0 ? amax(abs(t), dims, keepdim) : amin(abs(t), dims, keepdim);
  if (p == 1.0) return sum(abs(t), dims, keepdim);
  if (p == 2.0) {
    const std::vector<int64_t> d = wrap_dims("norm", dims, t.dim());
    Tensor out;
    {
      autograd::NoGradGuard guard;
      out = sqrt(sum(mul(t, t), d, keepdim));
    }
    if (autograd::any_requires_grad({&t})) {
      SavedTensor st(t), so(out);
      const Shape in_shape = t.sizes();
      autograd::record("NormBackward", {t}, {out}, [st, so, in_shape, d, keepdim](const TensorList& g) -> TensorList {
        // d||x|| / dx = x / ||x||, and 0 where the norm is 0 (the subgradient PyTorch picks).
        Tensor n = keep_dims(so.unpack("norm"), in_shape, d, keepdim);
        Tensor scale = where(eq(n, 0), zeros_like(n), div(keep_dims(g[0], in_shape, d, keepdim), n));
        return {mul(st.unpack("norm"), scale)};
      });
    }
    return out;
  }
  if (p <= 0) fail("norm: p must be positive (or inf), got {}", p);
  return pow(sum(pow(abs(t), p), dims, keepdim), 1.0 / p);
}

Tensor logsumexp(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(t, "logsumexp", "input");
  if (!is_floating(t.dtype())) fail("logsumexp: expected a floating-point tensor, got {}", dtype_name(t.dtype()));
  const std::vector<int64_t> d = wrap_dims("logsumexp", dims, t.dim());
  int64_t count = 1;
  for (int64_t i : d) count *= t.sizes()[i];
  // Over no elements: log(0) = -inf, as PyTorch (there is no max to shift by).
  if (count == 0) return log(sum(exp(t), d, keepdim));
  // Subtract the (constant) max for stability; an all -inf slice keeps shift 0 so the result is -inf.
  Tensor m = amax(alias_without_history(t), d, true);
  m = where(eq(abs(m), std::numeric_limits<double>::infinity()), zeros_like(m), m);
  Tensor r = add(log(sum(exp(sub(t, m)), d, true)), m);
  return keepdim ? r : reshape(r, reduced_shape(t.sizes(), d, false));
}

namespace {
Tensor softmax_impl(const Tensor& t, int64_t dim, bool log) {
  if (auto f32 = autocast::full_precision({&t})) return softmax_impl(autocast::cast(t, *f32), dim, log);
  const char* name = log ? "log_softmax" : "softmax";
  check_defined(t, name, "input");
  check_kernels(t, name);
  if (!is_floating(t.dtype())) fail("{}: expected a floating-point tensor, got {}", name, dtype_name(t.dtype()));
  Tensor x = t.dim() == 0 ? reshape(alias_without_history(t), {1}) : alias_without_history(t);
  const int64_t d = wrap_dim(name, dim, x.dim());
  // float16/bfloat16 run on their storage (the kernels widen each row to float and round once): no
  // float32 copy of the input, the output or the saved output.
  Tensor out = new_output(x.sizes(), t.dtype(), t.device());
  if (x.numel() > 0) kernels::softmax(out, x, d, log);
  out = reshaped_result(out, t.sizes());
  if (autograd::any_requires_grad({&t})) {
    SavedTensor so(out);
    autograd::record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {t}, {out},
                     [so, d, log, name](const TensorList& g) -> TensorList {
                       Tensor y = so.unpack(name);
                       Tensor y1 = y.dim() == 0 ? y.reshape({1}) : y;
                       Tensor gi = new_output(y1.sizes(), y.dtype(), y.device());
                       if (y1.numel() > 0) kernels::softmax_backward(gi, cast(g[0].reshape(y1.sizes()), y.dtype()), y1, d, log);
                       return {reshaped_result(gi, y.sizes())};
                     });
  }
  return out;
}
}  // namespace

Tensor softmax(const Tensor& t, int64_t dim) { return softmax_impl(t, dim, false); }
Tensor log_softmax(const Tensor& t, int64_t dim) { return softmax_impl(t, dim, true); }

}  // namespace chorus
