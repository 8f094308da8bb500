// MultiheadAttention, TransformerEncoderLayer and TransformerEncoder against references written here
// in plain double loops from the modules' own weights: scaled dot-product attention per head with
// key padding, causal, boolean and additive masks; post- and pre-norm encoder layers with relu and
// gelu; gradcheck at tiny sizes in float64; independent parameters per stacked layer.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
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

using Vec = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

// rows x [rows, in] -> x W^T + b, W [out, in].
Vec ref_linear(const Vec& x, int64_t rows, const Vec& w, const Vec& b, int64_t in, int64_t out) {
  Vec y(rows * out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

Vec ref_layer_norm(const Vec& x, int64_t cols, const Vec& w, const Vec& b, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c] / cols;
    for (int64_t c = 0; c < cols; ++c) var += std::pow(x[r * cols + c] - mean, 2) / cols;
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (x[r * cols + c] - mean) / std::sqrt(var + eps) * w[c] + b[c];
  }
  return y;
}

// The additive mask the reference applies to score (n, h, i, j); -inf removes a key.
using MaskFn = std::function<double(int64_t n, int64_t h, int64_t i, int64_t j)>;

struct MhaReference {
  Vec output;   // [N, L, E]
  Vec weights;  // [N, H, L, S]
};

// Multi-head attention as PyTorch documents it, batch-first, from the module's own parameters:
// Q = q Wq^T + bq (rows 0..E of in_proj), K and V likewise; per head, softmax(Q K^T / sqrt(D) + mask) V;
// heads concatenated, then out_proj.
MhaReference reference_mha(nn::MultiheadAttention& mha, const Tensor& q, const Tensor& k, const Tensor& v,
                           const MaskFn& mask) {
  const int64_t N = q.size(0), L = q.size(1), S = k.size(1), E = mha.embed_dim, H = mha.num_heads, D = E / H;
  const Vec w = doubles(mha.in_proj_weight), b = doubles(mha.in_proj_bias);
  auto part = [&](const Vec& all, int64_t i, int64_t len) { return Vec(all.begin() + i * len, all.begin() + (i + 1) * len); };
  const Vec Q = ref_linear(doubles(q), N * L, part(w, 0, E * E), part(b, 0, E), E, E);
  const Vec K = ref_linear(doubles(k), N * S, part(w, 1, E * E), part(b, 1, E), E, E);
  const Vec V = ref_linear(doubles(v), N * S, part(w, 2, E * E), part(b, 2, E), E, E);
  MhaReference ref{Vec(N * L * E), Vec(N * H * L * S)};
  Vec concat(N * L * E, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        Vec s(S);
        double mx = -kInf;
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += Q[(n * L + i) * E + h * D + d] * K[(n * S + j) * E + h * D + d];
          s[j] = dot / std::sqrt(static_cast<double>(D)) + mask(n, h, i, j);
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < S; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < S; ++j) {
          const double a = s[j] / z;
          ref.weights[((n * H + h) * L + i) * S + j] = a;
          for (int64_t d = 0; d < D; ++d) concat[(n * L + i) * E + h * D + d] += a * V[(n * S + j) * E + h * D + d];
        }
      }
  ref.output = ref_linear(concat, N * L, doubles(mha.out_proj->weight), doubles(mha.out_proj->bias), E, E);
  return ref;
}

// Averages [N, H, L, S] over heads -> [N, L, S].
Vec head_mean(const Vec& w, int64_t N, int64_t H, int64_t L, int64_t S) {
  Vec out(N * L * S, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t x = 0; x < L * S; ++x) out[n * L * S + x] += w[(n * H + h) * L * S + x] / H;
  return out;
}

// The module initializes both biases to zero; random ones make the reference check them too.
void randomize_biases(nn::Module& m, Generator& gen) {
  NoGradGuard no_grad;
  for (auto& [name, t] : m.named_parameters()) {
    if (name.find("bias") != std::string::npos) t.copy_(randn(t.sizes(), {.dtype = t.dtype()}, &gen));
  }
}

const MaskFn kNoMask = [](int64_t, int64_t, int64_t, int64_t) { return 0.0; };

TEST_CASE("MultiheadAttention (batch_first) matches per-head attention in double from its own weights",
          "[nn][attention]") {
  Generator gen(401);
  manual_seed(401);
  const int64_t N = 2, L = 3, S = 5, E = 8, H = 2;
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype " << dtype_name(dt));
    nn::MultiheadAttention mha(E, H, {.batch_first = true});
    if (dt == kFloat64) mha.to(kFloat64);
    randomize_biases(mha, gen);
    Tensor q = randn({N, L, E}, {.dtype = dt}, &gen), k = randn({N, S, E}, {.dtype = dt}, &gen),
           v = randn({N, S, E}, {.dtype = dt}, &gen);
    const double tol = dt == kFloat32 ? 2e-5 : 1e-12;
    MhaReference ref = reference_mha(mha, q, k, v, kNoMask);
    auto out = mha.forward(q, k, v);
    CHECK(out.output.sizes() == Shape{N, L, E});
    CHECK(out.weights.sizes() == Shape{N, L, S});
    check_close(out.output, ref.output, tol);
    check_close(out.weights, head_mean(ref.weights, N, H, L, S), tol);
    auto per_head = mha.forward(q, k, v, Tensor(), true, Tensor(), /*average_attn_weights=*/false);
    CHECK(per_head.weights.sizes() == Shape{N, H, L, S});
    check_close(per_head.weights, ref.weights, tol);
    CHECK_FALSE(mha.forward(q, k, v, Tensor(), /*need_weights=*/false).weights.defined());
    // Self-attention through the single-input forward.
    check_close(mha.forward(q), reference_mha(mha, q, q, q, kNoMask).output, tol);
  }
}

TEST_CASE("MultiheadAttention with batch_first = false takes [L, N, E] and agrees with batch_first", "[nn][attention]") {
  Generator gen(402);
  nn::MultiheadAttention bf(6, 3, {.batch_first = true}), sf(6, 3);
  randomize_biases(bf, gen);
  sf.load_state_dict(bf.state_dict());
  Tensor q = randn({2, 4, 6}, {}, &gen), k = randn({2, 3, 6}, {}, &gen);
  auto a = bf.forward(q, k, k);
  auto b = sf.forward(q.transpose(0, 1), k.transpose(0, 1), k.transpose(0, 1));
  CHECK(b.output.sizes() == Shape{4, 2, 6});
  check_close(b.output.transpose(0, 1), doubles(a.output), 1e-6);
  check_close(b.weights, doubles(a.weights), 1e-6);
}

TEST_CASE("MultiheadAttention masks: key padding, causal, boolean and additive float attn_mask", "[nn][attention]") {
  Generator gen(403);
  manual_seed(403);
  const int64_t N = 2, L = 4, S = 4, E = 6, H = 3;
  nn::MultiheadAttention mha(E, H, {.batch_first = true});
  mha.to(kFloat64);
  randomize_biases(mha, gen);
  Tensor x = randn({N, L, E}, {.dtype = kFloat64}, &gen);
  const double tol = 1e-12;

  SECTION("key_padding_mask: padded keys get exactly zero weight") {
    // Sample 0 pads its last key, sample 1 its first two.
    Tensor pad = tensor(std::vector<uint8_t>{0, 0, 0, 1, 1, 1, 0, 0}, Shape{N, S}).to(kBool);
    auto out = mha.forward(x, x, x, pad, true, Tensor(), false);
    MaskFn m = [](int64_t n, int64_t, int64_t, int64_t j) { return (n == 0 ? j == 3 : j < 2) ? -kInf : 0.0; };
    MhaReference ref = reference_mha(mha, x, x, x, m);
    check_close(out.output, ref.output, tol);
    check_close(out.weights, ref.weights, tol);
    Vec w = doubles(out.weights);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        CHECK(w[((0 * H + h) * L + i) * S + 3] == 0.0);
        CHECK(w[((1 * H + h) * L + i) * S + 0] == 0.0);
        CHECK(w[((1 * H + h) * L + i) * S + 1] == 0.0);
      }
    // A float key_padding_mask is added to the scores.
    Tensor fpad = tensor(std::vector<double>{0, -1.5, 0.5, 0, 2, 0, 0, -3}, Shape{N, S});
    Vec fp = doubles(fpad);
    MhaReference fref = reference_mha(mha, x, x, x, [&](int64_t n, int64_t, int64_t, int64_t j) { return fp[n * S + j]; });
    check_close(mha.forward(x, x, x, fpad).output, fref.output, tol);
  }

  SECTION("is_causal and the equivalent boolean attn_mask: position i sees keys 0..i") {
    MaskFn causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -kInf : 0.0; };
    MhaReference ref = reference_mha(mha, x, x, x, causal);
    auto out = mha.forward(x, x, x, Tensor(), true, Tensor(), false, /*is_causal=*/true);
    check_close(out.output, ref.output, tol);
    check_close(out.weights, ref.weights, tol);
    Vec w = doubles(out.weights);
    for (int64_t nh = 0; nh < N * H; ++nh)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = i + 1; j < S; ++j) CHECK(w[(nh * L + i) * S + j] == 0.0);
    Tensor bool_mask = gt(arange(S).unsqueeze(0), arange(L).unsqueeze(1));
    check_close(mha.forward(x, x, x, Tensor(), false, bool_mask).output, ref.output, tol);
    // A later query position cannot change an earlier output under the causal mask.
    Tensor x2 = x.clone();
    {
      NoGradGuard no_grad;
      x2.narrow(1, L - 1, 1).fill_(5.0);
    }
    Tensor o1 = mha.forward(x, x, x, Tensor(), false, Tensor(), true, true).output.narrow(1, 0, L - 1);
    Tensor o2 = mha.forward(x2, x2, x2, Tensor(), false, Tensor(), true, true).output.narrow(1, 0, L - 1);
    check_close(o2, doubles(o1), 1e-12);
  }

  SECTION("additive float attn_mask, [L, S] and per-head [N*H, L, S]") {
    Tensor m2 = randn({L, S}, {.dtype = kFloat64}, &gen);
    Vec m2v = doubles(m2);
    MhaReference ref = reference_mha(mha, x, x, x, [&](int64_t, int64_t, int64_t i, int64_t j) { return m2v[i * S + j]; });
    check_close(mha.forward(x, x, x, Tensor(), false, m2).output, ref.output, tol);
    Tensor m3 = randn({N * H, L, S}, {.dtype = kFloat64}, &gen);
    Vec m3v = doubles(m3);
    MhaReference ref3 = reference_mha(
        mha, x, x, x, [&](int64_t n, int64_t h, int64_t i, int64_t j) { return m3v[((n * H + h) * L + i) * S + j]; });
    auto out3 = mha.forward(x, x, x, Tensor(), true, m3, false);
    check_close(out3.output, ref3.output, tol);
    check_close(out3.weights, ref3.weights, tol);
    // Masks combine: additive attn_mask plus key padding.
    Tensor pad = tensor(std::vector<uint8_t>{0, 1, 0, 0, 0, 0, 0, 1}, Shape{N, S}).to(kBool);
    MhaReference both = reference_mha(mha, x, x, x, [&](int64_t n, int64_t, int64_t i, int64_t j) {
      return ((n == 0 && j == 1) || (n == 1 && j == 3)) ? -kInf : m2v[i * S + j];
    });
    check_close(mha.forward(x, x, x, pad, false, m2).output, both.output, tol);
  }
}

TEST_CASE("MultiheadAttention gradients of inputs and every parameter pass gradcheck (E=4, 2 heads, seq 3)",
          "[nn][attention][gradcheck]") {
  Generator gen(404);
  manual_seed(404);
  nn::MultiheadAttention mha(4, 2, {.batch_first = true});
  mha.to(kFloat64);
  randomize_biases(mha, gen);
  const TensorOptions grad64{.dtype = kFloat64, .requires_grad = true};
  Tensor q = randn({2, 3, 4}, grad64, &gen), k = randn({2, 3, 4}, grad64, &gen), v = randn({2, 3, 4}, grad64, &gen);
  Tensor pad = tensor(std::vector<uint8_t>{0, 0, 1, 0, 0, 0}, Shape{2, 3}).to(kBool);
  Tensor fmask = randn({3, 3}, {.dtype = kFloat64}, &gen);
  TensorList inputs{q, k, v};
  for (const Tensor& p : mha.parameters()) inputs.push_back(p);  // perturbed in place by gradcheck
  REQUIRE(inputs.size() == 7);
  CHECK(autograd::gradcheck([&](const TensorList& in) { return mha.forward(in[0], in[1], in[2]).output; }, inputs));
  CHECK(autograd::gradcheck(
      [&](const TensorList& in) { return mha.forward(in[0], in[1], in[2], pad, false, fmask, true, true).output; },
      inputs));
  // The attention weights are differentiable too.
  CHECK(autograd::gradcheck([&](const TensorList& in) { return mha.forward(in[0], in[1], in[2]).weights; },
                            {q, k, v}));
}

TEST_CASE("MultiheadAttention in training returns the attention weights after dropout, the ones applied to V",
          "[nn][attention]") {
  Generator gen(405);
  manual_seed(405);
  const int64_t N = 2, L = 6, E = 4, H = 2, D = 2;
  nn::MultiheadAttention mha(E, H, {.dropout = 0.5, .batch_first = true});
  mha.to(kFloat64);
  randomize_biases(mha, gen);
  Tensor x = randn({N, L, E}, {.dtype = kFloat64}, &gen);
  auto out = mha.forward(x, x, x, Tensor(), true, Tensor(), /*average_attn_weights=*/false);
  // Recompute the output from the returned per-head weights: out_proj(concat_h(W_h V_h)).
  const Vec w = doubles(out.weights), ipw = doubles(mha.in_proj_weight), ipb = doubles(mha.in_proj_bias);
  const Vec V = ref_linear(doubles(x), N * L, Vec(ipw.begin() + 2 * E * E, ipw.end()), Vec(ipb.begin() + 2 * E, ipb.end()),
                           E, E);
  Vec concat(N * L * E, 0.0);
  int64_t dropped = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j) {
          const double a = w[((n * H + h) * L + i) * L + j];
          dropped += a == 0.0;
          for (int64_t d = 0; d < D; ++d) concat[(n * L + i) * E + h * D + d] += a * V[(n * L + j) * E + h * D + d];
        }
  CHECK(dropped > 0);  // 144 weights at p = 0.5: some were dropped
  check_close(out.output,
              ref_linear(concat, N * L, doubles(mha.out_proj->weight), doubles(mha.out_proj->bias), E, E), 1e-12);
  mha.eval();
  Vec rows = doubles(mha.forward(x, x, x).weights.sum({-1}));
  for (double r : rows) CHECK(r == Approx(1.0));
}

TEST_CASE("MultiheadAttention rejects bad head counts, shapes and masks", "[nn][attention][errors]") {
  CHECK_THAT(error_message([] { nn::MultiheadAttention(6, 4); }), Catch::Contains("divisible by num_heads (4)"));
  nn::MultiheadAttention mha(4, 2, {.batch_first = true});
  Tensor x = randn({2, 3, 4});
  CHECK_THAT(error_message([&] { mha.forward(randn({2, 3, 5})); }), Catch::Contains("[2, 3, 5]"));
  CHECK_THAT(error_message([&] { mha.forward(x, x, x, Tensor(), true, zeros({3, 4})); }),
             Catch::Contains("attn_mask of shape [3, 4] must be [L=3, S=3]"));
  CHECK_THAT(error_message([&] { mha.forward(x, x, x, zeros({3, 3}, {.dtype = kBool})); }),
             Catch::Contains("key_padding_mask of shape [3, 3] must be [N=2, S=3]"));
  CHECK_THAT(error_message([&] { mha.forward(x, randn({3, 3, 4}), randn({3, 3, 4})); }), Catch::Contains("disagree"));
}

// ------------------------------------------------------------------ TransformerEncoderLayer
// The encoder layer from its submodules' documented math, on [N, L, E] in double:
//   post-norm: x = norm1(x + SA(x)); x = norm2(x + FF(x))
//   pre-norm:  x = x + SA(norm1(x)); x = x + FF(norm2(x))
// SA = self-attention with the given mask; FF = linear2(act(linear1(x))).
Vec reference_encoder_layer(nn::TransformerEncoderLayer& layer, const Tensor& src, const MaskFn& mask) {
  const int64_t N = src.size(0), L = src.size(1), E = src.size(2);
  const int64_t FFD = layer.linear1->out_features;
  const double eps = layer.options.layer_norm_eps;
  auto norm = [&](const nn::LayerNorm& ln, const Vec& x) {
    return ref_layer_norm(x, E, doubles(ln.weight), doubles(ln.bias), eps);
  };
  auto sa = [&](const Vec& x) {
    Tensor t = tensor(x, Shape{N, L, E});
    return reference_mha(*layer.self_attn, t, t, t, mask).output;
  };
  auto ff = [&](const Vec& x) {
    Vec h = ref_linear(x, N * L, doubles(layer.linear1->weight), doubles(layer.linear1->bias), E, FFD);
    for (double& e : h) {
      e = layer.options.activation == "gelu" ? 0.5 * e * (1.0 + std::erf(e / std::sqrt(2.0))) : std::max(e, 0.0);
    }
    return ref_linear(h, N * L, doubles(layer.linear2->weight), doubles(layer.linear2->bias), FFD, E);
  };
  auto add = [](Vec a, const Vec& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  Vec x = doubles(src);
  if (layer.options.norm_first) {
    x = add(x, sa(norm(*layer.norm1, x)));
    x = add(x, ff(norm(*layer.norm2, x)));
  } else {
    x = norm(*layer.norm1, add(x, sa(x)));
    x = norm(*layer.norm2, add(x, ff(x)));
  }
  return x;
}

// LayerNorm starts at ones/zeros; random affine parameters make the reference check that they are used.
void randomize_norms(nn::Module& m, Generator& gen) {
  NoGradGuard no_grad;
  for (auto& [name, t] : m.named_parameters()) {
    if (name.find("norm") != std::string::npos) t.copy_(randn(t.sizes(), {.dtype = t.dtype()}, &gen) * 0.5 + 1.0);
  }
}

TEST_CASE("TransformerEncoderLayer matches its documented composition: post- and pre-norm, relu and gelu",
          "[nn][transformer]") {
  Generator gen(411);
  manual_seed(411);
  const int64_t N = 2, L = 4, E = 8;
  Tensor pad = tensor(std::vector<uint8_t>{0, 0, 0, 1, 0, 0, 0, 0}, Shape{N, L}).to(kBool);
  MaskFn pad_fn = [](int64_t n, int64_t, int64_t, int64_t j) { return n == 0 && j == 3 ? -kInf : 0.0; };
  MaskFn causal_fn = [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -kInf : 0.0; };
  for (bool norm_first : {false, true}) {
    for (const char* act : {"relu", "gelu"}) {
      INFO("norm_first " << norm_first << " activation " << act);
      nn::TransformerEncoderLayer layer(
          E, 2, {.dim_feedforward = 16, .dropout = 0.1, .activation = act, .batch_first = true, .norm_first = norm_first});
      layer.to(kFloat64);
      layer.eval();  // dropout off
      randomize_biases(layer, gen);
      randomize_norms(layer, gen);
      Tensor src = randn({N, L, E}, {.dtype = kFloat64}, &gen);
      Tensor y = layer.forward(src);
      CHECK(y.sizes() == Shape{N, L, E});
      check_close(y, reference_encoder_layer(layer, src, kNoMask), 1e-11);
      check_close(layer.forward(src, Tensor(), pad), reference_encoder_layer(layer, src, pad_fn), 1e-11);
      check_close(layer.forward(src, Tensor(), Tensor(), /*is_causal=*/true), reference_encoder_layer(layer, src, causal_fn),
                  1e-11);
    }
  }
}

TEST_CASE("TransformerEncoderLayer: PyTorch's parameter names, dropout only in training, gradcheck",
          "[nn][transformer][gradcheck]") {
  Generator gen(412);
  manual_seed(412);
  nn::TransformerEncoderLayer layer(4, 2, {.dim_feedforward = 6, .dropout = 0.5, .batch_first = true});
  std::vector<std::string> names;
  for (const auto& [n, t] : layer.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                                          "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                                          "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"});
  Tensor src = randn({2, 3, 4}, {}, &gen);
  layer.train();
  manual_seed(1);
  Tensor t1 = layer.forward(src);
  manual_seed(1);
  CHECK(equal(t1, layer.forward(src)));  // dropout drawn from the seeded default generator
  layer.eval();
  Tensor e1 = layer.forward(src);
  CHECK(equal(e1, layer.forward(src)));
  CHECK_FALSE(allclose(t1, e1));

  layer.to(kFloat64);
  randomize_biases(layer, gen);
  randomize_norms(layer, gen);
  for (bool norm_first : {false, true}) {
    layer.options.norm_first = norm_first;
    INFO("norm_first " << norm_first);
    TensorList inputs{randn({2, 3, 4}, {.dtype = kFloat64, .requires_grad = true}, &gen)};
    for (const Tensor& p : layer.parameters()) inputs.push_back(p);
    CHECK(autograd::gradcheck([&](const TensorList& in) { return layer.forward(in[0]); }, inputs));
  }
  CHECK_THAT(error_message([] { nn::TransformerEncoderLayer(4, 2, {.activation = "swish"}); }),
             Catch::Contains("'relu' or 'gelu', got 'swish'"));
}

TEST_CASE("TransformerEncoder stacks N layers with independent parameters and an optional final norm",
          "[nn][transformer]") {
  Generator gen(421);
  manual_seed(421);
  const int64_t E = 8;
  nn::TransformerEncoder enc(E, 2, 3, {.dim_feedforward = 12, .dropout = 0.0, .batch_first = true}, /*final_norm=*/true);
  REQUIRE(enc.layers->size() == 3);
  REQUIRE(enc.norm);
  auto names = enc.state_dict();
  CHECK(names.front().first == "layers.0.self_attn.in_proj_weight");
  CHECK(names.back().first == "norm.bias");
  CHECK(enc.named_parameters().size() == 3 * 12 + 2);
  // Independent: different initial values and distinct storage.
  auto l0 = enc.layers->at<nn::TransformerEncoderLayer>(0);
  auto l1 = enc.layers->at<nn::TransformerEncoderLayer>(1);
  auto l2 = enc.layers->at<nn::TransformerEncoderLayer>(2);
  CHECK_FALSE(equal(l0->linear1->weight.detach(), l1->linear1->weight.detach()));
  CHECK_FALSE(equal(l1->self_attn->in_proj_weight.detach(), l2->self_attn->in_proj_weight.detach()));
  CHECK(l0->linear1->weight.storage().get() != l1->linear1->weight.storage().get());
  randomize_biases(enc, gen);
  randomize_norms(enc, gen);

  Tensor src = randn({2, 5, E}, {}, &gen);
  Tensor pad = tensor(std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 0, 0, 0, 0}, Shape{2, 5}).to(kBool);
  Tensor expected = enc.norm->forward(l2->forward(l1->forward(l0->forward(src, Tensor(), pad), Tensor(), pad), Tensor(), pad));
  check_close(enc.forward(src, Tensor(), pad), doubles(expected), 1e-6);
  // Without the final norm, the output is the last layer's.
  nn::TransformerEncoder bare(E, 2, 2, {.dim_feedforward = 12, .dropout = 0.0, .batch_first = true});
  CHECK_FALSE(bare.norm);
  auto b0 = bare.layers->at<nn::TransformerEncoderLayer>(0), b1 = bare.layers->at<nn::TransformerEncoderLayer>(1);
  CHECK(equal(bare.forward(src), b1->forward(b0->forward(src))));
  // Gradients reach every layer's own parameters, separately.
  enc.forward(src).pow(2).sum().backward();
  for (const auto& [n, p] : enc.named_parameters()) {
    INFO(n);
    REQUIRE(p.grad().defined());
  }
  CHECK_FALSE(equal(l0->linear1->weight.grad(), l1->linear1->weight.grad()));
  CHECK_THAT(error_message([] { nn::TransformerEncoder(8, 2, 0); }), Catch::Contains("num_layers must be positive"));
}

}  // namespace
}  // namespace chorus
