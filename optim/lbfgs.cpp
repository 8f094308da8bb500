#include "optim/lbfgs.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace chorus::optim {
namespace {

double dot_value(const Tensor& a, const Tensor& b) { return dot(a, b).item<double>(); }
double max_abs(const Tensor& t) { return t.abs().amax().item<double>(); }

// The minimizer of the cubic through (x1, f1) and (x2, f2) with slopes g1 and g2, clamped to
// [lo, hi] (by default the interval between x1 and x2); the interval's middle when the cubic has
// no minimizer.
double cubic_minimizer(double x1, double f1, double g1, double x2, double f2, double g2,
                       std::optional<std::pair<double, double>> bounds = std::nullopt) {
  const auto [lo, hi] = bounds ? *bounds : std::pair{std::min(x1, x2), std::max(x1, x2)};
  const double d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2);
  const double d2_square = d1 * d1 - g1 * g2;
  if (d2_square < 0) return (lo + hi) / 2;
  const double d2 = std::sqrt(d2_square);
  const double at = x1 <= x2 ? x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
                             : x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
  return std::min(std::max(at, lo), hi);
}

// A point of the line search: step length, loss, flat gradient, directional derivative.
struct Point {
  double t, f;
  Tensor g;
  double gtd;
};

}  // namespace

Options LBFGSOptions::to_map() const {
  return {{"lr", lr},
          {"max_iter", static_cast<double>(max_iter)},
          {"max_eval", static_cast<double>(max_eval.value_or(max_iter * 5 / 4))},
          {"tolerance_grad", tolerance_grad},
          {"tolerance_change", tolerance_change},
          {"history_size", static_cast<double>(history_size)},
          {"line_search", line_search == LineSearch::StrongWolfe ? 1.0 : 0.0}};
}

LBFGS::LBFGS(const std::vector<Tensor>& params, LBFGSOptions options)
    : Optimizer("LBFGS", single_group(params), options.to_map()) {
  check_options(groups_[0].options);
}

void LBFGS::check_options(const Options& o) const {
  const double lr = o.at("lr");
  if (!(lr >= 0) || !std::isfinite(lr)) fail("LBFGS: invalid learning rate {} (must be finite and >= 0)", lr);
  for (const char* key : {"max_iter", "max_eval", "history_size"}) {
    const double v = o.at(key);
    if (!(v >= 1) || v > 1e12 || v != std::floor(v)) fail("LBFGS: {} is {}, expected a whole number >= 1", key, v);
  }
  for (const char* key : {"tolerance_grad", "tolerance_change"}) {
    const double v = o.at(key);
    if (!(v >= 0) || !std::isfinite(v)) fail("LBFGS: {} is {}, expected a finite number >= 0", key, v);
  }
  const double ls = o.at("line_search");
  if (ls != 0 && ls != 1) fail("LBFGS: line_search is {}, expected 0 (none) or 1 (strong Wolfe)", ls);
}

std::vector<Tensor>& LBFGS::params() {
  if (groups_.size() != 1) {
    fail("LBFGS doesn't support per-parameter options (parameter groups): it has {} groups, expected 1",
         groups_.size());
  }
  return groups_[0].params;
}

Tensor LBFGS::flat_grad() {
  TensorList pieces;
  for (const Tensor& p : params()) {
    pieces.push_back(p.grad().defined() ? p.grad().reshape({-1}) : zeros({p.numel()}, p.options()));
  }
  return cat(pieces, 0);
}

void LBFGS::add_direction(double t, const Tensor& d) {
  int64_t offset = 0;
  for (Tensor& p : params()) {
    const int64_t n = p.numel();
    p.add_(d.narrow(0, offset, n).reshape(p.sizes()), t);
    offset += n;
  }
}

void LBFGS::set_params(const std::vector<Tensor>& values) {
  std::vector<Tensor>& ps = params();
  for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(values[i]);
}

std::pair<double, Tensor> LBFGS::evaluate_at(const Closure& closure, const std::vector<Tensor>& x, double t,
                                             const Tensor& d) {
  add_direction(t, d);
  double loss;
  {
    autograd::EnableGradGuard grad;
    loss = closure().item<double>();
  }
  Tensor g = flat_grad();
  set_params(x);
  return {loss, g};
}

LBFGS::LineSearchResult LBFGS::strong_wolfe(const Closure& closure, const std::vector<Tensor>& x, double t,
                                            const Tensor& d, double loss, const Tensor& grad, double gtd) {
  // Sufficient decrease (c1) and curvature (c2) constants, and the evaluation limit, as PyTorch.
  constexpr double c1 = 1e-4, c2 = 0.9;
  constexpr int max_ls = 25;
  const double tolerance_change = groups_[0].options.at("tolerance_change");
  const double d_norm = max_abs(d);
  auto [f_new, g_new] = evaluate_at(closure, x, t, d);
  int64_t evals = 1;
  double gtd_new = dot_value(g_new, d);

  // Bracketing: find an interval holding a point that satisfies both conditions.
  Point prev{0, loss, grad.clone(), gtd};
  std::vector<Point> bracket;
  bool done = false;
  int ls_iter = 0;
  while (ls_iter < max_ls) {
    if (f_new > loss + c1 * t * gtd || (ls_iter > 1 && f_new >= prev.f)) {
      bracket = {prev, {t, f_new, g_new.clone(), gtd_new}};
      break;
    }
    if (std::abs(gtd_new) <= -c2 * gtd) {
      bracket = {{t, f_new, g_new, gtd_new}};
      done = true;
      break;
    }
    if (gtd_new >= 0) {
      bracket = {prev, {t, f_new, g_new.clone(), gtd_new}};
      break;
    }
    // Extrapolate, between just past t and ten times t.
    const double next = cubic_minimizer(prev.t, prev.f, prev.gtd, t, f_new, gtd_new,
                                        std::pair{t + 0.01 * (t - prev.t), t * 10});
    prev = {t, f_new, g_new.clone(), gtd_new};
    t = next;
    std::tie(f_new, g_new) = evaluate_at(closure, x, t, d);
    ++evals;
    gtd_new = dot_value(g_new, d);
    ++ls_iter;
  }
  if (ls_iter == max_ls) bracket = {{0, loss, grad, gtd}, {t, f_new, g_new, gtd_new}};

  // Zoom: shrink the bracket by cubic interpolation until a point satisfies the conditions.
  bool insufficient_progress = false;
  size_t low = bracket.front().f <= bracket.back().f ? 0 : 1, high = 1 - low;
  while (!done && ls_iter < max_ls) {
    if (std::abs(bracket[1].t - bracket[0].t) * d_norm < tolerance_change) break;
    t = cubic_minimizer(bracket[0].t, bracket[0].f, bracket[0].gtd, bracket[1].t, bracket[1].f, bracket[1].gtd);
    // A point too close to an end of the bracket makes little progress: move it inside, unless the
    // previous point was already too close.
    const double hi_t = std::max(bracket[0].t, bracket[1].t), lo_t = std::min(bracket[0].t, bracket[1].t);
    const double eps = 0.1 * (hi_t - lo_t);
    if (std::min(hi_t - t, t - lo_t) < eps) {
      if (insufficient_progress || t >= hi_t || t <= lo_t) {
        t = std::abs(t - hi_t) < std::abs(t - lo_t) ? hi_t - eps : lo_t + eps;
        insufficient_progress = false;
      } else {
        insufficient_progress = true;
      }
    } else {
      insufficient_progress = false;
    }
    std::tie(f_new, g_new) = evaluate_at(closure, x, t, d);
    ++evals;
    gtd_new = dot_value(g_new, d);
    ++ls_iter;
    if (f_new > loss + c1 * t * gtd || f_new >= bracket[low].f) {
      bracket[high] = {t, f_new, g_new.clone(), gtd_new};
      low = bracket[0].f <= bracket[1].f ? 0 : 1;
      high = 1 - low;
    } else {
      if (std::abs(gtd_new) <= -c2 * gtd) {
        done = true;
      } else if (gtd_new * (bracket[high].t - bracket[low].t) >= 0) {
        bracket[high] = bracket[low];
      }
      bracket[low] = {t, f_new, g_new.clone(), gtd_new};
    }
  }
  const Point& best = bracket[std::min(low, bracket.size() - 1)];
  return {best.f, best.g, best.t, evals};
}

void LBFGS::step() {
  fail("LBFGS.step: needs a closure that recomputes the loss and its gradients (step(closure)); "
       "L-BFGS evaluates the function several times per step");
}

Tensor LBFGS::step(const Closure& closure) {
  if (!closure) fail("LBFGS.step: the closure is empty");
  NoGradGuard no_grad;
  const Options& o = groups_[0].options;
  const double lr = o.at("lr"), tolerance_grad = o.at("tolerance_grad"), tolerance_change = o.at("tolerance_change");
  const auto max_iter = static_cast<int64_t>(o.at("max_iter")), max_eval = static_cast<int64_t>(o.at("max_eval"));
  const auto history_size = static_cast<size_t>(o.at("history_size"));
  const bool line_search = o.at("line_search") != 0;
  params();  // refuses several groups

  Tensor orig_loss;
  {
    autograd::EnableGradGuard grad;
    orig_loss = closure();
  }
  if (!orig_loss.defined() || orig_loss.numel() != 1) {
    fail("LBFGS.step: the closure must return the loss as a one-element tensor, got {}",
         orig_loss.defined() ? shape_str(orig_loss.sizes()) : std::string("an undefined tensor"));
  }
  double loss = orig_loss.item<double>();
  int64_t current_evals = 1;
  ++func_evals_;
  Tensor g = flat_grad();
  if (max_abs(g) <= tolerance_grad) return orig_loss;

  for (int64_t iter = 1; iter <= max_iter; ++iter) {
    ++n_iter_;
    if (n_iter_ == 1) {
      d_ = g.neg();
      old_dirs_.clear();
      old_stps_.clear();
      ro_.clear();
      h_diag_ = 1;
    } else {
      // Update the history with the last step's differences when the curvature is positive.
      const Tensor y = sub(g, prev_flat_grad_);
      const Tensor s = mul(d_, t_);
      const double ys = dot_value(y, s);
      if (ys > 1e-10) {
        if (old_dirs_.size() == history_size) {
          old_dirs_.erase(old_dirs_.begin());
          old_stps_.erase(old_stps_.begin());
          ro_.erase(ro_.begin());
        }
        old_dirs_.push_back(y);
        old_stps_.push_back(s);
        ro_.push_back(1.0 / ys);
        h_diag_ = ys / dot_value(y, y);
      }
      // The two-loop recursion: d = -H g with H the inverse-Hessian estimate of the history.
      const size_t k = old_dirs_.size();
      std::vector<double> al(k);
      Tensor q = g.neg();
      for (size_t i = k; i-- > 0;) {
        al[i] = dot_value(old_stps_[i], q) * ro_[i];
        q.add_(old_dirs_[i], -al[i]);
      }
      Tensor r = mul(q, h_diag_);
      for (size_t i = 0; i < k; ++i) {
        const double be = dot_value(old_dirs_[i], r) * ro_[i];
        r.add_(old_stps_[i], al[i] - be);
      }
      d_ = r;
    }
    prev_flat_grad_ = g.clone();
    prev_loss_ = loss;
    // The first step of all is scaled down by the gradient's size.
    t_ = n_iter_ == 1 ? std::min(1.0, 1.0 / g.abs().sum().item<double>()) * lr : lr;
    const double gtd = dot_value(g, d_);
    if (gtd > -tolerance_change) break;  // not a descent direction

    int64_t ls_evals = 0;
    bool optimal = false;
    if (line_search) {
      std::vector<Tensor> x;
      for (const Tensor& p : params()) x.push_back(p.detach().clone());
      LineSearchResult found = strong_wolfe(closure, x, t_, d_, loss, g, gtd);
      loss = found.loss;
      g = found.grad;
      t_ = found.t;
      ls_evals = found.evals;
      add_direction(t_, d_);
      optimal = max_abs(g) <= tolerance_grad;
    } else {
      add_direction(t_, d_);
      if (iter != max_iter) {
        // Re-evaluate for the next iteration's gradient (skipped after the last, as PyTorch).
        {
          autograd::EnableGradGuard grad;
          loss = closure().item<double>();
        }
        g = flat_grad();
        optimal = max_abs(g) <= tolerance_grad;
        ls_evals = 1;
      }
    }
    current_evals += ls_evals;
    func_evals_ += ls_evals;
    if (iter == max_iter || current_evals >= max_eval || optimal) break;
    if (max_abs(d_) * std::abs(t_) <= tolerance_change) break;  // the step is too small
    if (std::abs(loss - prev_loss_) < tolerance_change) break;  // the loss no longer changes
  }
  return orig_loss;
}

NamedTensors LBFGS::state_dict() const {
  NamedTensors out = Optimizer::state_dict();
  auto scalar = [](double v) { return full({}, v, TensorOptions{.dtype = kFloat64}); };
  // Snapshots in host memory (as Optimizer::state_dict's buffers), not second copies on the device.
  auto host = [](const Tensor& t) { return t.device().is_cpu() ? t.clone() : t.cpu(); };
  out.emplace_back("lbfgs.func_evals", scalar(static_cast<double>(func_evals_)));
  out.emplace_back("lbfgs.n_iter", scalar(static_cast<double>(n_iter_)));
  if (n_iter_ == 0) return out;
  out.emplace_back("lbfgs.d", host(d_));
  out.emplace_back("lbfgs.t", scalar(t_));
  out.emplace_back("lbfgs.H_diag", scalar(h_diag_));
  out.emplace_back("lbfgs.prev_flat_grad", host(prev_flat_grad_));
  out.emplace_back("lbfgs.prev_loss", scalar(prev_loss_));
  const int64_t n = d_.numel(), k = static_cast<int64_t>(old_dirs_.size());
  out.emplace_back("lbfgs.old_dirs", k ? stack(old_dirs_, 0).cpu() : zeros({0, n}, {.dtype = d_.dtype()}));
  out.emplace_back("lbfgs.old_stps", k ? stack(old_stps_, 0).cpu() : zeros({0, n}, {.dtype = d_.dtype()}));
  Tensor ro = zeros({k}, TensorOptions{.dtype = kFloat64});
  for (int64_t i = 0; i < k; ++i) ro.data_ptr<double>()[i] = ro_[static_cast<size_t>(i)];
  out.emplace_back("lbfgs.ro", ro);
  return out;
}

void LBFGS::load_state_dict(const NamedTensors& state) {
  NamedTensors rest;
  std::map<std::string, Tensor> mine;
  for (const auto& [name, t] : state) {
    if (name.rfind("lbfgs.", 0) == 0) {
      if (!mine.emplace(name.substr(6), t).second) fail("LBFGS.load_state_dict: '{}' appears twice", name);
    } else {
      rest.emplace_back(name, t);
    }
  }
  auto take = [&](const std::string& key) -> const Tensor& {
    auto it = mine.find(key);
    if (it == mine.end()) fail("LBFGS.load_state_dict: the state has no 'lbfgs.{}'", key);
    return it->second;
  };
  auto count = [&](const std::string& key) {
    const Tensor& t = take(key);
    const double v = t.numel() == 1 ? t.item<double>() : -1;
    if (t.numel() != 1 || !(v >= 0) || v > 1e15 || v != std::floor(v)) {
      fail("LBFGS.load_state_dict: 'lbfgs.{}' should be a whole number >= 0", key);
    }
    return static_cast<int64_t>(v);
  };
  auto finite_scalar = [&](const std::string& key) {
    const Tensor& t = take(key);
    if (t.numel() != 1 || !std::isfinite(t.item<double>())) {
      fail("LBFGS.load_state_dict: 'lbfgs.{}' should be one finite number", key);
    }
    return t.item<double>();
  };
  // The options first (the base class checks them), then the iteration state against them; nothing
  // changes until all of it has been checked.
  LoadedState base = read_state_dict(rest);
  const int64_t func_evals = count("func_evals"), n_iter = count("n_iter");
  int64_t n = 0;
  for (const Tensor& p : params()) n += p.numel();
  const TensorOptions like = params()[0].options();
  auto vector = [&](const std::string& key) {
    const Tensor& t = take(key);
    if (t.dim() != 1 || t.size(0) != n) {
      fail("LBFGS.load_state_dict: 'lbfgs.{}' has shape {}, expected [{}] (the parameters' total size)", key,
           shape_str(t.sizes()), n);
    }
    return t.to(like.dtype).to(like.device).clone();
  };
  std::vector<Tensor> dirs, stps;
  std::vector<double> ro;
  Tensor d, prev_grad;
  double t = 0, h_diag = 1, prev_loss = 0;
  if (n_iter > 0) {
    d = vector("d");
    prev_grad = vector("prev_flat_grad");
    t = finite_scalar("t");
    h_diag = finite_scalar("H_diag");
    prev_loss = finite_scalar("prev_loss");
    const Tensor& od = take("old_dirs");
    const Tensor& os = take("old_stps");
    const Tensor& r = take("ro");
    const auto history = static_cast<int64_t>(base.options[0].at("history_size"));
    if (od.dim() != 2 || od.size(1) != n || od.size(0) > history || os.sizes() != od.sizes() || r.dim() != 1 ||
        r.size(0) != od.size(0)) {
      fail("LBFGS.load_state_dict: the history has old_dirs {}, old_stps {} and ro {}; expected [k, {}], [k, {}] "
           "and [k] with k <= history_size {}",
           shape_str(od.sizes()), shape_str(os.sizes()), shape_str(r.sizes()), n, n, history);
    }
    const Tensor rd = r.cpu().to(kFloat64).contiguous();
    for (int64_t i = 0; i < od.size(0); ++i) {
      dirs.push_back(od.select(0, i).to(like.dtype).to(like.device).clone());
      stps.push_back(os.select(0, i).to(like.dtype).to(like.device).clone());
      ro.push_back(rd.data_ptr<double>()[i]);
    }
  }
  apply_state_dict(std::move(base));
  d_ = d;
  prev_flat_grad_ = prev_grad;
  t_ = t;
  h_diag_ = h_diag;
  prev_loss_ = prev_loss;
  old_dirs_ = std::move(dirs);
  old_stps_ = std::move(stps);
  ro_ = std::move(ro);
  func_evals_ = func_evals;
  n_iter_ = n_iter;
}

}  // namespace chorus::optim
