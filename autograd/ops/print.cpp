// operator<< in PyTorch's format: tensor([[ 1.0000, -2.5000], ...]) with a shared width, integers
// printed as "1." when every float is whole, scientific notation for wide ranges, "..." past 1000
// elements, and dtype / requires_grad / grad_fn suffixes.
#include <cmath>
#include <ostream>
#include <sstream>

#include "autograd/node.h"
#include "autograd/ops/common.h"

namespace chorus {
namespace {

constexpr int64_t kSummarizeThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  bool floating = false, is_bool = false, int_mode = false, sci_mode = false;
  size_t width = 1;

  std::string format(double v) const {
    if (is_bool) return v != 0 ? "True" : "False";
    if (!floating) return fmt::format("{}", static_cast<int64_t>(v));
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (int_mode) return fmt::format("{:.0f}.", v);
    if (sci_mode) return fmt::format("{:.4e}", v);
    return fmt::format("{:.4f}", v);
  }
};

Formatter make_formatter(const std::vector<double>& values, DType dtype) {
  Formatter f;
  f.is_bool = dtype == kBool;
  f.floating = is_floating(dtype);
  if (f.floating) {
    std::vector<double> finite;
    for (double v : values) if (std::isfinite(v)) finite.push_back(v);
    f.int_mode = true;
    for (double v : finite) if (v != std::ceil(v)) { f.int_mode = false; break; }
    if (!finite.empty()) {
      double mx = 0, mn = INFINITY;
      for (double v : finite) { mx = std::max(mx, std::abs(v)); if (v != 0) mn = std::min(mn, std::abs(v)); }
      if (mn == INFINITY) mn = 0;
      if (f.int_mode) f.sci_mode = mx > 1e8;
      else f.sci_mode = mx > 1e8 || (mn > 0 && (mn < 1e-4 || mx / mn > 1000.0));
    }
  }
  for (double v : values) f.width = std::max(f.width, f.format(v).size());
  return f;
}

// Collects the printed elements (with summarization) as doubles.
void collect(const Tensor& t, bool summarize, std::vector<double>& out) {
  if (t.dim() == 0) {
    out.push_back(t.item().to_double());
    return;
  }
  const int64_t n = t.size(0);
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) i = n - kEdgeItems;
    collect(t.select(0, i), summarize, out);
  }
}

void render(std::ostream& os, const Tensor& t, const Formatter& f, bool summarize, int indent) {
  if (t.dim() == 0) {
    std::string s = f.format(t.item().to_double());
    os << std::string(f.width - s.size(), ' ') << s;
    return;
  }
  const int64_t n = t.size(0);
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      if (t.dim() == 1) os << "..., ";
      else os << "...,\n" << std::string(indent + 1, ' ');
      i = n - kEdgeItems;
    }
    render(os, t.select(0, i), f, summarize, indent + 1);
    if (i + 1 < n) {
      if (t.dim() == 1) os << ", ";
      else os << ',' << std::string(t.dim() - 1, '\n') << std::string(indent + 1, ' ');
    }
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& input) {
  if (!input.defined()) return os << "[ undefined tensor ]";
  autograd::NoGradGuard guard;
  Tensor t = alias_without_history(input);
  if (!t.device().is_cpu()) t = t.to(kCPU);
  const bool summarize = t.numel() > kSummarizeThreshold;
  std::vector<double> values;
  if (t.numel() > 0) collect(t, summarize, values);
  Formatter f = make_formatter(values, t.dtype());
  std::ostringstream body;
  const std::string prefix = "tensor(";
  if (t.numel() == 0 && t.dim() > 0) body << "[]";
  else render(body, t, f, summarize, static_cast<int>(prefix.size()));
  os << prefix << body.str();
  std::vector<std::string> suffix;
  if (t.numel() == 0 && t.dim() > 1) suffix.push_back(fmt::format("size={}", shape_str(t.sizes())));
  if (t.dtype() != kFloat32 && t.dtype() != kInt64 && t.dtype() != kBool) {
    suffix.push_back(fmt::format("dtype={}", dtype_name(t.dtype())));
  }
  if (!input.device().is_cpu()) suffix.push_back(fmt::format("device='{}'", input.device().str()));
  if (input.grad_fn()) suffix.push_back(fmt::format("grad_fn=<{}>", input.grad_fn()->name()));
  else if (input.requires_grad()) suffix.push_back("requires_grad=True");
  for (const std::string& s : suffix) os << ", " << s;
  return os << ')';
}

std::string Tensor::str() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

}  // namespace chorus
