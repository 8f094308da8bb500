// Ops written in terms of other ops (PyTorch's CompositeImplicitAutograd kind): tril/triu, flip,
// roll, repeat/tile/repeat_interleave, cumsum/cumprod, dot/outer, addcmul/addcdiv/lerp, clamp with
// tensor bounds, remainder/fmod/floor_divide, any/all, isnan/isinf/isfinite, nonzero,
// masked_select, sort/argsort/topk, bernoulli, multinomial. Their gradients follow from the ops
// they are made of, and they run on every device those ops run on. Where an op's result depends on
// data (nonzero, masked_select, sort's order, multinomial) the indices are computed on the host
// from a copy of the input, as PyTorch's nonzero synchronizes; the values then come from the device.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/ops/common.h"
#include "tensor/generator.h"

namespace chorus {
namespace {

using namespace ops;

// The positions 0..n-1 as an int64 tensor on `device`.
Tensor positions(int64_t n, Device device) { return arange(n, TensorOptions{.dtype = kInt64, .device = device}); }

// [rows, cols] bool mask of (col - row) compared with `diagonal`, for tril (<=) or triu (>=).
Tensor triangle_mask(const Tensor& t, int64_t diagonal, bool lower) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  Tensor diff = sub(positions(cols, t.device()).unsqueeze(0), positions(rows, t.device()).unsqueeze(1));
  return lower ? le(diff, diagonal) : ge(diff, diagonal);
}

Tensor triangle(const Tensor& t, int64_t diagonal, bool lower, const char* name) {
  check_defined(t, name, "input");
  if (t.dim() < 2) fail("{}: expected a tensor of at least 2 dimensions, got shape {}", name, shape_str(t.sizes()));
  return where(triangle_mask(t, diagonal, lower), t, zeros_like(t));
}

// Inclusive scan along `dim` by doubling (Hillis-Steele): log2(n) passes of one op each, so the
// gradient comes from the adds/muls it is made of.
Tensor scan(const Tensor& t, int64_t dim, bool product) {
  const int64_t n = t.size(dim);
  Tensor y = t;
  for (int64_t shift = 1; shift < n; shift *= 2) {
    Tensor head = narrow(y, dim, 0, shift);
    Tensor tail = product ? mul(narrow(y, dim, shift, n - shift), narrow(y, dim, 0, n - shift))
                          : add(narrow(y, dim, shift, n - shift), narrow(y, dim, 0, n - shift));
    y = cat({head, tail}, dim);
  }
  return y;
}

Tensor scan_op(const Tensor& t, int64_t dim, bool product, const char* name) {
  check_defined(t, name, "input");
  if (t.dim() == 0) return clone(is_floating(t.dtype()) ? t : t.to(kInt64));
  const int64_t d = wrap_dim(name, dim, t.dim());
  // Integer (and bool) inputs accumulate in int64, as PyTorch's.
  const Tensor x = is_floating(t.dtype()) ? t : t.to(kInt64);
  if (x.size(d) == 0) return clone(x);
  return scan(x, d, product);
}

// Host copy of a tensor as int64/double/bool values in row-major order.
template <typename T>
std::vector<T> host_values(const Tensor& t) {
  const DType want = std::is_same_v<T, bool> ? kBool : std::is_same_v<T, int64_t> ? kInt64 : kFloat64;
  const Tensor h = t.detach().to(kCPU).to(want).contiguous();
  const T* p = h.data_ptr<T>();
  return std::vector<T>(p, p + h.numel());
}

}  // namespace

Tensor tril(const Tensor& t, int64_t diagonal) { return triangle(t, diagonal, true, "tril"); }
Tensor triu(const Tensor& t, int64_t diagonal) { return triangle(t, diagonal, false, "triu"); }

Tensor flip(const Tensor& t, const std::vector<int64_t>& dims) {
  check_defined(t, "flip", "input");
  Tensor out = t;
  std::vector<bool> seen(std::max<int64_t>(t.dim(), 1), false);
  for (int64_t dim : dims) {
    const int64_t d = wrap_dim("flip", dim, t.dim());
    if (t.dim() == 0) continue;
    if (seen[d]) fail("flip: dim {} appears more than once in {}", d, dims);
    seen[d] = true;
    const int64_t n = t.size(d);
    out = index_select(out, d, rsub(positions(n, t.device()), n - 1));
  }
  return dims.empty() || t.dim() == 0 ? clone(t) : out;
}

Tensor roll(const Tensor& t, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  check_defined(t, "roll", "input");
  if (dims.empty()) {
    if (shifts.size() != 1) fail("roll: without dims expected one shift, got {}", shifts.size());
    return roll(t.reshape({-1}), shifts, {0}).reshape(t.sizes());
  }
  if (shifts.size() != dims.size()) {
    fail("roll: got {} shifts and {} dims; expected one shift per dim", shifts.size(), dims.size());
  }
  Tensor out = t;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim("roll", dims[i], t.dim());
    if (t.dim() == 0) continue;  // one element (dim 0 or -1 of a 0-d tensor): nothing moves
    const int64_t n = t.size(d);
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;
    // out[j] = in[(j - s) mod n]
    Tensor index = remainder(add(positions(n, t.device()), n - s), Scalar(n));
    out = index_select(out, d, index);
  }
  return t.dim() == 0 ? clone(t) : out;
}

Tensor repeat(const Tensor& t, const std::vector<int64_t>& repeats) {
  check_defined(t, "repeat", "input");
  if (static_cast<int64_t>(repeats.size()) < t.dim()) {
    fail("repeat: got {} repeats for a tensor of {} dims; expected at least one per dim", repeats.size(), t.dim());
  }
  for (int64_t r : repeats)
    if (r < 0) fail("repeat: got repeats {}; expected none negative", repeats);
  const size_t k = repeats.size();
  Shape padded(k - t.dim(), 1);
  padded.insert(padded.end(), t.sizes().begin(), t.sizes().end());
  // [1, s0, 1, s1, ...] expanded to [r0, s0, r1, s1, ...], then merged pairwise.
  Shape ones_and_sizes, reps_and_sizes, result;
  for (size_t i = 0; i < k; ++i) {
    ones_and_sizes.insert(ones_and_sizes.end(), {1, padded[i]});
    reps_and_sizes.insert(reps_and_sizes.end(), {repeats[i], padded[i]});
    result.push_back(repeats[i] * padded[i]);
  }
  return expand(t.reshape(ones_and_sizes), reps_and_sizes).contiguous().reshape(result);
}

Tensor tile(const Tensor& t, const std::vector<int64_t>& reps) {
  std::vector<int64_t> r = reps;
  while (static_cast<int64_t>(r.size()) < t.dim()) r.insert(r.begin(), 1);
  return repeat(t, r);
}

Tensor repeat_interleave(const Tensor& t, int64_t repeats, std::optional<int64_t> dim) {
  check_defined(t, "repeat_interleave", "input");
  if (repeats < 0) fail("repeat_interleave: got repeats {}; expected a count >= 0", repeats);
  if (!dim) return repeat_interleave(t.reshape({-1}), repeats, 0);
  const int64_t d = wrap_dim("repeat_interleave", *dim, t.dim());
  // A 0-d tensor is one element along its one allowed dim (0 or -1): as a [1] tensor.
  if (t.dim() == 0) return repeat_interleave(t.reshape({1}), repeats, 0);
  Shape expanded = t.sizes(), result = t.sizes();
  expanded.insert(expanded.begin() + d + 1, repeats);
  result[d] *= repeats;
  return expand(t.unsqueeze(d + 1), expanded).contiguous().reshape(result);
}

Tensor cumsum(const Tensor& t, int64_t dim) { return scan_op(t, dim, false, "cumsum"); }
Tensor cumprod(const Tensor& t, int64_t dim) { return scan_op(t, dim, true, "cumprod"); }

Tensor dot(const Tensor& a, const Tensor& b) {
  check_defined(a, "dot", "input");
  check_defined(b, "dot", "other");
  if (a.dim() != 1 || b.dim() != 1 || a.size(0) != b.size(0)) {
    fail("dot: expected two 1-D tensors of the same length, got shapes {} and {}", shape_str(a.sizes()),
         shape_str(b.sizes()));
  }
  return sum(mul(a, b));
}

Tensor outer(const Tensor& a, const Tensor& b) {
  check_defined(a, "outer", "input");
  check_defined(b, "outer", "vec2");
  if (a.dim() != 1 || b.dim() != 1) {
    fail("outer: expected two 1-D tensors, got shapes {} and {}", shape_str(a.sizes()), shape_str(b.sizes()));
  }
  return mul(a.unsqueeze(1), b.unsqueeze(0));
}

Tensor addcmul(const Tensor& t, const Tensor& a, const Tensor& b, const Scalar& value) {
  return add(t, mul(mul(a, b), value));
}
Tensor addcdiv(const Tensor& t, const Tensor& a, const Tensor& b, const Scalar& value) {
  return add(t, mul(div(a, b), value));
}
Tensor lerp(const Tensor& start, const Tensor& end, const Scalar& weight) {
  return add(start, mul(sub(end, start), weight));
}
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  return add(start, mul(sub(end, start), weight));
}

Tensor clamp(const Tensor& t, const Tensor& min, const Tensor& max) {
  check_defined(t, "clamp", "input");
  if (!min.defined() && !max.defined()) fail("clamp: at least one of min and max must be given");
  Tensor out = t;
  if (min.defined()) out = maximum(out, min);
  if (max.defined()) out = minimum(out, max);
  return out;
}

// Python's modulo (the sign of the divisor), C's fmod (the sign of the dividend), and floor
// division. Integers go through float64 (exact below 2^53) and come back in their dtype; a zero
// integer divisor is an error, as in PyTorch.
namespace {
Tensor division_family(const Tensor& a, const Tensor& b, const char* name, int kind) {
  check_defined(a, name, "input");
  check_defined(b, name, "other");
  const DType dt = result_type(a, b);
  if (!is_floating(dt)) {
    if (any(eq(b, 0)).item<bool>()) fail("{}: integer division by zero", name);
    Tensor r = division_family(a.to(kFloat64), b.to(kFloat64), name, kind);
    return r.to(dt);
  }
  Tensor q = div(a, b);
  if (kind == 2) return floor(q);
  return sub(a, mul(kind == 0 ? floor(q) : trunc(q), b));
}
}  // namespace

Tensor remainder(const Tensor& a, const Tensor& b) { return division_family(a, b, "remainder", 0); }
Tensor remainder(const Tensor& a, const Scalar& b) {
  return remainder(a, scalar_to_tensor(b, result_type(a, b), a.device()));
}
Tensor fmod(const Tensor& a, const Tensor& b) { return division_family(a, b, "fmod", 1); }
Tensor fmod(const Tensor& a, const Scalar& b) { return fmod(a, scalar_to_tensor(b, result_type(a, b), a.device())); }
Tensor floor_divide(const Tensor& a, const Tensor& b) { return division_family(a, b, "floor_divide", 2); }
Tensor floor_divide(const Tensor& a, const Scalar& b) {
  return floor_divide(a, scalar_to_tensor(b, result_type(a, b), a.device()));
}

Tensor any(const Tensor& t) { return gt(sum(ne(t, 0).to(kInt64)), 0); }
Tensor any(const Tensor& t, int64_t dim, bool keepdim) { return gt(sum(ne(t, 0).to(kInt64), {dim}, keepdim), 0); }
Tensor all(const Tensor& t) { return eq(sum(eq(t, 0).to(kInt64)), 0); }
Tensor all(const Tensor& t, int64_t dim, bool keepdim) { return eq(sum(eq(t, 0).to(kInt64), {dim}, keepdim), 0); }

Tensor isnan(const Tensor& t) { return ne(t, t); }
Tensor isinf(const Tensor& t) {
  check_defined(t, "isinf", "input");
  if (!is_floating(t.dtype())) return zeros(t.sizes(), {.dtype = kBool, .device = t.device()});
  return eq(abs(t.detach()), INFINITY);
}
Tensor isfinite(const Tensor& t) {
  check_defined(t, "isfinite", "input");
  if (!is_floating(t.dtype())) return ones(t.sizes(), {.dtype = kBool, .device = t.device()});
  return logical_not(logical_or(isnan(t), isinf(t)));
}

Tensor nonzero(const Tensor& t) {
  check_defined(t, "nonzero", "input");
  const std::vector<bool> nz = host_values<bool>(ne(t, 0));
  const int64_t dims = t.dim();
  std::vector<int64_t> index;
  for (int64_t i = 0; i < static_cast<int64_t>(nz.size()); ++i) {
    if (!nz[i]) continue;
    int64_t rest = i;
    std::vector<int64_t> coord(dims);
    for (int64_t d = dims - 1; d >= 0; --d) {
      coord[d] = rest % t.size(d);
      rest /= t.size(d);
    }
    index.insert(index.end(), coord.begin(), coord.end());
  }
  const int64_t n = dims == 0 ? static_cast<int64_t>(nz.size() && nz[0]) : static_cast<int64_t>(index.size()) / dims;
  return tensor<int64_t>(index, Shape{n, dims}).to(t.device());
}

Tensor masked_select(const Tensor& t, const Tensor& mask) {
  check_defined(t, "masked_select", "input");
  check_defined(mask, "masked_select", "mask");
  if (mask.dtype() != kBool) fail("masked_select: expected a bool mask, got {}", dtype_name(mask.dtype()));
  const Shape shape = broadcast_shapes("masked_select", t.sizes(), mask.sizes());
  const Tensor flat_mask = expand(mask, shape).reshape({-1});
  const Tensor idx = nonzero(flat_mask).reshape({-1});
  return index_select(expand(t, shape).reshape({-1}), 0, idx);
}

std::pair<Tensor, Tensor> sort(const Tensor& t, int64_t dim, bool descending) {
  check_defined(t, "sort", "input");
  if (t.dim() == 0) return {clone(t), zeros({}, {.dtype = kInt64, .device = t.device()})};
  const int64_t d = wrap_dim("sort", dim, t.dim());
  // Sort rows of the input moved to the last dim, on the host; NaN counts as the largest value
  // (PyTorch's order), ties keep their order (stable).
  const Tensor moved = t.detach().transpose(d, -1).contiguous();
  const int64_t n = moved.size(-1), rows = n == 0 ? 0 : moved.numel() / n;
  std::vector<int64_t> order(static_cast<size_t>(moved.numel()));
  // Integer keys are compared as int64 (as doubles, int64 values past 2^53 would tie or misorder).
  auto sort_rows = [&]<typename K>(const std::vector<K>& v) {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t* o = order.data() + r * n;
      const K* row = v.data() + r * n;
      std::iota(o, o + n, int64_t{0});
      auto less = [row](int64_t a, int64_t b) {
        const K x = row[a], y = row[b];
        if constexpr (std::is_floating_point_v<K>) {
          if (std::isnan(x)) return false;
          return std::isnan(y) || x < y;
        } else {
          return x < y;
        }
      };
      if (descending) std::stable_sort(o, o + n, [&](int64_t a, int64_t b) { return less(b, a); });
      else std::stable_sort(o, o + n, less);
    }
  };
  if (is_floating(moved.dtype())) sort_rows(host_values<double>(moved));
  else sort_rows(host_values<int64_t>(moved));
  Tensor indices = tensor<int64_t>(order, moved.sizes()).transpose(d, -1).contiguous().to(t.device());
  return {gather(t, d, indices), indices};
}

Tensor argsort(const Tensor& t, int64_t dim, bool descending) { return sort(t, dim, descending).second; }

std::pair<Tensor, Tensor> topk(const Tensor& t, int64_t k, int64_t dim, bool largest, bool sorted) {
  check_defined(t, "topk", "input");
  const int64_t d = t.dim() == 0 ? 0 : wrap_dim("topk", dim, t.dim());
  const int64_t n = t.dim() == 0 ? 1 : t.size(d);
  if (k < 0 || k > n) fail("topk: k = {} is out of range for a dimension of size {}; expected 0 <= k <= {}", k, n, n);
  (void)sorted;  // always sorted (PyTorch allows any order when false; sorted is one of them)
  if (t.dim() == 0) return sort(t, 0, largest);
  Tensor indices = narrow(sort(t, d, largest).second, d, 0, k).contiguous();
  return {gather(t, d, indices), indices};
}

Tensor bernoulli(const Tensor& p, Generator* generator) {
  check_defined(p, "bernoulli", "input");
  if (!is_floating(p.dtype())) fail("bernoulli: expected floating-point probabilities, got {}", dtype_name(p.dtype()));
  const Tensor q = p.detach();
  if (any(logical_or(lt(q, 0), gt(q, 1))).item<bool>()) fail("bernoulli: probabilities must be in [0, 1]");
  return lt(rand_like(q, generator), q).to(p.dtype());
}

namespace {

// Fills t with chunk(shape)'s float64 values (cast into t), a chunk at a time. Chunks of an even
// number of elements consume exactly the Philox blocks a whole-tensor draw would (uniform takes two
// values a block, normal one), so the values are the same bit for bit, while the float64 temporary
// stays small (a whole-tensor one was cached by the CPU allocator and added a float64 copy of the
// largest parameters to a training run's peak memory).
template <typename Chunk>
void fill_in_chunks(Tensor& t, const Chunk& chunk) {
  constexpr int64_t kChunk = 1 << 16;  // 512 KiB of float64
  NoGradGuard no_grad;
  if (!t.is_contiguous() || t.numel() <= kChunk) {
    t.copy_(chunk(t.sizes()));
    return;
  }
  Tensor flat = t.reshape({-1});
  for (int64_t start = 0; start < t.numel(); start += kChunk) {
    const int64_t n = std::min(kChunk, t.numel() - start);
    flat.narrow(0, start, n).copy_(chunk(Shape{n}));
  }
}

// A random fill of t in place: a leaf that requires grad is refused (in grad mode, as any in-place
// op); a tensor with history is overwritten through copy_ from the drawn values, so its old values
// get no gradient.
template <typename Chunk>
Tensor& fill_random(Tensor& t, const char* op, const Chunk& chunk) {
  check_defined(t, op, "self");
  autograd::check_inplace(t, op, /*will_record=*/false);
  if (!autograd::any_requires_grad({&t})) {
    fill_in_chunks(t, chunk);
    return t;
  }
  Tensor values = empty(t.sizes(), t.options());
  fill_in_chunks(values, chunk);
  return t.copy_(values);
}

void check_floating_self(const Tensor& t, const char* op) {
  check_defined(t, op, "self");
  if (!t.is_floating_point()) fail("{}: expected a floating-point tensor, got {}", op, dtype_name(t.dtype()));
}

}  // namespace

Tensor& uniform_(Tensor& t, double from, double to, Generator* generator) {
  check_floating_self(t, "uniform_");
  if (!(from <= to) || !std::isfinite(to - from)) {
    fail("uniform_: expected a finite range [from, to) with from <= to, got from={} to={}", from, to);
  }
  Generator& g = generator ? *generator : default_generator();
  // from + (to - from) * u in float64, drawn on t's device.
  return fill_random(t, "uniform_", [&](const Shape& shape) {
    return rand(shape, {.dtype = kFloat64, .device = t.device()}, &g).mul_(to - from).add_(from);
  });
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* generator) {
  check_floating_self(t, "normal_");
  if (!(std >= 0) || !std::isfinite(std) || !std::isfinite(mean)) {
    fail("normal_: expected a finite mean and std >= 0, got mean={} std={} (std must be non-negative)", mean, std);
  }
  Generator& g = generator ? *generator : default_generator();
  return fill_random(t, "normal_", [&](const Shape& shape) {
    return randn(shape, {.dtype = kFloat64, .device = t.device()}, &g).mul_(std).add_(mean);
  });
}

Tensor& bernoulli_(Tensor& t, double p, Generator* generator) {
  if (!(p >= 0 && p <= 1)) fail("bernoulli_: expected a probability p in [0, 1], got {}", p);
  check_defined(t, "bernoulli_", "self");
  Generator& g = generator ? *generator : default_generator();
  return fill_random(t, "bernoulli_", [&](const Shape& shape) {
    return lt(rand(shape, {.dtype = kFloat64, .device = t.device()}, &g), p).to(kFloat64);
  });
}

Tensor& bernoulli_(Tensor& t, const Tensor& p, Generator* generator) {
  check_defined(t, "bernoulli_", "self");
  check_defined(p, "bernoulli_", "p");
  if (!is_floating(p.dtype())) fail("bernoulli_: expected floating-point probabilities p, got {}", dtype_name(p.dtype()));
  const Tensor q = p.detach().to(kFloat64).to(t.device()).expand(t.sizes()).contiguous();
  if (any(logical_or(lt(q, 0), gt(q, 1))).item<bool>()) fail("bernoulli_: probabilities p must be in [0, 1]");
  autograd::check_inplace(t, "bernoulli_", /*will_record=*/false);
  Generator& g = generator ? *generator : default_generator();
  // One draw for the whole tensor, compared with p (as fill_random's path for a tensor with history).
  const Tensor values = lt(rand(t.sizes(), {.dtype = kFloat64, .device = t.device()}, &g), q);
  if (autograd::any_requires_grad({&t})) return t.copy_(values);
  NoGradGuard no_grad;
  return t.copy_(values);
}

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement, Generator* generator) {
  check_defined(probs, "multinomial", "input");
  if (probs.dim() < 1 || probs.dim() > 2) {
    fail("multinomial: expected 1-D or 2-D probabilities, got shape {}", shape_str(probs.sizes()));
  }
  const Tensor p2 = probs.dim() == 1 ? probs.unsqueeze(0) : probs;
  const int64_t rows = p2.size(0), n = p2.size(1);
  if (num_samples <= 0) fail("multinomial: num_samples is {}; expected at least 1", num_samples);
  if (!replacement && num_samples > n) {
    fail("multinomial: cannot draw {} samples without replacement from {} categories", num_samples, n);
  }
  const std::vector<double> w = host_values<double>(p2);
  Generator& gen = generator ? *generator : default_generator();
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(rows * num_samples));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> row(w.begin() + r * n, w.begin() + (r + 1) * n);
    for (double x : row)
      if (!(x >= 0) || !std::isfinite(x)) fail("multinomial: probabilities must be finite and >= 0, got {}", x);
    for (int64_t s = 0; s < num_samples; ++s) {
      const double total = std::accumulate(row.begin(), row.end(), 0.0);
      if (!(total > 0)) fail("multinomial: row {} has no positive probability left to draw from", r);
      const uint64_t block = gen.reserve_blocks(1);
      const auto bits = Generator::philox(gen.seed(), block);
      double u = Generator::uniform_double(bits[0], bits[1]) * total;
      int64_t pick = n - 1;
      for (int64_t j = 0; j < n; ++j) {
        if (u < row[j]) {
          pick = j;
          break;
        }
        u -= row[j];
      }
      while (row[pick] <= 0) --pick;  // rounding at the end of the row: the last positive category
      out.push_back(pick);
      if (!replacement) row[pick] = 0;
    }
  }
  Tensor result = tensor<int64_t>(out, Shape{rows, num_samples}).to(probs.device());
  return probs.dim() == 1 ? result.squeeze(0) : result;
}

}  // namespace chorus
