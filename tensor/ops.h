// The op API: every tensor operation chorus offers, as free functions in namespace chorus.
// Each has one entry point (in autograd/ops/) that checks its arguments and throws chorus::Error
// naming the op and what was given, runs the kernel for the tensors' device, and, when grad mode is
// on and an input requires grad, records the backward node. Names and semantics follow PyTorch.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/generator.h"
#include "tensor/tensor.h"

namespace chorus {

// ---------------------------------------------------------------- factories
Tensor empty(const Shape& shape, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
// Without options the dtype follows the value, as PyTorch's full: bool -> bool, an integer -> int64,
// a floating-point number -> the default float32 (`full({2}, 3)` is int64, `full({2}, 3.0)` float32).
Tensor full(const Shape& shape, const Scalar& value);
Tensor full(const Shape& shape, const Scalar& value, const TensorOptions& options);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);
// [0, end) and [start, end) by step; the dtype defaults to int64 when every bound is an integer.
Tensor arange(const Scalar& end, std::optional<TensorOptions> options = std::nullopt);
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1,
              std::optional<TensorOptions> options = std::nullopt);
Tensor linspace(double start, double end, int64_t steps, const TensorOptions& options = {});
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, const TensorOptions& options = {});
// Random factories draw from `generator`, or from the default generator (seeded by manual_seed).
Tensor rand(const Shape& shape, const TensorOptions& options = {}, Generator* generator = nullptr);
Tensor randn(const Shape& shape, const TensorOptions& options = {}, Generator* generator = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape,
               const TensorOptions& options = {.dtype = kInt64}, Generator* generator = nullptr);
Tensor rand_like(const Tensor& t, Generator* generator = nullptr);
Tensor randn_like(const Tensor& t, Generator* generator = nullptr);
// Copies host values into a new tensor (shape defaults to 1-D of the values' length).
template <typename T>
Tensor tensor(const std::vector<T>& values, std::optional<Shape> shape = std::nullopt,
              const TensorOptions& options = {.dtype = dtype_of<T>::value});
template <typename T>
Tensor tensor(std::initializer_list<T> values, std::optional<Shape> shape = std::nullopt) {
  return tensor(std::vector<T>(values), std::move(shape), TensorOptions{.dtype = dtype_of<T>::value});
}
Tensor scalar_tensor(const Scalar& value, const TensorOptions& options = {});
// Wraps memory chorus does not own; `deleter` (optional) runs when the last view is gone.
Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options = {},
                 std::function<void(void*)> deleter = nullptr);
Tensor from_blob(void* data, const Shape& shape, const Strides& strides,
                 const TensorOptions& options = {}, std::function<void(void*)> deleter = nullptr);

// ---------------------------------------------------------------- views and shape
Tensor view(const Tensor& t, const Shape& shape);
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
Tensor t(const Tensor& t);  // 2-D transpose (0-D and 1-D returned as they are)
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
             int64_t step = 1);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor squeeze(const Tensor& t);
Tensor squeeze(const Tensor& t, int64_t dim);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor expand(const Tensor& t, const Shape& shape);  // -1 keeps a size
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor as_strided(const Tensor& t, const Shape& sizes, const Strides& strides,
                  std::optional<int64_t> storage_offset = std::nullopt);
Tensor contiguous(const Tensor& t);
Tensor contiguous(const Tensor& t, MemoryFormat format);  // see Tensor::contiguous(MemoryFormat)
Tensor clone(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor to_dtype(const Tensor& t, DType dtype);
Tensor to_device(const Tensor& t, Device device);
Tensor& copy_(Tensor& dst, const Tensor& src);
Tensor& fill_(Tensor& t, const Scalar& value);
// Fills with the value of a 0-d tensor, which may require grad (it gets the sum of t's gradient).
Tensor& fill_(Tensor& t, const Tensor& value);
Tensor& zero_(Tensor& t);

// ---------------------------------------------------------------- elementwise
// Binary ops broadcast (NumPy rules) and promote dtypes (PyTorch rules: a Scalar only lifts the
// category, e.g. int tensor * 2.5 -> float32, float16 tensor * 2.0 stays float16).
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor add(const Tensor& a, const Scalar& b);
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Scalar& b);
Tensor rsub(const Tensor& a, const Scalar& b);  // b - a
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Scalar& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integers divide as floats
Tensor div(const Tensor& a, const Scalar& b);
Tensor rdiv(const Tensor& a, const Scalar& b);  // b / a
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Scalar& exponent);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor pow(const Scalar& base, const Tensor& exponent);

Tensor neg(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor log1p(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor rsqrt(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor sigmoid(const Tensor& t);
Tensor relu(const Tensor& t);
// approximate: "none" (erf form, the default) or "tanh".
Tensor gelu(const Tensor& t, const std::string& approximate = "none");
Tensor sin(const Tensor& t);
Tensor cos(const Tensor& t);
Tensor expm1(const Tensor& t);
Tensor erf(const Tensor& t);
Tensor erfinv(const Tensor& t);  // |x| > 1 gives NaN, +-1 gives +-inf
Tensor log2(const Tensor& t);
Tensor log10(const Tensor& t);
// Piecewise constant (gradient zero); round halves to even. On integer tensors the identity.
Tensor floor(const Tensor& t);
Tensor ceil(const Tensor& t);
Tensor round(const Tensor& t);
Tensor trunc(const Tensor& t);
Tensor sign(const Tensor& t);
Tensor clamp(const Tensor& t, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& condition, const Tensor& a, const Scalar& b);

// Comparisons and logical ops return bool tensors and are not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Scalar& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& t);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
bool equal(const Tensor& a, const Tensor& b);  // same shape and every element equal

// In-place forms (bump the version counter; record history when autograd needs it).
Tensor& add_(Tensor& t, const Tensor& other, const Scalar& alpha = 1);
Tensor& add_(Tensor& t, const Scalar& other);
Tensor& sub_(Tensor& t, const Tensor& other, const Scalar& alpha = 1);
Tensor& mul_(Tensor& t, const Tensor& other);
Tensor& mul_(Tensor& t, const Scalar& other);
Tensor& div_(Tensor& t, const Tensor& other);
Tensor& div_(Tensor& t, const Scalar& other);
Tensor& clamp_(Tensor& t, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor& masked_fill_(Tensor& t, const Tensor& mask, const Scalar& value);

// ---------------------------------------------------------------- reductions
// `dims` empty means all dims. Integer and bool inputs sum to int64, as in PyTorch.
Tensor sum(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor prod(const Tensor& t, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor var(const Tensor& t, const std::vector<int64_t>& dims = {}, bool unbiased = true,
           bool keepdim = false);
Tensor std(const Tensor& t, const std::vector<int64_t>& dims = {}, bool unbiased = true,
           bool keepdim = false);
Tensor amax(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& t);  // over all elements
Tensor min(const Tensor& t);
// Values and int64 indices along one dim (the first index among equal values).
std::pair<Tensor, Tensor> max(const Tensor& t, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& t, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& t, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// p-norm (p = 2 default; p = inf for max-abs) over dims.
Tensor norm(const Tensor& t, double p = 2.0, const std::vector<int64_t>& dims = {},
            bool keepdim = false);
Tensor logsumexp(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor softmax(const Tensor& t, int64_t dim);
Tensor log_softmax(const Tensor& t, int64_t dim);

// ---------------------------------------------------------------- linear algebra
Tensor matmul(const Tensor& a, const Tensor& b);  // 1-D, 2-D and batched with broadcasting
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
// Einstein summation, as torch.einsum: "ij,jk->ik", "bhqd,bhkd->bhqk", implicit output ("ij,jk":
// the labels used once, sorted, upper case first), repeated labels within an operand (diagonals:
// "ii->i", "ii->"), "..." for broadcast leading dims (summed when an explicit output leaves it
// out); size-1 dims broadcast. Operands share a dtype.
// A composite of diagonal gathers, sums, permutes and bmm (autograd/ops/einsum.cpp).
Tensor einsum(const std::string& equation, const TensorList& operands);
// beta * bias + alpha * (a @ b), bias broadcast to [n, m].
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, const Scalar& beta = 1,
             const Scalar& alpha = 1);

// ---------------------------------------------------------------- joining, indexing
Tensor cat(const TensorList& tensors, int64_t dim = 0);
Tensor stack(const TensorList& tensors, int64_t dim = 0);
TensorList split(const Tensor& t, int64_t split_size, int64_t dim = 0);
TensorList split(const Tensor& t, const std::vector<int64_t>& split_sizes, int64_t dim = 0);
TensorList chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
Tensor scatter(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& t, int64_t dim, const Tensor& index, const Scalar& value);
Tensor scatter_add(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
Tensor masked_fill(const Tensor& t, const Tensor& mask, const Scalar& value);
// t[indices]: an int64 tensor selects along dim 0 (any index shape); a bool mask of t's leading
// shape selects the true elements (masked_select semantics, 1-D result over the masked dims).
Tensor index(const Tensor& t, const Tensor& indices);
Tensor one_hot(const Tensor& labels, int64_t num_classes = -1);

// ---- composite ops (autograd/ops/composite.cpp): made of the ops above, so differentiable and on
// every device; nonzero, masked_select, sort/argsort/topk and multinomial compute indices on the
// host from a copy of the input (a device synchronization, as PyTorch's nonzero).
Tensor tril(const Tensor& t, int64_t diagonal = 0);
Tensor triu(const Tensor& t, int64_t diagonal = 0);
Tensor flip(const Tensor& t, const std::vector<int64_t>& dims);
// Without dims: over the flattened tensor (one shift).
Tensor roll(const Tensor& t, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims = {});
Tensor repeat(const Tensor& t, const std::vector<int64_t>& repeats);  // Tensor.repeat
Tensor tile(const Tensor& t, const std::vector<int64_t>& reps);
Tensor repeat_interleave(const Tensor& t, int64_t repeats, std::optional<int64_t> dim = std::nullopt);
Tensor cumsum(const Tensor& t, int64_t dim);   // integers accumulate in int64
Tensor cumprod(const Tensor& t, int64_t dim);
Tensor dot(const Tensor& a, const Tensor& b);
Tensor outer(const Tensor& a, const Tensor& b);
Tensor addcmul(const Tensor& t, const Tensor& a, const Tensor& b, const Scalar& value = 1);
Tensor addcdiv(const Tensor& t, const Tensor& a, const Tensor& b, const Scalar& value = 1);
Tensor lerp(const Tensor& start, const Tensor& end, const Scalar& weight);
Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);
Tensor clamp(const Tensor& t, const Tensor& min, const Tensor& max);  // either may be undefined
Tensor remainder(const Tensor& a, const Tensor& b);  // sign of the divisor (Python's %)
Tensor remainder(const Tensor& a, const Scalar& b);
Tensor fmod(const Tensor& a, const Tensor& b);  // sign of the dividend (C's fmod)
Tensor fmod(const Tensor& a, const Scalar& b);
Tensor floor_divide(const Tensor& a, const Tensor& b);  // rounds toward -inf
Tensor floor_divide(const Tensor& a, const Scalar& b);
Tensor any(const Tensor& t);
Tensor any(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor all(const Tensor& t);
Tensor all(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor isnan(const Tensor& t);
Tensor isinf(const Tensor& t);
Tensor isfinite(const Tensor& t);
Tensor nonzero(const Tensor& t);  // int64 [count, dims]
Tensor masked_select(const Tensor& t, const Tensor& mask);  // 1-D, broadcasting t and mask
// (values, int64 indices); stable; NaN sorts as the largest value.
std::pair<Tensor, Tensor> sort(const Tensor& t, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& t, int64_t dim = -1, bool descending = false);
std::pair<Tensor, Tensor> topk(const Tensor& t, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);
Tensor bernoulli(const Tensor& p, Generator* generator = nullptr);  // 0/1 in p's dtype
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false,
                   Generator* generator = nullptr);  // int64 category indices
// In-place random fills, as Tensor.uniform_/normal_/bernoulli_ (nn::init's fills are these): the
// values are computed in float64 and cast into t (any device), a chunk at a time. A leaf that
// requires grad is refused in grad mode; on a tensor with history the old values get no gradient.
Tensor& uniform_(Tensor& t, double from = 0.0, double to = 1.0, Generator* generator = nullptr);  // [from, to)
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* generator = nullptr);
Tensor& bernoulli_(Tensor& t, double p = 0.5, Generator* generator = nullptr);  // 1 with probability p
Tensor& bernoulli_(Tensor& t, const Tensor& p, Generator* generator = nullptr);  // p broadcast to t

// ---------------------------------------------------------------- threads
// CPU kernels use this many threads for large tensors (default: the machine's cores).
void set_num_threads(int threads);
int get_num_threads();

}  // namespace chorus
