// einsum as a composite: the equation becomes integer labels per operand dim; a label repeated
// within an operand takes the diagonal (a gather over the flattened pair); labels no later operand
// or the output needs are summed as early as possible; operands are then contracted left to right,
// each step one bmm over [shared-and-kept labels] x [left-only] x [summed] by [summed] x
// [right-only]; the result is permuted into the output's order. Every piece is a differentiable op,
// so the backward and every device come for free. No contraction-order search (PyTorch's opt_einsum
// path): left to right is optimal for two operands, the common case.
#include <algorithm>
#include <map>
#include <numeric>

#include "autograd/ops/common.h"

namespace chorus {
namespace {

using namespace ops;

// Letters: 'A'-'Z' are 0-25 and 'a'-'z' 26-51, so sorting by label sorts an implicit output as
// PyTorch does (upper case first). The broadcast dims of "..." are 52, 53, ... counted from the
// left of the widest ellipsis, so operands with fewer such dims align on the right.
constexpr int kLetters = 52;

struct Term {
  std::vector<int> labels;  // letters; -1 where the ellipsis stands
  bool has_ellipsis = false;
};

char label_char(int label) {
  return label < 26 ? static_cast<char>('A' + label) : static_cast<char>('a' + (label - 26));
}

std::string label_name(int label) {
  return label < kLetters ? std::string(1, label_char(label)) : fmt::format("...[{}]", label - kLetters);
}

Term parse_term(const std::string& eq, size_t begin, size_t end, const char* where) {
  Term t;
  for (size_t i = begin; i < end; ++i) {
    const char ch = eq[i];
    if (ch >= 'A' && ch <= 'Z') {
      t.labels.push_back(ch - 'A');
    } else if (ch >= 'a' && ch <= 'z') {
      t.labels.push_back(26 + (ch - 'a'));
    } else if (ch == '.') {
      if (i + 3 > end || eq.compare(i, 3, "...") != 0) {
        fail("einsum: '.' at position {} of \"{}\" is not part of an ellipsis \"...\"", i, eq);
      }
      if (t.has_ellipsis) fail("einsum: the {} of \"{}\" has more than one ellipsis \"...\"", where, eq);
      t.has_ellipsis = true;
      t.labels.push_back(-1);
      i += 2;
    } else {
      fail("einsum: invalid character '{}' at position {} of \"{}\" (subscripts are letters a-z, A-Z and \"...\")", ch,
           i, eq);
    }
  }
  return t;
}

// The operand's labels with the ellipsis expanded into `ell` broadcast labels.
std::vector<int> expand_ellipsis(const Term& t, int64_t ell, int64_t max_ell) {
  std::vector<int> out;
  for (int l : t.labels) {
    if (l >= 0) {
      out.push_back(l);
      continue;
    }
    for (int64_t k = max_ell - ell; k < max_ell; ++k) out.push_back(kLetters + static_cast<int>(k));
  }
  return out;
}

// An operand in flight: a tensor and one label per dim.
struct Labeled {
  Tensor t;
  std::vector<int> labels;
};

int64_t position(const std::vector<int>& labels, int l) {
  return std::find(labels.begin(), labels.end(), l) - labels.begin();
}

bool contains(const std::vector<int>& labels, int l) { return std::find(labels.begin(), labels.end(), l) != labels.end(); }

// Takes the diagonal of every label that appears twice or more: dims a and b of size n are moved to
// the end, flattened to n*n, and elements 0, n+1, 2(n+1), ... gathered.
Labeled take_diagonals(Labeled x) {
  for (;;) {
    int64_t a = -1, b = -1;
    for (size_t i = 0; i < x.labels.size() && a < 0; ++i) {
      for (size_t j = i + 1; j < x.labels.size(); ++j) {
        if (x.labels[i] == x.labels[j]) {
          a = static_cast<int64_t>(i);
          b = static_cast<int64_t>(j);
          break;
        }
      }
    }
    if (a < 0) return x;
    const int64_t n = x.t.size(a);
    std::vector<int64_t> perm;
    std::vector<int> labels;
    for (int64_t d = 0; d < x.t.dim(); ++d) {
      if (d != a && d != b) {
        perm.push_back(d);
        labels.push_back(x.labels[static_cast<size_t>(d)]);
      }
    }
    labels.push_back(x.labels[static_cast<size_t>(a)]);
    perm.push_back(a);
    perm.push_back(b);
    Shape flat(x.t.sizes().size() - 1);
    for (size_t i = 0; i + 2 < perm.size(); ++i) flat[i] = x.t.size(perm[i]);
    flat.back() = n * n;
    Tensor moved = reshape(permute(x.t, perm), flat);
    Tensor diag_index = arange(0, std::max<int64_t>(n * n, 1), n + 1, TensorOptions{.dtype = kInt64, .device = x.t.device()});
    x.t = index_select(moved, -1, narrow(diag_index, 0, 0, n));
    x.labels = labels;
  }
}

// Sums the dims whose label is not in `keep`.
Labeled sum_unneeded(Labeled x, const std::vector<int>& keep) {
  std::vector<int64_t> dims;
  std::vector<int> labels;
  for (size_t d = 0; d < x.labels.size(); ++d) {
    if (contains(keep, x.labels[d])) labels.push_back(x.labels[d]);
    else dims.push_back(static_cast<int64_t>(d));
  }
  if (dims.empty()) return x;
  return {sum(x.t, dims), labels};
}

// Permutes x's dims into the order of `order` (a permutation of x's labels).
Tensor arrange(const Labeled& x, const std::vector<int>& order) {
  std::vector<int64_t> perm;
  for (int l : order) perm.push_back(position(x.labels, l));
  return permute(x.t, perm);
}

int64_t product(const std::map<int, int64_t>& size, const std::vector<int>& labels) {
  int64_t p = 1;
  for (int l : labels) p *= size.at(l);
  return p;
}

Labeled contract(const Labeled& a, const Labeled& b, const std::vector<int>& needed_later,
                 const std::map<int, int64_t>& size) {
  std::vector<int> batch, summed, a_only, b_only;
  for (int l : a.labels) {
    if (!contains(b.labels, l)) a_only.push_back(l);
    else if (contains(needed_later, l)) batch.push_back(l);
    else summed.push_back(l);
  }
  for (int l : b.labels) if (!contains(a.labels, l)) b_only.push_back(l);
  std::vector<int> a_order = batch, b_order = batch;
  a_order.insert(a_order.end(), a_only.begin(), a_only.end());
  a_order.insert(a_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), b_only.begin(), b_only.end());
  const int64_t nb = product(size, batch), m = product(size, a_only), k = product(size, summed), n = product(size, b_only);
  Tensor out = bmm(reshape(arrange(a, a_order), {nb, m, k}), reshape(arrange(b, b_order), {nb, k, n}));
  std::vector<int> labels = batch;
  labels.insert(labels.end(), a_only.begin(), a_only.end());
  labels.insert(labels.end(), b_only.begin(), b_only.end());
  Shape shape;
  for (int l : labels) shape.push_back(size.at(l));
  return {reshape(out, shape), labels};
}

}  // namespace

Tensor einsum(const std::string& equation, const TensorList& operands) {
  std::string eq;
  for (char ch : equation) if (ch != ' ') eq.push_back(ch);
  if (operands.empty()) fail("einsum: expected at least one operand for \"{}\"", equation);
  for (size_t i = 0; i < operands.size(); ++i) {
    if (!operands[i].defined()) fail("einsum: operand {} is an undefined tensor", i);
    if (operands[i].dtype() != operands[0].dtype()) {
      fail("einsum: operands must share a dtype, got {} (operand 0) and {} (operand {})",
           dtype_name(operands[0].dtype()), dtype_name(operands[i].dtype()), i);
    }
    check_same_device(operands[0], operands[i], "einsum");
  }
  const size_t arrow = eq.find("->");
  if (arrow != std::string::npos && eq.find("->", arrow + 2) != std::string::npos) {
    fail("einsum: \"{}\" has more than one \"->\"", equation);
  }
  const size_t lhs_end = arrow == std::string::npos ? eq.size() : arrow;
  std::vector<Term> terms;
  for (size_t begin = 0;;) {
    const size_t comma = eq.find(',', begin);
    const size_t end = comma == std::string::npos || comma > lhs_end ? lhs_end : comma;
    terms.push_back(parse_term(eq, begin, end, "input subscripts"));
    if (end == lhs_end) break;
    begin = end + 1;
  }
  if (terms.size() != operands.size()) {
    fail("einsum: \"{}\" has subscripts for {} operand(s), but {} were given", equation, terms.size(), operands.size());
  }
  // The dims each ellipsis stands for, and the widest.
  int64_t max_ell = 0;
  std::vector<int64_t> ell(terms.size(), 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    const int64_t named = static_cast<int64_t>(terms[i].labels.size()) - (terms[i].has_ellipsis ? 1 : 0);
    const int64_t dims = operands[i].dim();
    if (terms[i].has_ellipsis ? dims < named : dims != named) {
      fail("einsum: operand {} has {} dims (shape {}), but its subscripts in \"{}\" name {}{}", i, dims,
           shape_str(operands[i].sizes()), equation, named, terms[i].has_ellipsis ? " or more" : "");
    }
    ell[i] = terms[i].has_ellipsis ? dims - named : 0;
    max_ell = std::max(max_ell, ell[i]);
  }
  // Each label's size; size-1 dims broadcast against the others.
  std::vector<Labeled> xs;
  std::map<int, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i) {
    Labeled x{operands[i], expand_ellipsis(terms[i], ell[i], max_ell)};
    // Within one operand a repeated label must match exactly: it takes a diagonal, it does not broadcast.
    std::map<int, int64_t> own;
    for (size_t d = 0; d < x.labels.size(); ++d) {
      const int64_t s = x.t.size(static_cast<int64_t>(d));
      auto [it, fresh] = own.emplace(x.labels[d], s);
      if (!fresh && it->second != s) {
        fail("einsum: subscript '{}' repeated in operand {} must index dims of one size, got {} and {} (shape {})",
             label_name(x.labels[d]), i, it->second, s, shape_str(operands[i].sizes()));
      }
    }
    for (size_t d = 0; d < x.labels.size(); ++d) {
      const int l = x.labels[d];
      const int64_t s = x.t.size(static_cast<int64_t>(d));
      auto [it, fresh] = size.emplace(l, s);
      if (fresh || it->second == s || s == 1) continue;
      if (it->second == 1) {
        it->second = s;
        continue;
      }
      fail("einsum: subscript '{}' has size {} in operand {} (shape {}) but size {} elsewhere in \"{}\"", label_name(l),
           s, i, shape_str(operands[i].sizes()), it->second, equation);
    }
    xs.push_back(std::move(x));
  }
  std::vector<int> output;
  if (arrow != std::string::npos) {
    const Term out = parse_term(eq, arrow + 2, eq.size(), "output subscripts");
    for (int l : out.labels) {
      if (l < 0) {
        for (int64_t k = 0; k < max_ell; ++k) output.push_back(kLetters + static_cast<int>(k));
        continue;
      }
      if (contains(output, l)) fail("einsum: output subscript '{}' appears more than once in \"{}\"", label_char(l), equation);
      if (!size.count(l)) {
        fail("einsum: output subscript '{}' of \"{}\" does not appear in any input", label_char(l), equation);
      }
      output.push_back(l);
    }
  } else {
    for (int64_t k = 0; k < max_ell; ++k) output.push_back(kLetters + static_cast<int>(k));
    std::map<int, int> uses;
    for (const Labeled& x : xs) for (int l : x.labels) if (l < kLetters) ++uses[l];
    for (const auto& [l, count] : uses) if (count == 1) output.push_back(l);
  }
  // Broadcast size-1 dims up to their label's size, so every later reshape sees one size per label.
  for (Labeled& x : xs) {
    Shape target = x.t.sizes();
    for (size_t d = 0; d < x.labels.size(); ++d) target[d] = size.at(x.labels[d]);
    if (target != x.t.sizes()) x.t = expand(x.t, target);
    x = take_diagonals(std::move(x));
  }
  // Labels needed at or after operand i: the output's and those of operands i.. onwards.
  auto needed_from = [&](size_t i) {
    std::vector<int> keep = output;
    for (size_t j = i; j < xs.size(); ++j) keep.insert(keep.end(), xs[j].labels.begin(), xs[j].labels.end());
    return keep;
  };
  Labeled acc = sum_unneeded(xs[0], needed_from(1));
  for (size_t i = 1; i < xs.size(); ++i) {
    const std::vector<int> later = needed_from(i + 1);
    std::vector<int> keep_b = later, keep_acc = later;
    keep_b.insert(keep_b.end(), acc.labels.begin(), acc.labels.end());
    keep_acc.insert(keep_acc.end(), xs[i].labels.begin(), xs[i].labels.end());
    acc = contract(sum_unneeded(acc, keep_acc), sum_unneeded(xs[i], keep_b), later, size);
  }
  acc = sum_unneeded(acc, output);
  return arrange(acc, output).contiguous();
}

}  // namespace chorus
