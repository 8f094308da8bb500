// F::scaled_dot_product_attention against softmax(q k^T * scale + mask) v written here from basic
// ops (and once in plain double loops): boolean, additive and causal masks, broadcast batch dims,
// custom scale, fully masked rows; gradcheck of q, k, v and a float mask; dropout statistics; the
// sim device against the CPU; errors. torch 1.13 (Debian's python3-torch) has no
// scaled_dot_product_attention, so there is no PyTorch golden file for it.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/gradcheck.h"
#include "nn/nn.h"
#include "tensor/ops.h"
#include "tests/nn/reference.h"

namespace chorus {
namespace {

namespace F = nn::functional;
using nn_test::check_close;
using nn_test::doubles;
using nn_test::error_message;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The definition, from basic ops. A bool mask becomes 0 / -inf added to the scores.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale) {
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), scale);
  if (mask.defined()) {
    Tensor additive = mask.dtype() == kBool ? masked_fill(zeros(mask.sizes(), {.dtype = q.dtype()}), logical_not(mask), -kInf)
                                            : mask;
    scores = add(scores, additive);
  }
  return matmul(softmax(scores, -1), v);
}

Tensor causal_mask(int64_t L, int64_t S) { return tril(ones({L, S}, {.dtype = kBool})); }

// A random bool mask in which every query row keeps at least one key (column `row % S`).
Tensor random_bool_mask(const Shape& shape, Generator& g) {
  Tensor m = lt(rand(shape, {}, &g), 0.6);
  const int64_t L = shape[shape.size() - 2], S = shape.back();
  Tensor keep = eq(arange(S).unsqueeze(0), remainder(arange(L), S).unsqueeze(1));
  return logical_or(m, keep);
}

double tolerance(DType dtype) { return dtype == kFloat64 ? 1e-12 : 2e-6; }

}  // namespace

TEST_CASE("scaled_dot_product_attention equals softmax(q k^T * scale + mask) v", "[nn][sdpa]") {
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO(dtype_name(dtype));
    Generator g(7);
    const TensorOptions o{.dtype = dtype};
    const int64_t L = 5, S = 7, E = 8, Ev = 3;
    Tensor q = randn({2, 3, L, E}, o, &g), k = randn({2, 3, S, E}, o, &g), v = randn({2, 3, S, Ev}, o, &g);
    const double default_scale = 1.0 / std::sqrt(8.0);

    SECTION("no mask") { check_close(F::scaled_dot_product_attention(q, k, v), doubles(reference(q, k, v, {}, default_scale)), tolerance(dtype)); }
    SECTION("boolean mask [N, H, L, S]: true takes part") {
      Tensor mask = random_bool_mask({2, 3, L, S}, g);
      check_close(F::scaled_dot_product_attention(q, k, v, {.attn_mask = mask}),
                  doubles(reference(q, k, v, mask, default_scale)), tolerance(dtype));
    }
    SECTION("boolean mask broadcast from [L, S] and a key-padding shape [N, 1, 1, S]") {
      Tensor mask = random_bool_mask({L, S}, g);
      check_close(F::scaled_dot_product_attention(q, k, v, {.attn_mask = mask}),
                  doubles(reference(q, k, v, mask, default_scale)), tolerance(dtype));
      Tensor padding = ge(arange(S).reshape({1, 1, 1, S}), tensor(std::vector<int64_t>{4, 6}, Shape{2, 1, 1, 1}));
      Tensor keep = logical_not(padding);
      check_close(F::scaled_dot_product_attention(q, k, v, {.attn_mask = keep}),
                  doubles(reference(q, k, v, keep, default_scale)), tolerance(dtype));
    }
    SECTION("float mask, added, broadcast over heads") {
      Tensor mask = randn({2, 1, L, S}, o, &g);
      check_close(F::scaled_dot_product_attention(q, k, v, {.attn_mask = mask}),
                  doubles(reference(q, k, v, mask, default_scale)), tolerance(dtype));
    }
    SECTION("float32 mask beside float64 activations is added in the activations' dtype") {
      Tensor mask = randn({L, S}, {}, &g);
      check_close(F::scaled_dot_product_attention(q, k, v, {.attn_mask = mask}),
                  doubles(reference(q, k, v, mask.to(dtype), default_scale)), tolerance(dtype));
    }
    SECTION("causal with L < S, L == S and L > S: query i sees keys 0..i") {
      for (int64_t s : {7, 5, 3}) {
        INFO("S = " << s);
        Tensor ks = k.narrow(2, 0, s), vs = v.narrow(2, 0, s);
        check_close(F::scaled_dot_product_attention(q, ks, vs, {.is_causal = true}),
                    doubles(reference(q, ks, vs, causal_mask(L, s), default_scale)), tolerance(dtype));
      }
    }
    SECTION("custom scale") {
      check_close(F::scaled_dot_product_attention(q, k, v, {.scale = 0.3}), doubles(reference(q, k, v, {}, 0.3)),
                  tolerance(dtype));
    }
    SECTION("batch dims broadcast: q [2, 3, ...], k [3, ...], v [2, 1, ...]; unbatched 2-D") {
      Tensor kb = k[0], vb = v.narrow(1, 0, 1);
      Tensor out = F::scaled_dot_product_attention(q, kb, vb);
      CHECK(out.sizes() == Shape{2, 3, L, Ev});
      check_close(out, doubles(reference(q, kb, vb, {}, default_scale)), tolerance(dtype));
      Tensor q2 = q[0][0], k2 = k[0][0], v2 = v[0][0];
      check_close(F::scaled_dot_product_attention(q2, k2, v2), doubles(reference(q2, k2, v2, {}, default_scale)),
                  tolerance(dtype));
    }
  }
}

TEST_CASE("scaled_dot_product_attention equals plain double loops (bool mask, scale 0.5)", "[nn][sdpa]") {
  Generator g(3);
  const int64_t L = 4, S = 6, E = 5, Ev = 2;
  Tensor q = randn({L, E}, {.dtype = kFloat64}, &g), k = randn({S, E}, {.dtype = kFloat64}, &g),
         v = randn({S, Ev}, {.dtype = kFloat64}, &g);
  Tensor mask = random_bool_mask({L, S}, g);
  const std::vector<double> Q = doubles(q), K = doubles(k), V = doubles(v), M = doubles(mask);
  std::vector<double> expected(L * Ev, 0.0);
  for (int64_t i = 0; i < L; ++i) {
    std::vector<double> w(S, 0.0);
    double mx = -kInf, sum = 0;
    for (int64_t j = 0; j < S; ++j) {
      if (M[i * S + j] == 0) continue;
      for (int64_t e = 0; e < E; ++e) w[j] += 0.5 * Q[i * E + e] * K[j * E + e];
      mx = std::max(mx, w[j]);
    }
    for (int64_t j = 0; j < S; ++j) sum += w[j] = M[i * S + j] == 0 ? 0.0 : std::exp(w[j] - mx);
    for (int64_t j = 0; j < S; ++j)
      for (int64_t c = 0; c < Ev; ++c) expected[i * Ev + c] += w[j] / sum * V[j * Ev + c];
  }
  check_close(F::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .scale = 0.5}), expected, 1e-12);
}

TEST_CASE("a query row whose mask excludes every key gives zeros and zero gradients, not NaN", "[nn][sdpa]") {
  Generator g(5);
  const TensorOptions o{.dtype = kFloat64};
  Tensor q = randn({2, 3, 4}, o, &g).requires_grad_(), k = randn({2, 5, 4}, o, &g).requires_grad_(),
         v = randn({2, 5, 3}, o, &g).requires_grad_();
  Tensor bool_mask = ones({2, 3, 5}, {.dtype = kBool});
  bool_mask = masked_fill(bool_mask, eq(arange(3).reshape({1, 3, 1}), 1), false);  // row 1 of both batches
  Tensor float_mask = masked_fill(zeros({2, 3, 5}, o), logical_not(bool_mask), -kInf);
  for (const Tensor& mask : {bool_mask, float_mask}) {
    INFO(dtype_name(mask.dtype()));
    Tensor out = F::scaled_dot_product_attention(q, k, v, {.attn_mask = mask});
    Tensor row1 = out.select(1, 1);
    CHECK(equal(row1, zeros(row1.sizes(), o)));
    // The other rows are ordinary attention.
    Tensor others = index_select(out, 1, tensor(std::vector<int64_t>{0, 2}));
    Tensor expected = index_select(reference(q, k, v, {}, 0.5), 1, tensor(std::vector<int64_t>{0, 2}));
    check_close(others, doubles(expected), 1e-12);
    out.sum().backward();
    CHECK(all(isfinite(q.grad())).item<bool>());
    CHECK(all(isfinite(k.grad())).item<bool>());
    CHECK(all(isfinite(v.grad())).item<bool>());
    Tensor q_row1 = q.grad().select(1, 1);
    CHECK(equal(q_row1, zeros(q_row1.sizes(), o)));
    for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
  }
}

TEST_CASE("scaled_dot_product_attention gradients pass gradcheck in float64", "[nn][sdpa][gradcheck]") {
  Generator g(11);
  const TensorOptions o{.dtype = kFloat64};
  auto leaf = [&](const Shape& s) { return randn(s, o, &g).requires_grad_(); };
  SECTION("q, k, v with broadcast batch dims and Ev != E") {
    CHECK(autograd::gradcheck([](const TensorList& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2]); },
                              {leaf({2, 2, 3, 4}), leaf({1, 2, 5, 4}), leaf({2, 1, 5, 3})}));
  }
  SECTION("with a float mask, which gets a gradient too") {
    CHECK(autograd::gradcheck(
        [](const TensorList& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = x[3]}); },
        {leaf({2, 3, 4}), leaf({2, 4, 4}), leaf({2, 4, 2}), leaf({1, 3, 4})}));
  }
  SECTION("bool mask, causal, custom scale") {
    Tensor mask = random_bool_mask({3, 4}, g);
    CHECK(autograd::gradcheck(
        [&](const TensorList& x) {
          return add(F::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = mask, .scale = 0.7}),
                     F::scaled_dot_product_attention(x[0], x[1], x[2], {.is_causal = true}));
        },
        {leaf({2, 3, 4}), leaf({2, 4, 4}), leaf({2, 4, 2})}));
  }
}

TEST_CASE("scaled_dot_product_attention lays its output out like the query, as PyTorch's fused kernels do",
          "[nn][sdpa]") {
  // Heads permuted out of [B, T, H, d] projections, as BERT and MultiheadAttention make them: the
  // output comes back in that order, so permuting it to [B, T, H, d] and reshaping are views.
  Generator g(13);
  const int64_t B = 2, T = 5, H = 3, d = 4;
  const TensorOptions o{.dtype = kFloat64};
  Tensor xq = randn({B, T, H, d}, o, &g), xk = randn({B, T, H, d}, o, &g), xv = randn({B, T, H, d}, o, &g);
  Tensor mask = randn({B, 1, 1, T}, o, &g);
  auto heads = [](const Tensor& x) { return x.permute({0, 2, 1, 3}); };
  Tensor out = F::scaled_dot_product_attention(heads(xq), heads(xk), heads(xv), {.attn_mask = mask});
  CHECK(out.sizes() == Shape{B, H, T, d});
  CHECK(out.strides() == heads(xq).strides());
  CHECK(out.permute({0, 2, 1, 3}).is_contiguous());
  check_close(out, doubles(reference(heads(xq), heads(xk), heads(xv), mask, 0.5)), tolerance(kFloat64));
  // A contiguous query keeps a contiguous output; gradients through the permuted output pass gradcheck.
  CHECK(F::scaled_dot_product_attention(heads(xq).contiguous(), heads(xk), heads(xv)).is_contiguous());
  auto leaf = [&](const Shape& s) { return randn(s, o, &g).requires_grad_(); };
  CHECK(autograd::gradcheck(
      [](const TensorList& x) {
        auto h = [](const Tensor& t) { return t.permute({0, 2, 1, 3}); };
        return F::scaled_dot_product_attention(h(x[0]), h(x[1]), h(x[2])).permute({0, 2, 1, 3}).reshape({2, 3, 4});
      },
      {leaf({2, 3, 2, 2}), leaf({2, 3, 2, 2}), leaf({2, 3, 2, 2})}));
}

TEST_CASE("scaled_dot_product_attention dropout: seeded, unbiased, p = 1 gives zeros", "[nn][sdpa][dropout]") {
  Generator g(13);
  const int64_t L = 3, S = 4, E = 2;
  Tensor q = randn({L, E}, {.dtype = kFloat64}, &g), k = randn({S, E}, {.dtype = kFloat64}, &g),
         v = randn({S, 2}, {.dtype = kFloat64}, &g);
  const Tensor plain = F::scaled_dot_product_attention(q, k, v);

  SECTION("the same seed gives the same result; another seed another") {
    Generator a(99), b(99), c(100);
    Tensor x = F::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.4, .generator = &a});
    CHECK(equal(x, F::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.4, .generator = &b})));
    CHECK_FALSE(equal(x, F::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.4, .generator = &c})));
    CHECK_FALSE(equal(x, plain));
  }
  SECTION("dropout_p = 1 gives zeros, dropout_p = 0 the plain result") {
    CHECK(equal(F::scaled_dot_product_attention(q, k, v, {.dropout_p = 1.0}), zeros({L, 2}, {.dtype = kFloat64})));
    CHECK(equal(F::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.0}), plain));
  }
  SECTION("with value = identity the output is the dropped weights: a fraction p are zero, the rest w / (1 - p)") {
    const int64_t draws = 4000;
    const double p = 0.3;
    Tensor eye_v = eye(S, std::nullopt, {.dtype = kFloat64});
    Generator d(21);
    Tensor out = F::scaled_dot_product_attention(q.expand({draws, L, E}), k, eye_v, {.dropout_p = p, .generator = &d});
    Tensor weights = softmax(mul(matmul(q, k.t()), 1.0 / std::sqrt(2.0)), -1);
    const double zero_fraction = eq(out, 0.0).to(kFloat64).mean().item<double>();
    CHECK(std::abs(zero_fraction - p) < 0.01);  // 48000 draws: 5 standard deviations
    Tensor kept = where(eq(out, 0.0), full({1}, 0.0, {.dtype = kFloat64}), sub(out, div(weights, 1.0 - p)).abs());
    CHECK(kept.max().item<double>() < 1e-12);
  }
  SECTION("the mean over many draws approaches the plain output") {
    const int64_t draws = 4000;
    Generator d(23);
    Tensor out = F::scaled_dot_product_attention(q.expand({draws, L, E}), k, v, {.dropout_p = 0.5, .generator = &d});
    // Each element's draw has a standard deviation below 1 here, so the mean's is below 0.016.
    check_close(mean(out, {0}), doubles(plain), 0.08);
  }
}

TEST_CASE("scaled_dot_product_attention on sim:0 equals the CPU, forward and backward", "[nn][sdpa][sim]") {
  const Device sim = Device::sim(0);
  auto run = [&](Device device, int variant) {
    Generator g(31);
    TensorList x;
    for (const Shape& s : {Shape{2, 2, 5, 4}, Shape{2, 2, 6, 4}, Shape{2, 2, 6, 3}}) {
      x.push_back(randn(s, {.dtype = kFloat64}, &g).to(device).requires_grad_());
    }
    Tensor mask = random_bool_mask({2, 1, 5, 6}, g).to(device);
    Generator drop(77);
    Tensor out = variant == 0   ? F::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = mask})
                 : variant == 1 ? F::scaled_dot_product_attention(x[0], x[1], x[2], {.is_causal = true, .scale = 0.4})
                                : F::scaled_dot_product_attention(x[0], x[1], x[2], {.dropout_p = 0.25, .generator = &drop});
    mul(out, out).sum().backward();
    return TensorList{out.cpu(), x[0].grad().cpu(), x[1].grad().cpu(), x[2].grad().cpu()};
  };
  for (int variant : {0, 1, 2}) {
    INFO("variant " << variant << " (bool mask, causal + scale, dropout)");
    TensorList cpu = run(kCPU, variant), on_sim = run(sim, variant);
    for (size_t i = 0; i < cpu.size(); ++i) {
      INFO("tensor " << i << " (output, dq, dk, dv)");
      CHECK(equal(cpu[i], on_sim[i]));
    }
  }
}

TEST_CASE("scaled_dot_product_attention errors name what was given and what was expected", "[nn][sdpa][errors]") {
  Tensor q = randn({2, 3, 4}), k = randn({2, 5, 4}), v = randn({2, 5, 6});
  auto sdpa = [&](const Tensor& a, const Tensor& b, const Tensor& c, F::ScaledDotProductAttentionOptions o = {}) {
    return error_message([&] { F::scaled_dot_product_attention(a, b, c, o); });
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(sdpa(randn({4}), k, v), Contains("at least 2 dims") && Contains("query [4]"));
  CHECK_THAT(sdpa(q, k.to(kFloat64), v), Contains("one floating dtype") && Contains("float64"));
  CHECK_THAT(sdpa(q.to(kInt64), k.to(kInt64), v.to(kInt64)), Contains("one floating dtype") && Contains("int64"));
  CHECK_THAT(sdpa(q, randn({2, 5, 3}), v), Contains("E=4") && Contains("key [2, 5, 3]"));
  CHECK_THAT(sdpa(q, k, randn({2, 4, 6})), Contains("S=5") && Contains("value [2, 4, 6]"));
  CHECK_THAT(sdpa(q, randn({3, 5, 4}), randn({3, 5, 6})), Contains("broadcast") && Contains("key [3, 5, 4]"));
  CHECK_THAT(sdpa(q, k, v, {.attn_mask = ones({3, 4}, {.dtype = kBool})}),
             Contains("attn_mask of shape [3, 4]") && Contains("[2, 3, 5]"));
  CHECK_THAT(sdpa(q, k, v, {.attn_mask = ones({3, 5}, {.dtype = kInt64})}), Contains("bool") && Contains("int64"));
  CHECK_THAT(sdpa(q, k, v, {.attn_mask = ones({3, 5}, {.dtype = kBool}), .is_causal = true}),
             Contains("attn_mask and is_causal"));
  CHECK_THAT(sdpa(q, k, v, {.dropout_p = 1.5}), Contains("dropout_p") && Contains("1.5"));
  CHECK_THAT(sdpa(q, Tensor(), v), Contains("key"));
}

TEST_CASE("MultiheadAttention without weights (through scaled_dot_product_attention) equals the path with weights",
          "[nn][sdpa][attention]") {
  manual_seed(41);
  nn::MultiheadAttention mha(8, 2, {.batch_first = true});
  mha.to(kFloat64);
  Generator g(43);
  const TensorOptions o{.dtype = kFloat64};
  Tensor x = randn({2, 5, 8}, o, &g), mem = randn({2, 6, 8}, o, &g);
  auto padding = [](int64_t S) { return ge(arange(S).reshape({1, S}), tensor(std::vector<int64_t>{S, 3}, Shape{2, 1})); };
  Tensor bool_mask = logical_not(random_bool_mask({5, 6}, g));  // MultiheadAttention's masks: true = excluded
  Tensor float_mask = randn({2 * 2, 5, 5}, o, &g);
  SECTION("no mask, cross-attention") {
    check_close(mha.forward(x, mem, mem, {}, false).output, doubles(mha.forward(x, mem, mem, {}, true).output), 1e-12);
  }
  SECTION("key padding and a bool attn_mask") {
    check_close(mha.forward(x, mem, mem, padding(6), false, bool_mask).output,
                doubles(mha.forward(x, mem, mem, padding(6), true, bool_mask).output), 1e-12);
  }
  SECTION("key padding, a float attn_mask and is_causal") {
    check_close(mha.forward(x, x, x, padding(5), false, float_mask, true, true).output,
                doubles(mha.forward(x, x, x, padding(5), true, float_mask, true, true).output), 1e-12);
  }
  SECTION("is_causal alone") {
    check_close(mha.forward(x, x, x, {}, false, {}, true, true).output,
                doubles(mha.forward(x, x, x, {}, true, {}, true, true).output), 1e-12);
  }
}

}  // namespace chorus
