// Matrix products with PyTorch semantics: mm, bmm, addmm as kernels with backward formulas, and
// matmul composed from them (1-D promotion, batch broadcasting) so its gradient follows for free;
// off CUDA, matmul's batched case has a node of its own that reads strided batches in place
// ([Batched products of strided views] below).
#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "autograd/ops/linalg.h"

#include "autograd/ops/common.h"

namespace chorus {
namespace {

using namespace ops;

void check_matmul_args(const char* name, const Tensor& a, const Tensor& b) {
  check_defined(a, name, "input");
  check_defined(b, name, "mat2");
  check_same_device(a, b, name);
  check_kernels(a, name);
  if (a.dtype() != b.dtype()) {
    fail("{}: expected both operands to have the same dtype, got {} (shape {}) and {} (shape {})", name,
         dtype_name(a.dtype()), shape_str(a.sizes()), dtype_name(b.dtype()), shape_str(b.sizes()));
  }
  if (a.dtype() == kBool) fail("{}: not implemented for bool tensors", name);
}

}  // namespace

namespace {

// Gradients laid out like their inputs (PyTorch's mm_mat1/mat2_backward): a transposed view
// (weight.t() inside linear) gets its gradient computed as (g^T a)^T, so after the t() backward
// the parameter's gradient is contiguous and AccumulateGrad can keep it without a strided copy.
bool is_transposed_2d(const Tensor& t) {
  return t.dim() == 2 && t.size(0) > 1 && t.size(1) > 1 && t.stride(0) == 1 && t.stride(1) == t.size(0);
}
Tensor mat2_grad(const Tensor& mat1, const Tensor& g, bool mat2_transposed) {
  return mat2_transposed ? t(mm(t(g), mat1)) : mm(t(mat1), g);
}
Tensor mat1_grad(const Tensor& g, const Tensor& mat2, bool mat1_transposed) {
  return mat1_transposed ? t(mm(mat2, t(g))) : mm(g, t(mat2));
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  if (auto low = autocast::lower_precision({&a, &b})) return mm(autocast::cast(a, *low), autocast::cast(b, *low));
  check_matmul_args("mm", a, b);
  if (a.dim() != 2 || b.dim() != 2) {
    fail("mm: expected 2-D tensors, got shapes {} and {}", shape_str(a.sizes()), shape_str(b.sizes()));
  }
  if (a.size(1) != b.size(0)) {
    fail("mm: mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})", a.size(0), a.size(1), b.size(0), b.size(1));
  }
  const DType cd = product_dtype(a);
  Tensor out = new_output({a.size(0), b.size(1)}, cd, a.device());
  kernels::gemm(out, cast(a, cd), cast(b, cd), 1.0, 0.0);
  out = cast(out, a.dtype());
  if (autograd::any_requires_grad({&a, &b})) {
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(a.requires_grad() ? b : Tensor());
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    const bool a_t = is_transposed_2d(a), b_t = is_transposed_2d(b);
    autograd::record("MmBackward", {a, b}, {out}, [sa, sb, need_a, need_b, a_t, b_t](const TensorList& g) -> TensorList {
      return {need_a ? mat1_grad(g[0], sb.unpack("mm"), a_t) : Tensor(),
              need_b ? mat2_grad(sa.unpack("mm"), g[0], b_t) : Tensor()};
    });
  }
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (auto low = autocast::lower_precision({&a, &b})) return bmm(autocast::cast(a, *low), autocast::cast(b, *low));
  check_matmul_args("bmm", a, b);
  if (a.dim() != 3 || b.dim() != 3) {
    fail("bmm: expected 3-D tensors, got shapes {} and {}", shape_str(a.sizes()), shape_str(b.sizes()));
  }
  if (a.size(0) != b.size(0) || a.size(2) != b.size(1)) {
    fail("bmm: expected shapes [b, n, m] and [b, m, p], got {} and {}", shape_str(a.sizes()), shape_str(b.sizes()));
  }
  const DType cd = product_dtype(a);
  Tensor out = new_output({a.size(0), a.size(1), b.size(2)}, cd, a.device());
  kernels::bmm(out, cast(a, cd), cast(b, cd));
  out = cast(out, a.dtype());
  if (autograd::any_requires_grad({&a, &b})) {
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(a.requires_grad() ? b : Tensor());
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record("BmmBackward", {a, b}, {out}, [sa, sb, need_a, need_b](const TensorList& g) -> TensorList {
      return {need_a ? bmm(g[0], transpose(sb.unpack("bmm"), 1, 2)) : Tensor(),
              need_b ? bmm(transpose(sa.unpack("bmm"), 1, 2), g[0]) : Tensor()};
    });
  }
  return out;
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, const Scalar& beta, const Scalar& alpha) {
  if (auto low = autocast::lower_precision({&a, &b, &bias})) {
    return addmm(autocast::cast(bias, *low), autocast::cast(a, *low), autocast::cast(b, *low), beta, alpha);
  }
  check_matmul_args("addmm", a, b);
  check_defined(bias, "addmm", "self");
  if (a.dim() != 2 || b.dim() != 2) {
    fail("addmm: expected 2-D matrices, got shapes {} and {}", shape_str(a.sizes()), shape_str(b.sizes()));
  }
  if (a.size(1) != b.size(0)) {
    fail("addmm: mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})", a.size(0), a.size(1), b.size(0), b.size(1));
  }
  const Shape out_shape{a.size(0), b.size(1)};
  if (!is_expandable_to(bias.sizes(), out_shape)) {
    fail("addmm: bias of shape {} cannot be broadcast to the product's shape {}", shape_str(bias.sizes()), shape_str(out_shape));
  }
  if (bias.dtype() != a.dtype()) {
    fail("addmm: bias has dtype {} but the matrices have {}", dtype_name(bias.dtype()), dtype_name(a.dtype()));
  }
  const DType cd = product_dtype(a);
  Tensor out = new_output(out_shape, cd, a.device());
  const double beta_v = beta.to_double();
  if (beta_v != 0.0) kernels::copy(out, cast(bias, cd));
  kernels::gemm(out, cast(a, cd), cast(b, cd), alpha.to_double(), beta_v);
  out = cast(out, a.dtype());
  if (autograd::any_requires_grad({&bias, &a, &b})) {
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(a.requires_grad() ? b : Tensor());
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    const double alpha_v = alpha.to_double();
    const bool a_t = is_transposed_2d(a), b_t = is_transposed_2d(b);
    autograd::record("AddmmBackward", {bias, a, b}, {out},
                     [sa, sb, need_a, need_b, alpha_v, beta_v, a_t, b_t](const TensorList& g) -> TensorList {
                       Tensor gs = alpha_v == 1.0 ? g[0] : mul(g[0], alpha_v);
                       return {beta_v == 1.0 ? g[0] : mul(g[0], beta_v),
                               need_a ? mat1_grad(gs, sb.unpack("addmm"), a_t) : Tensor(),
                               need_b ? mat2_grad(sa.unpack("addmm"), gs, b_t) : Tensor()};
                     });
  }
  return out;
}

namespace {

// [Batched products of strided views] On the CPU, matmul multiplies batches whose batch dims no
// single stride describes (attention's heads: q [B, T, H, d] permuted to [B, H, T, d] has batch
// strides T*H*d and d) in place, instead of copying them into [B*H, T, d] as PyTorch's matmul does:
// the batch dims split into an outer part looped over here and the longest inner run one stride
// describes for a, b and the output, which kernels::bmm takes as strided 3-D views (the CPU GEMM
// reads any matrix with a unit stride in place). Gradients come out laid out like their inputs, so
// the gradient of a permuted projection permutes back to a contiguous one and the reshape before
// the projection's backward is a view. sim does the same: its kernels are the CPU's, and its tests
// hold it to the CPU's bits. On CUDA one strided-batched call over copies costs less than a launch
// per outer index (BERT-base b32: 32 launches a product), so CUDA keeps matmul's reshape and bmm,
// whose pieces sim tests on their own.

Tensor restrided(const Tensor& t, const Shape& sizes, const Strides& strides, int64_t offset) {
  return Tensor(std::make_shared<TensorImpl>(t.storage(), t.storage_offset() + offset, sizes, strides, t.dtype()));
}

// c[batch..., n, p] = a[batch..., n, m] @ b[batch..., m, p], all three with one batch shape.
void batched_product_kernel(const Tensor& c, const Tensor& a, const Tensor& b) {
  if (c.numel() == 0) return;
  const int64_t nd = c.dim() - 2;
  const std::array<const Tensor*, 3> ts = {&c, &a, &b};
  // Merge batch dims from the innermost outwards while each tensor's stride steps over the run
  // merged so far; size-1 dims merge with anything.
  int64_t split = nd, inner = 1;
  std::array<int64_t, 3> inner_stride = {0, 0, 0};
  for (int64_t d = nd - 1; d >= 0; --d) {
    const int64_t size = c.size(d);
    if (size != 1) {
      if (inner == 1) {
        for (int i = 0; i < 3; ++i) inner_stride[i] = ts[i]->stride(d);
      } else {
        bool merges = true;
        for (int i = 0; i < 3; ++i) merges = merges && ts[i]->stride(d) == inner_stride[i] * inner;
        if (!merges) break;
      }
      inner *= size;
    }
    split = d;
  }
  auto view3 = [&](int i, int64_t offset) {
    const Tensor& t = *ts[i];
    return restrided(t, {inner, t.size(-2), t.size(-1)}, {inner_stride[i], t.stride(-2), t.stride(-1)}, offset);
  };
  // The outer dims [0, split), walked as a counter.
  std::vector<int64_t> index(static_cast<size_t>(split), 0);
  std::array<int64_t, 3> offsets = {0, 0, 0};
  while (true) {
    kernels::bmm(view3(0, offsets[0]), view3(1, offsets[1]), view3(2, offsets[2]));
    int64_t d = split - 1;
    for (; d >= 0; --d) {
      for (int i = 0; i < 3; ++i) offsets[i] += ts[i]->stride(d);
      if (++index[d] < c.size(d)) break;
      for (int i = 0; i < 3; ++i) offsets[i] -= ts[i]->stride(d) * c.size(d);
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// A tensor's sizes and strides, without its storage (the layout a gradient takes).
struct Geometry {
  Shape sizes;
  Strides strides;
};

// a [batch..., n, m] @ b [batch..., m, p] with one batch shape (expanded already), not on CUDA; the
// result is laid out like `layout` when given (a gradient like its input), else contiguous.
Tensor strided_batched_matmul(const Tensor& a, const Tensor& b, const std::optional<Geometry>& layout) {
  const DType cd = product_dtype(a);
  Shape out_shape(a.sizes().begin(), a.sizes().end() - 1);
  out_shape.push_back(b.size(-1));
  Tensor out = layout ? new_output_like(layout->sizes, layout->strides, cd, a.device()) : new_output(out_shape, cd, a.device());
  CHORUS_CHECK(out.sizes() == out_shape, "matmul: a gradient's layout has shape {}, expected {}",
               shape_str(out.sizes()), shape_str(out_shape));
  batched_product_kernel(out, cast(a, cd), cast(b, cd));
  out = cast(out, a.dtype());
  if (autograd::any_requires_grad({&a, &b})) {
    SavedTensor sa(b.requires_grad() ? a : Tensor()), sb(a.requires_grad() ? b : Tensor());
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Geometry ga{a.sizes(), a.strides()}, gb{b.sizes(), b.strides()};
    autograd::record("MatmulBackward", {a, b}, {out}, [sa, sb, need_a, need_b, ga, gb](const TensorList& g) -> TensorList {
      return {need_a ? strided_batched_matmul(g[0], sb.unpack("matmul").transpose(-2, -1), ga) : Tensor(),
              need_b ? strided_batched_matmul(sa.unpack("matmul").transpose(-2, -1), g[0], gb) : Tensor()};
    });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto low = autocast::lower_precision({&a, &b})) return matmul(autocast::cast(a, *low), autocast::cast(b, *low));
  check_matmul_args("matmul", a, b);
  const int64_t da = a.dim(), db = b.dim();
  if (da == 0 || db == 0) {
    fail("matmul: both arguments need at least 1 dimension, got shapes {} and {}", shape_str(a.sizes()), shape_str(b.sizes()));
  }
  auto inner_mismatch = [&](int64_t ka, int64_t kb) {
    if (ka != kb) {
      fail("matmul: shapes {} and {} cannot be multiplied (inner sizes {} and {} differ)", shape_str(a.sizes()),
           shape_str(b.sizes()), ka, kb);
    }
  };
  if (da == 1 && db == 1) {
    inner_mismatch(a.size(0), b.size(0));
    return reshape(mm(reshape(a, {1, -1}), reshape(b, {-1, 1})), {});
  }
  if (da == 2 && db == 1) {
    inner_mismatch(a.size(1), b.size(0));
    return reshape(mm(a, unsqueeze(b, 1)), {a.size(0)});
  }
  if (da == 1 && db == 2) {
    inner_mismatch(a.size(0), b.size(0));
    return reshape(mm(unsqueeze(a, 0), b), {b.size(1)});
  }
  if (da == 2 && db == 2) return mm(a, b);
  // Batched. A 2-D (or 1-D) right operand folds the batch into the rows: one large GEMM.
  if (db <= 2) {
    Tensor bb = db == 1 ? unsqueeze(b, 1) : b;
    inner_mismatch(a.size(-1), bb.size(0));
    Shape out_shape(a.sizes().begin(), a.sizes().end() - 1);
    if (db == 2) out_shape.push_back(bb.size(1));
    Tensor flat = mm(reshape(a, {-1, a.size(-1)}), bb);
    return reshape(flat, out_shape);
  }
  Tensor aa = da == 1 ? unsqueeze(a, 0) : a;
  inner_mismatch(aa.size(-1), b.size(-2));
  const int64_t n = aa.size(-2), m = aa.size(-1), p = b.size(-1);
  Shape batch_a(aa.sizes().begin(), aa.sizes().end() - 2), batch_b(b.sizes().begin(), b.sizes().end() - 2);
  Shape batch = broadcast_shapes("matmul", batch_a, batch_b);
  Shape ea = batch, eb = batch;
  ea.insert(ea.end(), {n, m});
  eb.insert(eb.end(), {m, p});
  Shape out_shape = batch;
  if (da > 1) out_shape.push_back(n);
  out_shape.push_back(p);
  if (!a.device().is_cuda()) {  // [Batched products of strided views]
    return reshape(strided_batched_matmul(expand(aa, ea), expand(b, eb), std::nullopt), out_shape);
  }
  const int64_t nb = numel_of(batch);
  Tensor out = bmm(reshape(expand(aa, ea), {nb, n, m}), reshape(expand(b, eb), {nb, m, p}));
  return reshape(out, out_shape);
}

Tensor matmul_laid_out_like(const Tensor& a, const Tensor& b, const Tensor& like) {
  const bool plain = a.device().is_cuda() || a.dim() < 3 || b.dim() < 3 || a.dim() != b.dim() || !like.defined() ||
                     autocast::lower_precision({&a, &b}).has_value();
  if (plain) return matmul(a, b);
  check_matmul_args("matmul", a, b);
  Shape out_shape(a.sizes().begin(), a.sizes().end() - 1);
  out_shape.push_back(b.size(-1));
  const bool same_batch = std::equal(a.sizes().begin(), a.sizes().end() - 2, b.sizes().begin());
  if (!same_batch || a.size(-1) != b.size(-2) || like.sizes() != out_shape) return matmul(a, b);
  return strided_batched_matmul(a, b, Geometry{like.sizes(), like.strides()});
}

}  // namespace chorus
