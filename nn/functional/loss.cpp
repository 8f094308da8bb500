// Losses. cross_entropy is one fused kernel (stable log-softmax, label smoothing, class weights,
// ignore_index) with a fused backward; the others are compositions of differentiable ops except
// binary_cross_entropy_with_logits, whose backward is written out to stay exact at x = 0.
#include "nn/functional/loss.h"

#include "autograd/node.h"
#include "autograd/ops/common.h"
#include "kernels/dispatch.h"
#include "tensor/ops.h"

namespace chorus::nn::functional {

using autograd::SavedTensor;

namespace {

void check_same_shape(const char* name, const Tensor& input, const Tensor& target) {
  ops::check_defined(input, name, "input");
  ops::check_defined(target, name, "target");
  if (input.sizes() != target.sizes()) {
    fail("{}: input of shape {} and target of shape {} must have the same shape", name, shape_str(input.sizes()),
         shape_str(target.sizes()));
  }
}

Tensor reduce(const Tensor& losses, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return losses;
    case Reduction::Sum: return sum(losses);
    case Reduction::Mean: return mean(losses);
  }
  return losses;
}

// Moves the class dim (1) last and flattens: [N, C, d...] -> [N*d..., C]; target -> [N*d...].
void flatten_classes(const char* name, const Tensor& input, const Tensor& target, Tensor& logits2d, Tensor& target1d,
                     Shape& loss_shape) {
  ops::check_defined(input, name, "input");
  ops::check_defined(target, name, "target");
  if (input.dim() < 2) {
    fail("{}: expected input of shape [N, C] or [N, C, d1, ...], got {}", name, shape_str(input.sizes()));
  }
  if (target.dtype() != kInt64 && target.dtype() != kInt32) {
    fail("{}: expected class indices of dtype int64 as target, got {} (probability targets are not supported)", name,
         dtype_name(target.dtype()));
  }
  Shape expected{input.size(0)};
  for (int64_t d = 2; d < input.dim(); ++d) expected.push_back(input.size(d));
  if (target.sizes() != expected) {
    fail("{}: target of shape {} does not match input of shape {} (expected target shape {})", name,
         shape_str(target.sizes()), shape_str(input.sizes()), shape_str(expected));
  }
  loss_shape = expected;
  Tensor x = input;
  if (input.dim() > 2) {
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < input.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    x = permute(x, perm);
  }
  logits2d = reshape(x, {-1, input.size(1)});
  target1d = target.to(kInt64).contiguous().reshape({-1});
}

void check_targets(const char* name, const Tensor& target, int64_t classes, int64_t ignore_index) {
  // Device targets are read back for the check (PyTorch asserts on the device instead).
  const Tensor target1d = target.cpu();
  const int64_t* p = target1d.data_ptr<int64_t>();
  for (int64_t i = 0; i < target1d.numel(); ++i) {
    if (p[i] != ignore_index && (p[i] < 0 || p[i] >= classes)) {
      fail("{}: target {} is out of bounds for {} classes (expected a class index in [0, {}) or ignore_index {})", name,
           p[i], classes, classes, ignore_index);
    }
  }
}

}  // namespace

namespace {

// cross_entropy with class probabilities as the target (PyTorch's soft labels): the target has the
// input's shape; loss = -sum_c weight_c * t_c * log_softmax(input)_c per position, with t smoothed
// toward uniform by label_smoothing; the mean divides by the number of positions (N * d1 * ...),
// not by the weights. A composite: gradients reach the input and a target that requires them.
Tensor probability_cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options) {
  if (!input.is_floating_point()) fail("cross_entropy: expected floating-point logits, got {}", dtype_name(input.dtype()));
  if (input.dim() < 2 || target.sizes() != input.sizes()) {
    fail("cross_entropy: a {} target of shape {} is neither class indices (dtype int64, the input's shape without "
         "the class dim) nor class probabilities (the input's shape {}, at least [N, C])",
         dtype_name(target.dtype()), shape_str(target.sizes()), shape_str(input.sizes()));
  }
  if (target.dtype() != input.dtype()) {
    fail("cross_entropy: probability target of dtype {} must match the input's dtype {}", dtype_name(target.dtype()),
         dtype_name(input.dtype()));
  }
  ops::check_same_device(input, target, "cross_entropy");
  const int64_t C = input.size(1);
  if (options.label_smoothing < 0.0 || options.label_smoothing > 1.0) {
    fail("cross_entropy: label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  }
  if (options.weight.defined() && (options.weight.dim() != 1 || options.weight.size(0) != C)) {
    fail("cross_entropy: weight of shape {} must have one entry per class ({})", shape_str(options.weight.sizes()), C);
  }
  Tensor t = target;
  if (options.label_smoothing > 0.0) {
    t = add(mul(t, 1.0 - options.label_smoothing), full({}, options.label_smoothing / static_cast<double>(C),
                                                          {.dtype = input.dtype(), .device = input.device()}));
  }
  Tensor terms = mul(chorus::log_softmax(input, 1), t);
  if (options.weight.defined()) {
    Shape per_class(static_cast<size_t>(input.dim()), 1);
    per_class[1] = C;
    terms = mul(terms, options.weight.to(input.dtype()).reshape(per_class));
  }
  const Tensor per_position = neg(sum(terms, {1}));
  switch (options.reduction) {
    case Reduction::None: return per_position;
    case Reduction::Sum: return sum(per_position);
    case Reduction::Mean: return mean(per_position);
  }
  return per_position;
}

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyOptions& options) {
  if (auto f32 = autocast::full_precision({&input, &target, &options.weight})) {
    CrossEntropyOptions o = options;
    o.weight = autocast::cast(options.weight, *f32);
    return cross_entropy(autocast::cast(input, *f32), autocast::cast(target, *f32), o);
  }
  if (target.defined() && target.is_floating_point()) return probability_cross_entropy(input, target, options);
  Tensor logits2d, target1d;
  Shape loss_shape;
  flatten_classes("cross_entropy", input, target, logits2d, target1d, loss_shape);
  const int64_t C = input.size(1);
  if (options.label_smoothing < 0.0 || options.label_smoothing > 1.0) {
    fail("cross_entropy: label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  }
  if (options.weight.defined() && (options.weight.dim() != 1 || options.weight.size(0) != C)) {
    fail("cross_entropy: weight of shape {} must have one entry per class ({})", shape_str(options.weight.sizes()), C);
  }
  if (!input.is_floating_point()) fail("cross_entropy: expected floating-point logits, got {}", dtype_name(input.dtype()));
  check_targets("cross_entropy", target1d, C, options.ignore_index);
  // float16/bfloat16 logits stay in their storage, and so do the saved probabilities and the logits'
  // gradient (the kernels compute each row at float); per-row losses and class weights are in the
  // compute dtype.
  const DType cd = compute_dtype(input.dtype());
  Tensor x = alias_without_history(logits2d).contiguous();
  Tensor cw = options.weight.defined() ? ops::cast(options.weight, cd).contiguous() : Tensor();
  const int64_t rows = x.size(0);
  Tensor losses = make_tensor({rows}, cd, x.device());
  Tensor row_weight = make_tensor({rows}, cd, x.device());
  Tensor probs = make_tensor({rows, C}, input.dtype(), x.device());
  kernels::cross_entropy(losses, row_weight, probs, x, target1d, cw, options.ignore_index, options.label_smoothing);

  // Reduction inside the op, so the backward knows each row's scale: mean divides by the summed
  // target weights of the non-ignored rows (the count when unweighted), as PyTorch.
  Tensor out;
  Tensor denom;  // float64 0-d on the device: the mean's denominator (1 for a sum)
  if (options.reduction == Reduction::None) {
    out = ops::reshaped_result(losses, loss_shape);
  } else {
    // Summed in float64 on the device: no host round trip. All targets ignored: 0/0 = nan, as PyTorch.
    const Tensor total = losses.to(kFloat64).sum();
    denom = options.reduction == Reduction::Mean ? row_weight.to(kFloat64).sum()
                                                 : full({}, 1.0, {.dtype = kFloat64, .device = x.device()});
    out = ops::cast(total / denom, cd);
  }
  out = ops::cast(out, input.dtype());
  if (autograd::any_requires_grad({&input})) {
    const Reduction reduction = options.reduction;
    const int64_t ignore = options.ignore_index;
    const double smoothing = options.label_smoothing;
    const Shape logits_shape = logits2d.sizes();
    // The targets are saved with their version (target1d may share the caller's storage): targets
    // changed in place before backward are refused, as PyTorch's, not read (the range check ran in
    // the forward).
    const autograd::SavedTensor saved_target(target1d), saved_weight(cw);  // (cw may be the caller's weight)
    autograd::record("CrossEntropyBackward", {logits2d}, {out},
                     [=](const TensorList& g) -> TensorList {
                       const Tensor target1d = saved_target.unpack("cross_entropy");
                       // row_scale[r] = upstream gradient of row r (divided by the mean's denominator).
                       Tensor scale;
                       if (reduction == Reduction::None) {
                         scale = ops::cast(g[0], cd).contiguous().reshape({-1});
                       } else {
                         scale = ops::cast(ops::cast(g[0], kFloat64) / denom, cd).expand({rows}).contiguous();
                       }
                       Tensor grad = make_tensor({rows, C}, probs.dtype(), probs.device());
                       const Tensor cw = saved_weight.unpack("cross_entropy");
                       kernels::cross_entropy_backward(grad, scale, probs, target1d, cw, ignore, smoothing);
                       return {grad};
                     });
  }
  return out;
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options) {
  if (auto f32 = autocast::full_precision({&input, &options.weight})) {
    NLLLossOptions o = options;
    o.weight = autocast::cast(options.weight, *f32);
    return nll_loss(autocast::cast(input, *f32), target, o);
  }
  Tensor logp2d, target1d;
  Shape loss_shape;
  flatten_classes("nll_loss", input, target, logp2d, target1d, loss_shape);
  const int64_t C = input.size(1);
  if (options.weight.defined() && (options.weight.dim() != 1 || options.weight.size(0) != C)) {
    fail("nll_loss: weight of shape {} must have one entry per class ({})", shape_str(options.weight.sizes()), C);
  }
  check_targets("nll_loss", target1d, C, options.ignore_index);
  Tensor valid = ne(target1d, options.ignore_index);
  Tensor safe = where(valid, target1d, zeros_like(target1d));
  Tensor picked = gather(logp2d, 1, safe.unsqueeze(1)).squeeze(1);
  Tensor w = valid.to(input.dtype());
  if (options.weight.defined()) w = mul(w, index_select(options.weight.to(input.dtype()), 0, safe));
  Tensor losses = neg(mul(picked, w));
  switch (options.reduction) {
    case Reduction::None: return reshape(losses, loss_shape);
    case Reduction::Sum: return sum(losses);
    case Reduction::Mean: return div(sum(losses), sum(w));
  }
  return losses;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (auto f32 = autocast::full_precision({&input, &target})) {
    return mse_loss(autocast::cast(input, *f32), autocast::cast(target, *f32), reduction);
  }
  check_same_shape("mse_loss", input, target);
  Tensor d = sub(input, target);
  return reduce(mul(d, d), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, Reduction reduction,
                                        const Tensor& pos_weight) {
  if (auto f32 = autocast::full_precision({&input, &target, &pos_weight})) {
    return binary_cross_entropy_with_logits(autocast::cast(input, *f32), autocast::cast(target, *f32), reduction,
                                            autocast::cast(pos_weight, *f32));
  }
  ops::check_defined(input, "binary_cross_entropy_with_logits", "input");
  ops::check_defined(target, "binary_cross_entropy_with_logits", "target");
  if (input.sizes() != target.sizes()) {
    fail("binary_cross_entropy_with_logits: target size {} must be the same as input size {}", shape_str(target.sizes()),
         shape_str(input.sizes()));
  }
  Tensor losses;
  Tensor x = alias_without_history(input), y = alias_without_history(target);
  {
    NoGradGuard no_grad;
    // softplus(-x) = max(-x, 0) + log1p(exp(-|x|));  loss = (1 - y) x + (1 + (pw - 1) y) softplus(-x)
    Tensor sp = add(relu(neg(x)), log1p(exp(neg(abs(x)))));
    Tensor coef = pos_weight.defined() ? add(mul(y, sub(pos_weight, 1.0)), 1.0) : ones_like(x);
    losses = add(mul(rsub(y, 1.0), x), mul(coef, sp));
  }
  if (autograd::any_requires_grad({&input, &target})) {
    SavedTensor sx(x), sy(y), spw(pos_weight);
    autograd::record("BinaryCrossEntropyWithLogitsBackward", {input, target}, {losses},
                     [sx, sy, spw](const TensorList& g) -> TensorList {
                       Tensor xv = sx.unpack("binary_cross_entropy_with_logits");
                       Tensor yv = sy.unpack("binary_cross_entropy_with_logits");
                       Tensor pw = spw.unpack("binary_cross_entropy_with_logits");
                       Tensor s = sigmoid(xv);
                       // d/dx = (1 + (pw - 1) y) s - pw y   (= s - y without pos_weight)
                       // d/dy = -x + (pw - 1) softplus(-x) (= -x without pos_weight)
                       Tensor gx, gy;
                       if (pw.defined()) {
                         Tensor coef = add(mul(yv, sub(pw, 1.0)), 1.0);
                         gx = sub(mul(coef, s), mul(pw, yv));
                         Tensor sp = add(relu(neg(xv)), log1p(exp(neg(abs(xv)))));
                         gy = sub(mul(sub(pw, 1.0), sp), xv);
                       } else {
                         gx = sub(s, yv);
                         gy = neg(xv);
                       }
                       return {mul(g[0], gx), mul(g[0], gy)};
                     });
  }
  return reduce(losses, reduction);
}

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight, Reduction reduction) {
  check_same_shape("binary_cross_entropy", input, target);
  {
    NoGradGuard no_grad;
    if (any(logical_or(lt(input, 0), gt(input, 1))).item<bool>()) {
      fail("binary_cross_entropy: input values must be probabilities in [0, 1] (use binary_cross_entropy_with_logits "
           "for logits)");
    }
  }
  const Tensor log_p = clamp(log(input), -100.0, std::nullopt);
  const Tensor log_1mp = clamp(log(rsub(input, 1.0)), -100.0, std::nullopt);
  Tensor losses = neg(add(mul(target, log_p), mul(rsub(target, 1.0), log_1mp)));
  if (weight.defined()) losses = mul(losses, weight);
  return reduce(losses, reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_same_shape("l1_loss", input, target);
  return reduce(abs(sub(input, target)), reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  check_same_shape("smooth_l1_loss", input, target);
  if (beta < 0) fail("smooth_l1_loss: beta is {}; expected a number >= 0", beta);
  const Tensor d = abs(sub(input, target));
  if (beta == 0) return reduce(d, reduction);
  return reduce(where(lt(d, beta), div(mul(mul(d, d), 0.5), beta), sub(d, 0.5 * beta)), reduction);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  check_same_shape("huber_loss", input, target);
  if (!(delta > 0)) fail("huber_loss: delta is {}; expected a positive number", delta);
  const Tensor d = abs(sub(input, target));
  return reduce(where(le(d, delta), mul(mul(d, d), 0.5), mul(sub(d, 0.5 * delta), delta)), reduction);
}

Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivOptions& options) {
  check_same_shape("kl_div", input, target);
  // target * (log target - input); 0 where target = 0 (0 log 0 = 0), as PyTorch's xlogy.
  Tensor losses = options.log_target
                      ? mul(exp(target), sub(target, input))
                      : where(gt(target, 0), mul(target, sub(log(where(gt(target, 0), target, ones_like(target))), input)),
                              zeros_like(input));
  if (options.batch_mean) {
    if (input.dim() == 0) return sum(losses);
    return div(sum(losses), static_cast<double>(input.size(0)));
  }
  return reduce(losses, options.reduction);
}

Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target, double margin,
                             Reduction reduction) {
  check_same_shape("cosine_embedding_loss", input1, input2);
  ops::check_defined(target, "cosine_embedding_loss", "target");
  if (input1.dim() != 2 || target.dim() != 1 || target.size(0) != input1.size(0)) {
    fail("cosine_embedding_loss: expected inputs [N, D] and target [N], got {}, {} and {}", shape_str(input1.sizes()),
         shape_str(input2.sizes()), shape_str(target.sizes()));
  }
  constexpr double kEps = 1e-12;  // PyTorch's EPSILON in the norms
  const Tensor prod = sum(mul(input1, input2), {1});
  const Tensor n1 = add(sum(mul(input1, input1), {1}), kEps), n2 = add(sum(mul(input2, input2), {1}), kEps);
  const Tensor cos = div(prod, sqrt(mul(n1, n2)));
  const Tensor y = target.to(cos.dtype());
  const Tensor losses = where(eq(y, 1.0), rsub(cos, 1.0),
                              where(eq(y, -1.0), clamp(sub(cos, margin), 0.0, std::nullopt), zeros_like(cos)));
  return reduce(losses, reduction);
}

}  // namespace chorus::nn::functional
