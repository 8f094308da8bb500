// Forward results of reductions, linear algebra, joining/splitting and indexing ops against plain
// loops in double over the elements (read through each tensor's own strides), on seeded random
// inputs in contiguous and non-contiguous layouts; plus the errors bad arguments get.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>

#include "tests/tensor/tensor_testing.h"

namespace chorus {
namespace {

using testing::values;

// Reference reduction over `dims` of a row-major value list of `shape`: f(accumulated list).
std::vector<double> reduce_ref(const std::vector<double>& v, const Shape& shape, std::vector<int64_t> dims,
                               const std::function<double(const std::vector<double>&)>& f, Shape* out_shape) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(nd, dims.empty());
  for (int64_t d : dims) reduced[(d + nd) % nd] = true;
  Shape out;
  for (int64_t d = 0; d < nd; ++d)
    if (!reduced[d]) out.push_back(shape[d]);
  *out_shape = out;
  std::vector<std::vector<double>> groups(static_cast<size_t>(testing::count_of(out)));
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    auto idx = testing::unravel(i, shape);
    int64_t o = 0;
    for (int64_t d = 0; d < nd; ++d)
      if (!reduced[d]) o = o * shape[d] + idx[d];
    groups[o].push_back(v[i]);
  }
  std::vector<double> r;
  for (auto& g : groups) r.push_back(f(g));
  return r;
}

double vsum(const std::vector<double>& g) {
  double s = 0;
  for (double x : g) s += x;
  return s;
}

TEST_CASE("sum, mean, var, std, prod, amax, norm, logsumexp over any dims match loops in double", "[tensor][reduce]") {
  Generator gen(101);
  const Shape shape{3, 4, 5};
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (testing::Layout layout : {testing::Layout::Contiguous, testing::Layout::Transposed, testing::Layout::StepSliced}) {
    Tensor x = testing::random_layout(shape, kFloat64, layout, gen);
    const std::vector<double> v = values(x);
    for (const auto& dims : dim_sets) {
      INFO("layout " << testing::layout_name(layout) << " dims size " << dims.size());
      Shape out;
      auto mean_of = [](const std::vector<double>& g) { return vsum(g) / static_cast<double>(g.size()); };
      auto var_of = [&](const std::vector<double>& g, bool unbiased) {
        const double m = mean_of(g);
        double s = 0;
        for (double a : g) s += (a - m) * (a - m);
        return s / static_cast<double>(g.size() - (unbiased ? 1 : 0));
      };
      const std::vector<double> sums = reduce_ref(v, shape, dims, vsum, &out);
      CHECK(testing::matches(sum(x, dims), out, sums));
      CHECK(testing::matches(mean(x, dims), out, reduce_ref(v, shape, dims, mean_of, &out)));
      CHECK(testing::matches(var(x, dims, true), out,
                             reduce_ref(v, shape, dims, [&](auto& g) { return var_of(g, true); }, &out)));
      CHECK(testing::matches(var(x, dims, false), out,
                             reduce_ref(v, shape, dims, [&](auto& g) { return var_of(g, false); }, &out)));
      CHECK(testing::matches(chorus::std(x, dims, true), out,
                             reduce_ref(v, shape, dims, [&](auto& g) { return std::sqrt(var_of(g, true)); }, &out)));
      CHECK(testing::matches(amax(x, dims), out,
                             reduce_ref(v, shape, dims, [](auto& g) { return *std::max_element(g.begin(), g.end()); }, &out)));
      CHECK(testing::matches(norm(x, 2.0, dims), out, reduce_ref(v, shape, dims, [](auto& g) {
                               double s = 0;
                               for (double a : g) s += a * a;
                               return std::sqrt(s);
                             }, &out)));
      CHECK(testing::matches(norm(x, 1.0, dims), out, reduce_ref(v, shape, dims, [](auto& g) {
                               double s = 0;
                               for (double a : g) s += std::abs(a);
                               return s;
                             }, &out)));
      if (!dims.empty()) {
        CHECK(testing::matches(logsumexp(x, dims), out, reduce_ref(v, shape, dims, [](auto& g) {
                                 double s = 0;
                                 for (double a : g) s += std::exp(a);
                                 return std::log(s);
                               }, &out)));
      }
    }
    // keepdim keeps reduced dims as size 1.
    CHECK(sum(x, {1}, true).sizes() == Shape{3, 1, 5});
    CHECK(mean(x, {0, 2}, true).sizes() == Shape{1, 4, 1});
    for (int64_t d = 0; d < 3; ++d) {
      Shape out;
      const std::vector<double> products = reduce_ref(v, shape, {d}, [](auto& g) {
        double p = 1;
        for (double a : g) p *= a;
        return p;
      }, &out);
      CHECK(testing::matches(prod(x, d), out, products));
    }
  }
  // logsumexp is stable for large inputs; sums of int tensors stay int64 (as PyTorch).
  Tensor big = tensor(std::vector<double>{1000, 1000});
  CHECK(logsumexp(big, {0}).item<double>() == Approx(1000 + std::log(2.0)));
  Tensor ints = tensor<int32_t>({1, 2, 3, 4});
  CHECK(sum(ints).dtype() == kInt64);
  CHECK(sum(ints).item<int64_t>() == 10);
  CHECK(mean(tensor(std::vector<float>{1, 2, 3, 4})).item<float>() == 2.5f);
}

TEST_CASE("max/min with indices and argmax/argmin follow PyTorch (first index on ties, NaN wins)", "[tensor][reduce]") {
  Tensor x = tensor(std::vector<float>{3, 7, 7, 1, -2, 5, 0, 5, 9, 9, -1, 2}).reshape({3, 4});
  auto [vals, idx] = max(x, 1);
  CHECK(testing::matches_exactly(vals, {3}, {7, 5, 9}));
  CHECK(testing::matches_exactly(idx, {3}, {1, 1, 0}));
  auto [mvals, midx] = min(x, 0, true);
  CHECK(testing::matches_exactly(mvals, {1, 4}, {-2, 5, -1, 1}));
  CHECK(testing::matches_exactly(midx, {1, 4}, {1, 1, 2, 0}));
  CHECK(argmax(x).item<int64_t>() == 8);
  CHECK(testing::matches_exactly(argmin(x, 1), {3}, {3, 0, 2}));
  CHECK(max(x).item<float>() == 9);
  CHECK(min(x).item<float>() == -2);
  Tensor with_nan = tensor(std::vector<float>{1, NAN, 3});
  CHECK(std::isnan(max(with_nan).item<float>()));
  CHECK(argmax(with_nan).item<int64_t>() == 1);
  CHECK_THROWS_WITH(max(x, 2), Catch::Contains("dim 2 is out of range") && Catch::Contains("[-2, 1]"));
  CHECK_THROWS_WITH(sum(x, {5}), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(max(zeros({0})), Catch::Contains("size 0") && Catch::Contains("no identity"));
}

// ------------------------------------------------------------------ linear algebra
std::vector<double> matmul_ref(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}

TEST_CASE("mm, addmm, bmm and matmul (1-D, 2-D, batched, broadcast) match loops in double", "[tensor][linalg]") {
  Generator gen(102);
  for (DType dt : {kFloat32, kFloat64}) {
    const auto layouts = {testing::Layout::Contiguous, testing::Layout::Transposed, testing::Layout::StepSliced};
    for (testing::Layout la : layouts)
    for (testing::Layout lb : layouts) {
      INFO(dtype_name(dt) << " " << testing::layout_name(la) << " @ " << testing::layout_name(lb));
      Tensor a = testing::random_layout({5, 7}, dt, la, gen), b = testing::random_layout({7, 3}, dt, lb, gen);
      const auto ref = matmul_ref(values(a), values(b), 5, 7, 3);
      CHECK(testing::matches(mm(a, b), {5, 3}, ref));
      CHECK(testing::matches(matmul(a, b), {5, 3}, ref));
      Tensor bias = testing::random_tensor({3}, dt, gen);
      std::vector<double> expect = ref, bv = values(bias);
      for (int64_t i = 0; i < 15; ++i) expect[i] = 0.5 * bv[i % 3] + 2.0 * ref[i];
      CHECK(testing::matches(addmm(bias, a, b, 0.5, 2.0), {5, 3}, expect));
    }
    // Batched with broadcasting: [2, 1, 4, 3] @ [5, 3, 2] -> [2, 5, 4, 2].
    Tensor a = testing::random_tensor({2, 1, 4, 3}, dt, gen), b = testing::random_tensor({5, 3, 2}, dt, gen);
    Tensor c = matmul(a, b);
    REQUIRE(c.sizes() == Shape{2, 5, 4, 2});
    const auto av = values(a), bv = values(b);
    std::vector<double> expect;
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        std::vector<double> ai(av.begin() + i * 12, av.begin() + (i + 1) * 12), bj(bv.begin() + j * 6, bv.begin() + (j + 1) * 6);
        auto r = matmul_ref(ai, bj, 4, 3, 2);
        expect.insert(expect.end(), r.begin(), r.end());
      }
    CHECK(testing::matches(c, {2, 5, 4, 2}, expect));
    Tensor x = testing::random_tensor({4, 3, 6}, dt, gen), y = testing::random_tensor({4, 6, 2}, dt, gen);
    const auto xv = values(x), yv = values(y);
    expect.clear();
    for (int64_t i = 0; i < 4; ++i) {
      auto r = matmul_ref({xv.begin() + i * 18, xv.begin() + (i + 1) * 18}, {yv.begin() + i * 12, yv.begin() + (i + 1) * 12}, 3, 6, 2);
      expect.insert(expect.end(), r.begin(), r.end());
    }
    CHECK(testing::matches(bmm(x, y), {4, 3, 2}, expect));
    // The weight gradient of mm is laid out transposed when the weight is used transposed (as in
    // Linear), so the product writes a column-major result: checked against the double product.
    {
      Tensor inp = testing::random_tensor({6, 4}, dt, gen), weight = testing::random_tensor({5, 4}, dt, gen);
      weight.requires_grad_();
      Tensor up = testing::random_tensor({6, 5}, dt, gen);
      (mm(inp, weight.t()) * up).sum().backward();
      // d/dW of sum(up * (inp W^T)) = up^T inp.
      CHECK(testing::matches(weight.grad(), {5, 4}, matmul_ref(values(up.t().contiguous()), values(inp), 5, 6, 4)));
    }
    // A transposed operand read from a slice of a wider tensor (column stride 700, storage offset
    // 5), in the two shapes the float32 path treats specially (kernels/cpu/gemm.cpp): tall (600 x 260
    // @ 260 x 130) and wide (130 x 260 @ 260 x 600). Where oneDNN runs AVX2 code both go to OpenBLAS;
    // on AVX-512 the tall one copies A into row-major tiles first and the wide one is computed as
    // C^T = B^T A, then transposed into C (tests/kernels/cpu:gemm_test takes every path on any CPU).
    {
      const double tol = dt == kFloat32 ? 5e-5 : 1e-12;  // 260 float32 products summed
      Tensor wide = testing::random_tensor({260, 700}, dt, gen);
      Tensor tall_a = wide.slice(1, 5, 605).t(), short_a = wide.slice(1, 5, 135).t();  // rows contiguous
      Tensor narrow_b = testing::random_tensor({260, 130}, dt, gen), wide_b = testing::random_tensor({260, 600}, dt, gen);
      CHECK(testing::matches(mm(tall_a, narrow_b), {600, 130},
                             matmul_ref(values(tall_a.contiguous()), values(narrow_b), 600, 260, 130), tol, tol));
      CHECK(testing::matches(mm(short_a, wide_b), {130, 600},
                             matmul_ref(values(short_a.contiguous()), values(wide_b), 130, 260, 600), tol, tol));
    }
    // 1-D cases: dot, vector @ matrix, matrix @ vector.
    Tensor v = testing::random_tensor({6}, dt, gen), w = testing::random_tensor({6}, dt, gen);
    CHECK(testing::matches(matmul(v, w), {}, {matmul_ref(values(v), values(w), 1, 6, 1)[0]}));
    Tensor m = testing::random_tensor({6, 3}, dt, gen);
    CHECK(testing::matches(matmul(v, m), {3}, matmul_ref(values(v), values(m), 1, 6, 3)));
    Tensor m2 = testing::random_tensor({3, 6}, dt, gen);
    CHECK(testing::matches(matmul(m2, v), {3}, matmul_ref(values(m2), values(v), 3, 6, 1)));
  }
  CHECK_THROWS_WITH(mm(zeros({2, 3}), zeros({4, 2})), Catch::Contains("2x3 and 4x2"));
  CHECK_THROWS_WITH(matmul(zeros({2, 3}), zeros({2, 3})), Catch::Contains("cannot be multiplied"));
  CHECK_THROWS_WITH(bmm(zeros({2, 3}), zeros({2, 3})), Catch::Contains("3-D"));
}

// Every dtype but float32 goes through Eigen with row-major operands only (kernels/cpu/gemm.cpp, [One
// Eigen product per dtype]): a transposed or step-sliced operand is copied first. Integer products
// are exact; addmm's integer alpha and beta too; an empty inner dimension gives beta * bias.
TEST_CASE("integer and float64 products in every operand layout match loops exactly (int) or to rounding",
          "[tensor][linalg]") {
  Generator gen(103);
  for (DType dt : {kUInt8, kInt32, kInt64, kFloat64}) {
    const auto layouts = {testing::Layout::Contiguous, testing::Layout::Transposed, testing::Layout::StepSliced};
    // uint8 wraps on overflow: values 0..2 keep the 7-term sums (at most 28) in range.
    auto make = [&](const Shape& shape, testing::Layout layout) {
      return testing::make_in_layout(shape, layout, [&](const Shape& s) {
        return dt == kUInt8 ? randint(0, 3, s, {.dtype = kUInt8}, &gen) : testing::random_tensor(s, dt, gen);
      });
    };
    const double tol = dt == kFloat64 ? 1e-12 : 0.0;
    for (testing::Layout la : layouts)
      for (testing::Layout lb : layouts) {
        INFO(dtype_name(dt) << " " << testing::layout_name(la) << " @ " << testing::layout_name(lb));
        Tensor a = make({5, 7}, la), b = make({7, 3}, lb);
        const auto ref = matmul_ref(values(a), values(b), 5, 7, 3);
        CHECK(mm(a, b).dtype() == dt);
        CHECK(testing::matches(mm(a, b), {5, 3}, ref, tol, tol));
        Tensor bias = make({3}, testing::Layout::Contiguous);
        std::vector<double> expect = ref, bv = values(bias);
        for (int64_t i = 0; i < 15; ++i) expect[i] = 3.0 * bv[i % 3] + 2.0 * ref[i];
        if (dt == kUInt8) {
          for (double& e : expect) e = std::fmod(e, 256.0);  // uint8 arithmetic wraps
        }
        CHECK(testing::matches(addmm(bias, a, b, 3, 2), {5, 3}, expect, tol, tol));
      }
    // k = 0: the product is empty, addmm gives beta * bias.
    Tensor bias = make({4}, testing::Layout::Contiguous);
    std::vector<double> expect;
    for (int64_t i = 0; i < 12; ++i) expect.push_back(3.0 * values(bias)[i % 4]);
    CHECK(testing::matches_exactly(mm(zeros({3, 0}, {.dtype = dt}), zeros({0, 4}, {.dtype = dt})), {3, 4},
                                   std::vector<double>(12, 0.0)));
    CHECK(testing::matches(addmm(bias, zeros({3, 0}, {.dtype = dt}), zeros({0, 4}, {.dtype = dt}), 3, 2), {3, 4},
                           expect, tol, tol));
  }
}

TEST_CASE("matmul over attention's permuted heads matches loops, and its gradients keep the inputs' layout",
          "[tensor][linalg]") {
  // q and k as projections give them: [B, T, H, d] permuted to [B, H, T, d] and [B, H, d, T], whose
  // batch dims (B, H) no single stride describes; on the CPU the product reads them in place
  // ([Batched products of strided views], autograd/ops/linalg.cpp).
  Generator gen(103);
  const int64_t B = 3, T = 5, H = 2, d = 4;
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    Tensor xq = testing::random_tensor({B, T, H, d}, dt, gen).requires_grad_();
    Tensor xk = testing::random_tensor({B, T, H, d}, dt, gen).requires_grad_();
    Tensor q = xq.permute({0, 2, 1, 3}), kt = xk.permute({0, 2, 3, 1});
    Tensor s = matmul(q, kt);
    REQUIRE(s.sizes() == Shape{B, H, T, T});
    const auto qv = values(q.contiguous()), kv = values(kt.contiguous());
    std::vector<double> expect;
    for (int64_t i = 0; i < B * H; ++i) {
      auto r = matmul_ref({qv.begin() + i * T * d, qv.begin() + (i + 1) * T * d},
                          {kv.begin() + i * d * T, kv.begin() + (i + 1) * d * T}, T, d, T);
      expect.insert(expect.end(), r.begin(), r.end());
    }
    const double tol = dt == kFloat32 ? 1e-6 : 1e-15;
    CHECK(testing::matches(s, {B, H, T, T}, expect, tol, tol));
    // The gradients that reach q and kt are laid out like them, so the ones that reach the
    // projections' outputs are contiguous (the reshape before a projection's backward is a view).
    Tensor seen_q, seen_k;
    q.register_hook([&](const Tensor& g) { seen_q = g; return Tensor(); });
    kt.register_hook([&](const Tensor& g) { seen_k = g; return Tensor(); });
    Tensor up = testing::random_tensor({B, H, T, T}, dt, gen);
    (s * up).sum().backward();
    REQUIRE(seen_q.defined());
    REQUIRE(seen_k.defined());
    CHECK(seen_q.strides() == q.strides());
    CHECK(seen_k.strides() == kt.strides());
    CHECK(xq.grad().is_contiguous());
    // dL/dq = up @ kt^T, dL/dkt = q^T @ up, per batch (the transposes as the earlier case takes them).
    const auto uv = values(up), ktv = values(kt.transpose(-2, -1).contiguous()), qtv = values(q.transpose(-2, -1).contiguous());
    std::vector<double> gq, gk;
    for (int64_t i = 0; i < B * H; ++i) {
      const std::vector<double> ui(uv.begin() + i * T * T, uv.begin() + (i + 1) * T * T);
      auto a = matmul_ref(ui, {ktv.begin() + i * T * d, ktv.begin() + (i + 1) * T * d}, T, T, d);
      auto b = matmul_ref({qtv.begin() + i * d * T, qtv.begin() + (i + 1) * d * T}, ui, d, T, T);
      gq.insert(gq.end(), a.begin(), a.end());
      gk.insert(gk.end(), b.begin(), b.end());
    }
    CHECK(testing::matches(xq.grad().permute({0, 2, 1, 3}).contiguous(), {B, H, T, d}, gq, tol, tol));
    CHECK(testing::matches(xk.grad().permute({0, 2, 3, 1}).contiguous(), {B, H, d, T}, gk, tol, tol));
  }
}

// ------------------------------------------------------------------ joining, splitting, indexing
TEST_CASE("cat, stack, split and chunk place every element where PyTorch does", "[tensor][join]") {
  Generator gen(103);
  Tensor a = testing::random_tensor({2, 3}, kFloat64, gen), b = testing::random_tensor({4, 3}, kFloat64, gen);
  Tensor c = cat({a, b.t().contiguous().t()}, 0);
  std::vector<double> expect = values(a), bv = values(b);
  expect.insert(expect.end(), bv.begin(), bv.end());
  CHECK(testing::matches(c, {6, 3}, expect));
  Tensor r = testing::random_tensor({2, 1}, kFloat64, gen);
  Tensor d = cat({a, r}, 1);
  CHECK(testing::matches(d, {2, 4}, {values(a)[0], values(a)[1], values(a)[2], values(r)[0], values(a)[3], values(a)[4],
                                     values(a)[5], values(r)[1]}));
  Tensor s = stack({a, a * 2.0}, 1);
  REQUIRE(s.sizes() == Shape{2, 2, 3});
  CHECK(values(s)[3] == 2.0 * values(a)[0]);
  auto parts = split(b, 3, 0);
  REQUIRE(parts.size() == 2u);
  CHECK(parts[1].sizes() == Shape{1, 3});
  CHECK(values(parts[1])[0] == bv[9]);
  auto sized = split(b, std::vector<int64_t>{1, 3}, 0);
  CHECK(sized[1].sizes() == Shape{3, 3});
  auto ch = chunk(testing::random_tensor({7}, kFloat64, gen), 3);
  CHECK(ch.size() == 3u);
  CHECK(ch[2].sizes() == Shape{1});
  CHECK_THROWS_WITH(cat({a, b}, 1), Catch::Contains("[2, 3]") && Catch::Contains("[4, 3]"));
  CHECK_THROWS_WITH(stack({a, b}), Catch::Contains("equal size") && Catch::Contains("[4, 3] at entry 1"));
  CHECK_THROWS_WITH(split(b, std::vector<int64_t>{1, 2}, 0), Catch::Contains("sum"));
}

TEST_CASE("index_select, gather, scatter, scatter_add, masked_fill, index and one_hot", "[tensor][index]") {
  Generator gen(104);
  Tensor x = testing::random_tensor({4, 5}, kFloat64, gen);
  const auto xv = values(x);
  Tensor idx = tensor<int64_t>({3, 0, 3});
  Tensor sel = index_select(x, 0, idx);
  std::vector<double> expect;
  for (int64_t r : {3, 0, 3})
    for (int64_t c = 0; c < 5; ++c) expect.push_back(xv[r * 5 + c]);
  CHECK(testing::matches(sel, {3, 5}, expect));
  CHECK(testing::matches(index(x, idx), {3, 5}, expect));
  Tensor cols = index_select(x.t(), 1, tensor<int64_t>({1}));  // a transposed input
  CHECK(testing::matches(cols, {5, 1}, {xv[5], xv[6], xv[7], xv[8], xv[9]}));
  // gather along dim 1: out[i][j] = x[i][g[i][j]].
  Tensor g = tensor<int64_t>({4, 0, 1, 1, 2, 2, 3, 0}).reshape({4, 2});
  Tensor gathered = gather(x, 1, g);
  const int64_t gv[8] = {4, 0, 1, 1, 2, 2, 3, 0};
  expect.clear();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j) expect.push_back(xv[i * 5 + gv[i * 2 + j]]);
  CHECK(testing::matches(gathered, {4, 2}, expect));
  // scatter writes src at the indexed positions; scatter_add accumulates duplicates.
  Tensor src = testing::random_tensor({4, 2}, kFloat64, gen);
  const auto sv = values(src);
  std::vector<double> sa = xv;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j) sa[i * 5 + gv[i * 2 + j]] += sv[i * 2 + j];
  CHECK(testing::matches(scatter(x, 1, tensor<int64_t>({4, 0, 1, 3, 2, 0, 3, 0}).reshape({4, 2}), src), {4, 5},
                         [&] {
                           std::vector<double> r = xv;
                           const int64_t u[8] = {4, 0, 1, 3, 2, 0, 3, 0};
                           for (int64_t i = 0; i < 4; ++i)
                             for (int64_t j = 0; j < 2; ++j) r[i * 5 + u[i * 2 + j]] = sv[i * 2 + j];
                           return r;
                         }()));
  CHECK(testing::matches(scatter_add(x, 1, g, src), {4, 5}, sa));
  Tensor mask = gt(x, 0.0);
  std::vector<double> mf = xv;
  for (double& v : mf)
    if (v > 0) v = -7;
  CHECK(testing::matches(masked_fill(x, mask, -7.0), {4, 5}, mf));
  CHECK(testing::matches_exactly(one_hot(tensor<int64_t>({2, 0, 1}), 4), {3, 4}, {0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0}));
  CHECK(one_hot(tensor<int64_t>({2, 0, 1})).size(1) == 3);
  CHECK_THROWS_WITH(index_select(x, 0, tensor<int64_t>({4})), Catch::Contains("index 4 is out of bounds for dim 0 with size 4"));
  CHECK_THROWS_WITH(gather(x, 1, tensor<int64_t>({9}).reshape({1, 1})), Catch::Contains("index 9 is out of bounds for dim 1 with size 5"));
  CHECK_THROWS_WITH(index_select(x, 0, tensor(std::vector<float>{1})), Catch::Contains("int64") );
  CHECK_THROWS_WITH(one_hot(tensor<int64_t>({5}), 3), Catch::Contains("5"));
}

TEST_CASE("printing looks like PyTorch's and item() converts", "[tensor][print]") {
  Tensor t = tensor(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f}).reshape({2, 2});
  const std::string s = t.str();
  CHECK_THAT(s, Catch::StartsWith("tensor([["));
  CHECK_THAT(s, Catch::Contains("1.5000") && Catch::Contains("-2.0000") && Catch::Contains("3.2500"));
  CHECK_THAT(tensor<int64_t>({1, 2}).str(), Catch::Contains("tensor([1, 2])"));
  CHECK_THAT(tensor(std::vector<double>{1.0}).str(), Catch::Contains("dtype=torch.float64") || Catch::Contains("float64"));
  CHECK(tensor<int64_t>({7}).item<double>() == 7.0);
  CHECK_THROWS_WITH(t.item<float>(), Catch::Contains("4 elements"));
}

// A 0-dim tensor accepts dim 0 / -1 as PyTorch does (a reduction over it is the value itself, with
// keepdim or not the result is 0-dim); this once crashed inside the CPU reduction kernel.
TEST_CASE("every reduction accepts dim 0 and -1 on a 0-dim tensor and returns a 0-dim result", "[tensor][reduce]") {
  const Tensor x = full({}, 2.5, {.dtype = kFloat64});
  const Tensor neg = full({}, -1.5, {.dtype = kFloat64});
  auto scalar_of = [](const Tensor& t) {
    REQUIRE(t.dim() == 0);
    return t.item<double>();
  };
  for (bool keep : {false, true}) {
    for (int64_t d : {int64_t{0}, int64_t{-1}}) {
      INFO("dim " << d << " keepdim " << keep);
      CHECK(scalar_of(sum(x, {d}, keep)) == 2.5);
      CHECK(scalar_of(mean(x, {d}, keep)) == 2.5);
      CHECK(scalar_of(amax(x, {d}, keep)) == 2.5);
      CHECK(scalar_of(amin(x, {d}, keep)) == 2.5);
      CHECK(scalar_of(logsumexp(x, {d}, keep)) == Approx(2.5));
      CHECK(scalar_of(norm(neg, 2, {d}, keep)) == 1.5);
      CHECK(scalar_of(norm(neg, 1, {d}, keep)) == 1.5);
      CHECK(scalar_of(prod(x, d, keep)) == 2.5);
      CHECK(std::isnan(scalar_of(var(x, {d}, true, keep))));  // one value, unbiased: NaN as PyTorch
      CHECK(scalar_of(var(x, {d}, false, keep)) == 0.0);
      CHECK(scalar_of(std(x, {d}, false, keep)) == 0.0);
      const auto [mx, imx] = max(x, d, keep);
      CHECK(scalar_of(mx) == 2.5);
      CHECK(imx.dtype() == kInt64);
      CHECK(imx.dim() == 0);
      CHECK(imx.item<int64_t>() == 0);
      const auto [mn, imn] = min(x, d, keep);
      CHECK(scalar_of(mn) == 2.5);
      CHECK(imn.item<int64_t>() == 0);
      CHECK(argmax(x, d, keep).item<int64_t>() == 0);
      CHECK(argmin(x, d, keep).item<int64_t>() == 0);
    }
    CHECK(scalar_of(softmax(x, 0)) == 1.0);
    CHECK(scalar_of(log_softmax(x, -1)) == 0.0);
  }
  // Gradients flow back to the 0-dim input.
  Tensor w = full({}, 3.0, {.dtype = kFloat64}).requires_grad_(true);
  (sum(w, {0}) * 2 + amax(w, {-1}, true) + logsumexp(w, {0})).backward();
  CHECK(w.grad().dim() == 0);
  CHECK(w.grad().item<double>() == Approx(4.0));
  // Out of range for a 0-dim tensor: [-1, 0] only.
  REQUIRE_THROWS_WITH(sum(x, {1}), Catch::Contains("sum"));
  REQUIRE_THROWS_WITH(sum(x, {0, -1}), Catch::Contains("appears more than once"));
}

TEST_CASE("var and std of nothing are NaN and logsumexp of nothing is -inf, as in PyTorch", "[tensor][reduce]") {
  const Tensor e = empty({0}, {.dtype = kFloat64});
  CHECK(std::isnan(var(e).item<double>()));
  CHECK(std::isnan(std(e).item<double>()));
  CHECK(std::isnan(var(e, {}, false).item<double>()));
  CHECK(logsumexp(e, {0}).item<double>() == -std::numeric_limits<double>::infinity());
  const Tensor rows = empty({3, 0}, {.dtype = kFloat64});
  const Tensor l = logsumexp(rows, {1}, true);
  CHECK(l.sizes() == Shape{3, 1});
  CHECK(l.max().item<double>() == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(var(rows, {1}).max().item<double>()));
  // The max of values that are all -inf is -inf (and the min of all +inf is +inf), not the lowest
  // finite value; in float32 too.
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(full({4}, -inf, {.dtype = kFloat64}).max().item<double>() == -inf);
  CHECK(amax(full({2, 3}, -inf), {1}).max().item<float>() == -std::numeric_limits<float>::infinity());
  CHECK(full({4}, inf, {.dtype = kFloat64}).min().item<double>() == inf);
}

TEST_CASE("the reduction, softmax, comparison, splitting and bmm methods equal their free functions",
          "[tensor][methods]") {
  manual_seed(21);
  const Tensor x = randn({3, 4, 5}, {.dtype = kFloat64});
  const Tensor y = randn({3, 4, 5}, {.dtype = kFloat64});
  auto same = [](const Tensor& a, const Tensor& b) { return a.sizes() == b.sizes() && equal(a, b); };
  CHECK(same(x.argmin(1), argmin(x, 1)));
  CHECK(same(x.argmin(), argmin(x)));
  CHECK(same(x.max(2).first, max(x, 2).first));
  CHECK(same(x.max(2, true).second, max(x, 2, true).second));
  CHECK(same(x.min(0).first, min(x, 0).first));
  CHECK(same(x.min(0).second, min(x, 0).second));
  CHECK(same(x.amax({0, 2}), amax(x, {0, 2})));
  CHECK(same(x.amin({1}, true), amin(x, {1}, true)));
  CHECK(same(x.prod(1), prod(x, 1)));
  CHECK(same(x.prod(), prod(x)));
  CHECK(same(x.var({1}), var(x, {1})));
  CHECK(same(x.var({0, 2}, false, true), var(x, {0, 2}, false, true)));
  CHECK(same(x.std(), chorus::std(x)));
  CHECK(same(x.norm(1.0, {2}), norm(x, 1.0, {2})));
  CHECK(same(x.norm(), norm(x)));
  CHECK(same(x.logsumexp({2}, true), logsumexp(x, {2}, true)));
  CHECK(same(x.softmax(-1), softmax(x, -1)));
  CHECK(same(x.log_softmax(1), log_softmax(x, 1)));
  CHECK(same(x.maximum(y), maximum(x, y)));
  CHECK(same(x.minimum(y), minimum(x, y)));
  // x.where(cond, y) is where(cond, x, y): x where the condition holds.
  const Tensor cond = x.gt(0.0);
  CHECK(same(x.where(cond, y), where(cond, x, y)));
  CHECK(same(x.where(cond, 0.5), where(cond, x, Scalar(0.5))));
  CHECK(values(x.where(cond, 0.5)) == values(where(cond, x, full_like(x, 0.5))));
  CHECK(same(x.ne(0.25), ne(x, Scalar(0.25))));
  CHECK(same(x.lt(0.0), lt(x, Scalar(0.0))));
  CHECK(same(x.le(0.1), le(x, Scalar(0.1))));
  CHECK(same(x.ge(-0.1), ge(x, Scalar(-0.1))));
  CHECK(x.lt(0.0).dtype() == kBool);
  // view_as shares storage; type_as converts.
  const Tensor flat = randn({60});
  const Tensor v = flat.view_as(x);
  CHECK(v.sizes() == x.sizes());
  CHECK(v.data_ptr<float>() == flat.data_ptr<float>());
  CHECK(flat.type_as(x).dtype() == kFloat64);
  CHECK(values(flat.type_as(x)) == values(flat));
  // split / chunk.
  const auto parts = x.split(2, 1);
  REQUIRE(parts.size() == 2);
  CHECK(same(parts[1], split(x, 2, 1)[1]));
  CHECK(parts[1].size(1) == 2);
  const auto uneven = x.split(std::vector<int64_t>{1, 4}, 2);
  REQUIRE(uneven.size() == 2);
  CHECK(uneven[1].size(2) == 4);
  const auto chunks = x.chunk(3, 0);
  REQUIRE(chunks.size() == 3);
  CHECK(same(chunks[2], chunk(x, 3, 0)[2]));
  // bmm.
  const Tensor a = randn({2, 3, 4}), b = randn({2, 4, 5});
  CHECK(same(a.bmm(b), bmm(a, b)));
}

}  // namespace
}  // namespace chorus
