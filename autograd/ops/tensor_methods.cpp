// Tensor's member functions and operators (thin forwards to the free ops), and its autograd entry
// points: backward, hooks, retain_grad, requires_grad_, detach.
#include "autograd/engine.h"
#include "autograd/ops/common.h"
#include "kernels/cpu/parallel.h"

namespace chorus {

using namespace ops;

// ---- autograd ----
Tensor& Tensor::requires_grad_(bool requires_grad) {
  check_defined(*this, "requires_grad_", "self");
  if (requires_grad && !is_floating(dtype())) {
    fail("requires_grad_: only tensors of floating point dtype can require gradients, got {}", dtype_name(dtype()));
  }
  if (!is_leaf()) {
    if (!requires_grad) {
      fail("requires_grad_: you can only change requires_grad flags of leaf variables; use detach() to get a tensor "
           "without history");
    }
    return *this;
  }
  impl_->ensure_autograd_meta().requires_grad = requires_grad;
  return *this;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, gradient.defined() ? TensorList{gradient} : TensorList{}, retain_graph);
}

void Tensor::retain_grad() const {
  check_defined(*this, "retain_grad", "self");
  if (!requires_grad()) fail("retain_grad: can't retain_grad on a tensor that has requires_grad=false");
  if (is_leaf()) return;  // leaves keep .grad anyway
  AutogradMeta& meta = impl_->ensure_autograd_meta();
  if (meta.retains_grad) return;
  meta.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  meta.grad_fn->set_retain_grad_hook(meta.output_nr, [weak](const Tensor& g) -> Tensor {
    if (auto impl = weak.lock()) {
      AutogradMeta& m = impl->ensure_autograd_meta();
      m.grad = m.grad.defined() ? chorus::add(m.grad, g) : g.clone();
    }
    return Tensor();
  });
}

HookHandle Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  check_defined(*this, "register_hook", "self");
  if (!requires_grad()) {
    fail("register_hook: cannot register a hook on a tensor that doesn't require gradient");
  }
  AutogradMeta& meta = impl_->ensure_autograd_meta();
  if (meta.grad_fn) {
    std::weak_ptr<autograd::Node> node = meta.grad_fn;
    const uint32_t nr = meta.output_nr;
    const int id = meta.grad_fn->add_tensor_hook(nr, std::move(hook));
    return HookHandle([node, nr, id] {
      if (auto n = node.lock()) n->remove_tensor_hook(nr, id);
    });
  }
  const int id = meta.next_hook_id++;
  meta.hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<TensorImpl> weak = impl_;
  return HookHandle([weak, id] {
    if (auto impl = weak.lock()) std::erase_if(impl->ensure_autograd_meta().hooks, [id](const auto& p) { return p.first == id; });
  });
}

HookHandle Tensor::register_post_accumulate_grad_hook(std::function<void(Tensor&)> hook) const {
  check_defined(*this, "register_post_accumulate_grad_hook", "self");
  if (!requires_grad() || !is_leaf()) {
    fail("register_post_accumulate_grad_hook: only leaf tensors that require grad can have post-accumulate-grad "
         "hooks (got a {} tensor that {} grad)", is_leaf() ? "leaf" : "non-leaf", requires_grad() ? "requires" : "does not require");
  }
  AutogradMeta& meta = impl_->ensure_autograd_meta();
  const int id = meta.next_hook_id++;
  meta.post_accumulate_hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<TensorImpl> weak = impl_;
  return HookHandle([weak, id] {
    if (auto impl = weak.lock()) {
      std::erase_if(impl->ensure_autograd_meta().post_accumulate_hooks, [id](const auto& p) { return p.first == id; });
    }
  });
}

Tensor Tensor::detach() const {
  check_defined(*this, "detach", "self");
  return alias_without_history(*this);
}

Tensor& Tensor::detach_() {
  check_defined(*this, "detach_", "self");
  if (AutogradMeta* meta = impl_->autograd_meta()) {
    meta->grad_fn = nullptr;
    meta->output_nr = 0;
    meta->requires_grad = false;
    // No longer a view in autograd's sense (as detach() makes one): a later write through the base
    // must not give it back a history.
    meta->view_base = Tensor();
  }
  return *this;
}

// ---- conversions, copies ----
Tensor Tensor::to(DType dtype) const { return to_dtype(*this, dtype); }
Tensor Tensor::to(Device device) const { return to_device(*this, device); }
Tensor Tensor::to(Device device, DType dtype) const { return to_device(to_dtype(*this, dtype), device); }
Tensor Tensor::cpu() const { return to_device(*this, kCPU); }
Tensor Tensor::cuda(int index) const { return to_device(*this, Device::cuda(index)); }
Tensor Tensor::contiguous() const { return chorus::contiguous(*this); }
Tensor Tensor::contiguous(MemoryFormat format) const { return chorus::contiguous(*this, format); }
Tensor Tensor::to(MemoryFormat format) const { return chorus::contiguous(*this, format); }
Tensor Tensor::clone() const { return chorus::clone(*this); }
Tensor Tensor::clone(MemoryFormat format) const { return chorus::clone(*this, format); }
Tensor& Tensor::copy_(const Tensor& src) { return chorus::copy_(*this, src); }
Tensor& Tensor::fill_(const Scalar& value) { return chorus::fill_(*this, value); }
Tensor& Tensor::fill_(const Tensor& value) { return chorus::fill_(*this, value); }
Tensor& Tensor::zero_() { return chorus::zero_(*this); }

Scalar Tensor::item() const {
  check_defined(*this, "item", "self");
  if (numel() != 1) {
    fail("item: a Tensor with {} elements cannot be converted to Scalar (shape {})", numel(), shape_str(sizes()));
  }
  Tensor c = device().is_cpu() ? *this : to_device(*this, kCPU);
  return CHORUS_DISPATCH_ALL(dtype(), "item", [&]<typename T>() -> Scalar {
    return Scalar(*static_cast<const T*>(c.raw_data_ptr()));
  });
}

// ---- views ----
Tensor Tensor::view(const Shape& shape) const { return chorus::view(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return chorus::reshape(*this, shape); }
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return chorus::permute(*this, dims); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return chorus::transpose(*this, d0, d1); }
Tensor Tensor::t() const { return chorus::t(*this); }
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const { return chorus::narrow(*this, dim, start, length); }
Tensor Tensor::slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const {
  return chorus::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, int64_t index) const { return chorus::select(*this, dim, index); }
Tensor Tensor::squeeze() const { return chorus::squeeze(*this); }
Tensor Tensor::squeeze(int64_t dim) const { return chorus::squeeze(*this, dim); }
Tensor Tensor::unsqueeze(int64_t dim) const { return chorus::unsqueeze(*this, dim); }
Tensor Tensor::expand(const Shape& shape) const { return chorus::expand(*this, shape); }
Tensor Tensor::expand_as(const Tensor& other) const { return chorus::expand(*this, other.sizes()); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return chorus::flatten(*this, start_dim, end_dim); }
Tensor Tensor::as_strided(const Shape& sizes, const Strides& strides, std::optional<int64_t> offset) const {
  return chorus::as_strided(*this, sizes, strides, offset);
}

// ---- elementwise ----
Tensor Tensor::add(const Tensor& o, const Scalar& alpha) const { return chorus::add(*this, o, alpha); }
Tensor Tensor::add(const Scalar& o) const { return chorus::add(*this, o); }
Tensor Tensor::sub(const Tensor& o, const Scalar& alpha) const { return chorus::sub(*this, o, alpha); }
Tensor Tensor::sub(const Scalar& o) const { return chorus::sub(*this, o); }
Tensor Tensor::mul(const Tensor& o) const { return chorus::mul(*this, o); }
Tensor Tensor::mul(const Scalar& o) const { return chorus::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return chorus::div(*this, o); }
Tensor Tensor::div(const Scalar& o) const { return chorus::div(*this, o); }
Tensor Tensor::neg() const { return chorus::neg(*this); }
Tensor Tensor::abs() const { return chorus::abs(*this); }
Tensor Tensor::exp() const { return chorus::exp(*this); }
Tensor Tensor::log() const { return chorus::log(*this); }
Tensor Tensor::log1p() const { return chorus::log1p(*this); }
Tensor Tensor::sqrt() const { return chorus::sqrt(*this); }
Tensor Tensor::rsqrt() const { return chorus::rsqrt(*this); }
Tensor Tensor::pow(const Scalar& e) const { return chorus::pow(*this, e); }
Tensor Tensor::pow(const Tensor& e) const { return chorus::pow(*this, e); }
Tensor Tensor::tanh() const { return chorus::tanh(*this); }
Tensor Tensor::sigmoid() const { return chorus::sigmoid(*this); }
Tensor Tensor::relu() const { return chorus::relu(*this); }
Tensor Tensor::sin() const { return chorus::sin(*this); }
Tensor Tensor::cos() const { return chorus::cos(*this); }
Tensor Tensor::expm1() const { return chorus::expm1(*this); }
Tensor Tensor::erf() const { return chorus::erf(*this); }
Tensor Tensor::erfinv() const { return chorus::erfinv(*this); }
Tensor Tensor::log2() const { return chorus::log2(*this); }
Tensor Tensor::log10() const { return chorus::log10(*this); }
Tensor Tensor::floor() const { return chorus::floor(*this); }
Tensor Tensor::ceil() const { return chorus::ceil(*this); }
Tensor Tensor::round() const { return chorus::round(*this); }
Tensor Tensor::trunc() const { return chorus::trunc(*this); }
Tensor Tensor::sign() const { return chorus::sign(*this); }
Tensor Tensor::clamp(std::optional<Scalar> lo, std::optional<Scalar> hi) const { return chorus::clamp(*this, lo, hi); }
Tensor Tensor::eq(const Tensor& o) const { return chorus::eq(*this, o); }
Tensor Tensor::eq(const Scalar& o) const { return chorus::eq(*this, o); }
Tensor Tensor::ne(const Tensor& o) const { return chorus::ne(*this, o); }
Tensor Tensor::lt(const Tensor& o) const { return chorus::lt(*this, o); }
Tensor Tensor::le(const Tensor& o) const { return chorus::le(*this, o); }
Tensor Tensor::gt(const Tensor& o) const { return chorus::gt(*this, o); }
Tensor Tensor::gt(const Scalar& o) const { return chorus::gt(*this, o); }
Tensor Tensor::ge(const Tensor& o) const { return chorus::ge(*this, o); }
Tensor Tensor::masked_fill(const Tensor& mask, const Scalar& v) const { return chorus::masked_fill(*this, mask, v); }
Tensor& Tensor::add_(const Tensor& o, const Scalar& alpha) { return chorus::add_(*this, o, alpha); }
Tensor& Tensor::add_(const Scalar& o) { return chorus::add_(*this, o); }
Tensor& Tensor::sub_(const Tensor& o, const Scalar& alpha) { return chorus::sub_(*this, o, alpha); }
Tensor& Tensor::mul_(const Tensor& o) { return chorus::mul_(*this, o); }
Tensor& Tensor::mul_(const Scalar& o) { return chorus::mul_(*this, o); }
Tensor& Tensor::div_(const Tensor& o) { return chorus::div_(*this, o); }
Tensor& Tensor::div_(const Scalar& o) { return chorus::div_(*this, o); }
Tensor& Tensor::clamp_(std::optional<Scalar> lo, std::optional<Scalar> hi) { return chorus::clamp_(*this, lo, hi); }
Tensor& Tensor::masked_fill_(const Tensor& mask, const Scalar& v) { return chorus::masked_fill_(*this, mask, v); }
Tensor& Tensor::uniform_(double from, double to, Generator* g) { return chorus::uniform_(*this, from, to, g); }
Tensor& Tensor::normal_(double mean, double std, Generator* g) { return chorus::normal_(*this, mean, std, g); }
Tensor& Tensor::bernoulli_(double p, Generator* g) { return chorus::bernoulli_(*this, p, g); }
Tensor& Tensor::bernoulli_(const Tensor& p, Generator* g) { return chorus::bernoulli_(*this, p, g); }

namespace {
// self = f(self) in place. With history, f runs on a clone so that what f saves for backward is
// not the tensor this overwrites (log's backward needs the old x); without, on self directly.
Tensor& unary_in_place(Tensor& self, Tensor (*f)(const Tensor&)) {
  const bool history = autograd::GradMode::is_enabled() && self.requires_grad();
  return chorus::copy_(self, f(history ? chorus::clone(self) : self));
}
}  // namespace
Tensor& Tensor::relu_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::relu(t); }); }
Tensor& Tensor::exp_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::exp(t); }); }
Tensor& Tensor::log_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::log(t); }); }
Tensor& Tensor::log1p_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::log1p(t); }); }
Tensor& Tensor::log2_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::log2(t); }); }
Tensor& Tensor::log10_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::log10(t); }); }
Tensor& Tensor::expm1_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::expm1(t); }); }
Tensor& Tensor::sqrt_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::sqrt(t); }); }
Tensor& Tensor::rsqrt_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::rsqrt(t); }); }
Tensor& Tensor::tanh_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::tanh(t); }); }
Tensor& Tensor::sigmoid_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::sigmoid(t); }); }
Tensor& Tensor::neg_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::neg(t); }); }
Tensor& Tensor::abs_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::abs(t); }); }
Tensor& Tensor::sin_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::sin(t); }); }
Tensor& Tensor::cos_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::cos(t); }); }
Tensor& Tensor::floor_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::floor(t); }); }
Tensor& Tensor::ceil_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::ceil(t); }); }
Tensor& Tensor::round_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::round(t); }); }
Tensor& Tensor::trunc_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::trunc(t); }); }
Tensor& Tensor::sign_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::sign(t); }); }
Tensor& Tensor::erf_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::erf(t); }); }
Tensor& Tensor::erfinv_() { return unary_in_place(*this, [](const Tensor& t) { return chorus::erfinv(t); }); }

// ---- reductions, linear algebra, indexing ----
Tensor Tensor::sum() const { return chorus::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const { return chorus::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return chorus::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const { return chorus::mean(*this, dims, keepdim); }
Tensor Tensor::max() const { return chorus::max(*this); }
Tensor Tensor::min() const { return chorus::min(*this); }
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const { return chorus::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(std::optional<int64_t> dim, bool keepdim) const { return chorus::argmin(*this, dim, keepdim); }
std::pair<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const { return chorus::max(*this, dim, keepdim); }
std::pair<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const { return chorus::min(*this, dim, keepdim); }
Tensor Tensor::amax(const std::vector<int64_t>& dims, bool keepdim) const { return chorus::amax(*this, dims, keepdim); }
Tensor Tensor::amin(const std::vector<int64_t>& dims, bool keepdim) const { return chorus::amin(*this, dims, keepdim); }
Tensor Tensor::prod(std::optional<int64_t> dim, bool keepdim) const { return chorus::prod(*this, dim, keepdim); }
Tensor Tensor::var(const std::vector<int64_t>& dims, bool unbiased, bool keepdim) const {
  return chorus::var(*this, dims, unbiased, keepdim);
}
Tensor Tensor::std(const std::vector<int64_t>& dims, bool unbiased, bool keepdim) const {
  return chorus::std(*this, dims, unbiased, keepdim);
}
Tensor Tensor::norm(double p, const std::vector<int64_t>& dims, bool keepdim) const {
  return chorus::norm(*this, p, dims, keepdim);
}
Tensor Tensor::logsumexp(const std::vector<int64_t>& dims, bool keepdim) const {
  return chorus::logsumexp(*this, dims, keepdim);
}
Tensor Tensor::softmax(int64_t dim) const { return chorus::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return chorus::log_softmax(*this, dim); }
Tensor Tensor::maximum(const Tensor& o) const { return chorus::maximum(*this, o); }
Tensor Tensor::minimum(const Tensor& o) const { return chorus::minimum(*this, o); }
Tensor Tensor::where(const Tensor& condition, const Tensor& o) const { return chorus::where(condition, *this, o); }
Tensor Tensor::where(const Tensor& condition, const Scalar& o) const { return chorus::where(condition, *this, o); }
Tensor Tensor::ne(const Scalar& o) const { return chorus::ne(*this, o); }
Tensor Tensor::lt(const Scalar& o) const { return chorus::lt(*this, o); }
Tensor Tensor::le(const Scalar& o) const { return chorus::le(*this, o); }
Tensor Tensor::ge(const Scalar& o) const { return chorus::ge(*this, o); }
Tensor Tensor::view_as(const Tensor& o) const { return view(o.sizes()); }
Tensor Tensor::type_as(const Tensor& o) const { return to(o.dtype()); }
std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim) const { return chorus::split(*this, split_size, dim); }
std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t dim) const {
  return chorus::split(*this, sizes, dim);
}
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const { return chorus::chunk(*this, chunks, dim); }
Tensor Tensor::bmm(const Tensor& o) const { return chorus::bmm(*this, o); }
Tensor Tensor::matmul(const Tensor& o) const { return chorus::matmul(*this, o); }
Tensor Tensor::mm(const Tensor& o) const { return chorus::mm(*this, o); }
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return chorus::index_select(*this, dim, index); }
Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return chorus::gather(*this, dim, index); }
Tensor Tensor::index(const Tensor& indices) const { return chorus::index(*this, indices); }

// ---- operators ----
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, const Scalar& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Scalar& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Scalar& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Scalar& b) { return div(a, b); }
Tensor operator+(const Scalar& a, const Tensor& b) { return add(b, a); }
Tensor operator-(const Scalar& a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(const Scalar& a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Scalar& a, const Tensor& b) { return rdiv(b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

void set_num_threads(int threads) {
  if (threads < 1) fail("set_num_threads: expected a positive number of threads, got {}", threads);
  kernels::cpu::set_num_threads(threads);
}
int get_num_threads() { return kernels::cpu::num_threads(); }

}  // namespace chorus
