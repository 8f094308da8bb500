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
#include "autograd/node.h"
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

// [Fused CPU attention] (nn/functional/attention.cpp): float32 on the CPU runs each block of query
// rows in one pass (kernels/cpu/attention.cpp); CHORUS_FUSED_ATTENTION=0 keeps the composite of
// basic ops, whose draws, softmax and products it repeats. Both against each other and against the
// composite in float64 (which never fuses), values and every gradient, over the cases the fused
// path takes: heads permuted out of [B, T, H, d], additive, boolean and broadcast masks, a fully
// masked row, is_causal with L < S and L > S, several row blocks (S = 5000: 16 rows a block),
// dropout from one seeded generator, a scale that is not a power of two, 2-D inputs, 2 threads.
namespace {

struct FusedCase {
  const char* name;
  Shape q, k, v;
  int mask = 0;  // 0 none, 1 additive [B, 1, 1, S] with -1e9 entries, 2 bool [L, S], 3 -inf row, 4 additive [1, S]
  bool causal = false, permuted = false;
  double dropout = 0.0;
  int threads = 1;
  bool key_grad = true;
};

struct FusedRun {
  TensorList values;  // output, then the gradients of q, k (when it needs one) and v
  std::string node;
};

FusedRun run_attention(const FusedCase& c, bool fused, DType dtype) {
  const char* old = std::getenv("CHORUS_FUSED_ATTENTION");
  const std::string saved = old ? old : "";
  setenv("CHORUS_FUSED_ATTENTION", fused ? "1" : "0", 1);
  const int threads_before = get_num_threads();
  set_num_threads(c.threads);
  Generator g(5);
  auto input = [&](const Shape& s, bool grad) {
    Tensor t;
    if (c.permuted) {  // [B, H, T, d] viewed out of a [B, T, H, d] tensor
      t = randn({s[0], s[2], s[1], s[3]}, {.dtype = kFloat64}, &g).to(dtype).permute({0, 2, 1, 3});
    } else {
      t = randn(s, {.dtype = kFloat64}, &g).to(dtype);
    }
    return grad ? t.detach().requires_grad_(true) : t.detach();
  };
  Tensor q = input(c.q, true), k = input(c.k, c.key_grad), v = input(c.v, true);
  const int64_t L = c.q[c.q.size() - 2], S = c.k[c.k.size() - 2];
  Tensor mask;
  if (c.mask == 1) {
    mask = mul(lt(rand({c.q[0], 1, 1, S}, {}, &g), 0.3).to(dtype), -1e9);
  } else if (c.mask == 2) {
    mask = random_bool_mask({L, S}, g);
  } else if (c.mask == 3) {
    Tensor m = randn({c.q[0], c.q[1], L, S}, {.dtype = kFloat64}, &g).to(dtype);
    m.select(2, 1).fill_(-kInf);  // query row 1 of every head may attend to no key
    mask = m;
  } else if (c.mask == 4) {
    mask = randn({1, S}, {.dtype = kFloat64}, &g).to(dtype);
  }
  Generator drop(123);
  Tensor out = F::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .dropout_p = c.dropout,
                                                         .is_causal = c.causal, .generator = &drop});
  Shape out_shape = out.sizes();
  Tensor weight = randn(out_shape, {.dtype = kFloat64}, &g).to(dtype);
  FusedRun r;
  r.node = out.grad_fn() ? out.grad_fn()->name() : "";
  mul(out, weight).sum().backward();
  r.values = {out.detach(), q.grad()};
  if (c.key_grad) r.values.push_back(k.grad());
  else CHECK_FALSE(k.grad().defined());
  r.values.push_back(v.grad());
  set_num_threads(threads_before);
  if (old) setenv("CHORUS_FUSED_ATTENTION", saved.c_str(), 1);
  else unsetenv("CHORUS_FUSED_ATTENTION");
  return r;
}

double max_abs_of(const Tensor& t) { return t.numel() == 0 ? 0.0 : abs(t.to(kFloat64)).max().item<double>(); }

}  // namespace

TEST_CASE("the fused CPU attention equals the composite: values and gradients, masks, causal blocks, dropout",
          "[nn][sdpa][fused]") {
  const FusedCase cases[] = {
      {"BERT-like: permuted heads, additive [B,1,1,S] mask, dropout 0.2", {2, 3, 10, 8}, {2, 3, 10, 8}, {2, 3, 10, 8}, 1,
       false, true, 0.2},
      {"bool [L,S] mask, E = 5 (scale 1/sqrt(5)), Ev = 3", {2, 2, 7, 5}, {2, 2, 9, 5}, {2, 2, 9, 3}, 2},
      {"a fully masked query row", {1, 2, 4, 4}, {1, 2, 6, 4}, {1, 2, 6, 4}, 3},
      {"causal, L < S, 3 row blocks of 16", {1, 2, 40, 4}, {1, 2, 5000, 4}, {1, 2, 5000, 4}, 0, true, false, 0.1},
      {"causal, L > S", {1, 2, 50, 4}, {1, 2, 30, 4}, {1, 2, 30, 4}, 0, true},
      {"row blocks without causal, a broadcast [1,S] mask, dropout 0.1", {1, 1, 40, 4}, {1, 1, 5000, 4}, {1, 1, 5000, 4}, 4,
       false, false, 0.1},
      {"16 heads on 2 threads, causal, dropout 0.3", {4, 4, 16, 8}, {4, 4, 16, 8}, {4, 4, 16, 8}, 0, true, false, 0.3, 2},
      {"2-D inputs, the key needing no gradient", {6, 4}, {9, 4}, {9, 4}, 0, false, false, 0.0, 1, false},
  };
  for (const FusedCase& c : cases) {
    INFO(c.name);
    const FusedRun fused = run_attention(c, true, kFloat32), composite = run_attention(c, false, kFloat32),
                   exact = run_attention(c, false, kFloat64);
    // The fused path ran (its own backward node), the composite did not.
    CHECK(fused.node == "ScaledDotProductAttentionBackward");
    CHECK(composite.node != "ScaledDotProductAttentionBackward");
    REQUIRE(fused.values.size() == composite.values.size());
    for (size_t i = 0; i < fused.values.size(); ++i) {
      INFO("tensor " << i << " (output, then the gradients)");
      REQUIRE(fused.values[i].sizes() == composite.values[i].sizes());
      // float32: the products round differently when a block is a part of the scores; sums over
      // up to 5000 keys of softmax weights stay within a few units of float32's last place.
      const double scale = std::max(1.0, max_abs_of(exact.values[i]));
      const double vs_composite = max_abs_of(sub(fused.values[i].to(kFloat64), composite.values[i].to(kFloat64)));
      const double vs_exact = max_abs_of(sub(fused.values[i].to(kFloat64), exact.values[i]));
      const double composite_vs_exact = max_abs_of(sub(composite.values[i].to(kFloat64), exact.values[i]));
      CHECK(vs_composite <= 2e-5 * scale);
      // (float64's dropout draws other numbers than float32's: no exact reference with dropout.)
      if (c.dropout == 0.0) {
        CHECK(vs_exact <= 2e-5 * scale);
        CHECK(composite_vs_exact <= 2e-5 * scale);
      }
    }
    // The fully masked row: zeros in the output and in the query's gradient.
    if (c.mask == 3) {
      CHECK(max_abs_of(fused.values[0].select(2, 1)) == 0.0);
      CHECK(max_abs_of(fused.values[1].select(2, 1)) == 0.0);
    }
  }
}

// Without CHORUS_FUSED_ATTENTION the fused path runs for is_causal where a head's scores exceed one
// block of 64 K floats (long causal sequences, whose blocks skip keys), and nowhere else: it
// measured no faster at BERT's 128 tokens nor without the causal mask.
TEST_CASE("the fused CPU attention runs by default only for long causal sequences", "[nn][sdpa][fused]") {
  const char* old = std::getenv("CHORUS_FUSED_ATTENTION");
  const std::string saved = old ? old : "";
  unsetenv("CHORUS_FUSED_ATTENTION");
  auto node = [](int64_t L, int64_t S, DType dtype, bool causal = true) {
    Tensor q = randn({1, 2, L, 8}, {.dtype = dtype}).requires_grad_(true);
    Tensor kv = randn({1, 2, S, 8}, {.dtype = dtype});
    return F::scaled_dot_product_attention(q, kv, kv, {.is_causal = causal}).grad_fn()->name();
  };
  CHECK(node(128, 128, kFloat32) != "ScaledDotProductAttentionBackward");
  CHECK(node(256, 256, kFloat32) != "ScaledDotProductAttentionBackward");  // exactly one block
  CHECK(node(257, 256, kFloat32) == "ScaledDotProductAttentionBackward");
  CHECK(node(1024, 1024, kFloat32) == "ScaledDotProductAttentionBackward");
  CHECK(node(1024, 1024, kFloat64) != "ScaledDotProductAttentionBackward");  // float32 only
  CHECK(node(1024, 1024, kFloat32, false) != "ScaledDotProductAttentionBackward");  // causal only
  if (old) setenv("CHORUS_FUSED_ATTENTION", saved.c_str(), 1);
}

}  // namespace chorus
