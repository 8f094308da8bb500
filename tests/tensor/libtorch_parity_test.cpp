// chorus against libtorch 1.13 (Debian's libtorch-dev, linked here) on the same random float64
// inputs: forward values and the gradients of sum(out * g) for the ops added for issue 18 (unary
// step and special functions, composite ops, einsum); bool and index results compared exactly.
#include "tests/libtorch_testing.h"

#include <functional>
#include <string>
#include <vector>

#include "nn/functional.h"
#include "tensor/ops.h"

namespace {

using chorus::Tensor;
using CFn = std::function<Tensor(const chorus::TensorList&)>;
using TFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

using chorus::testing::max_diff;
using chorus::testing::to_torch;

struct Case {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  CFn chorus_fn;
  TFn torch_fn;
  bool differentiable = true;
  double scale = 1.0, shift = 0.0;  // inputs are shift + scale * randn
};

void check(const Case& c) {
  INFO(c.name);
  chorus::manual_seed(1234);
  chorus::TensorList in;
  std::vector<torch::Tensor> tin;
  for (const auto& s : c.shapes) {
    Tensor x = chorus::add(chorus::mul(chorus::randn(s, {.dtype = chorus::kFloat64}), c.scale), c.shift);
    in.push_back(c.differentiable ? x.requires_grad_() : x);
    torch::Tensor tx = to_torch(x);
    if (c.differentiable) tx.requires_grad_();
    tin.push_back(tx);
  }
  const Tensor out = c.chorus_fn(in);
  const torch::Tensor tout = c.torch_fn(tin);
  CHECK(max_diff(out, tout) < 1e-12);
  if (!c.differentiable) return;
  const Tensor g = chorus::randn(out.sizes(), {.dtype = chorus::kFloat64});
  chorus::sum(chorus::mul(out, g)).backward();
  (tout * to_torch(g)).sum().backward();
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("gradient of input " << i);
    if (!tin[i].grad().defined()) {  // an input both sides use only detached (a label)
      CHECK_FALSE(in[i].grad().defined());
      continue;
    }
    REQUIRE(in[i].grad().defined());
    CHECK(max_diff(in[i].grad(), tin[i].grad()) < 1e-12);
  }
}

}  // namespace

TEST_CASE("new ops equal libtorch 1.13's, forward and backward", "[tensor][libtorch]") {
  torch::set_num_threads(1);
  namespace c = chorus;
  using L = const c::TensorList&;
  using T = const std::vector<torch::Tensor>&;
  namespace F = chorus::nn::functional;
  const std::vector<Case> cases = {
      {"floor", {{4, 5}}, [](L x) { return c::floor(c::mul(x[0], 3.0)); }, [](T x) { return torch::floor(x[0] * 3.0); }},
      {"ceil", {{4, 5}}, [](L x) { return c::ceil(c::mul(x[0], 3.0)); }, [](T x) { return torch::ceil(x[0] * 3.0); }},
      {"round", {{4, 5}}, [](L x) { return c::round(c::mul(x[0], 3.0)); }, [](T x) { return torch::round(x[0] * 3.0); }},
      {"trunc", {{4, 5}}, [](L x) { return c::trunc(c::mul(x[0], 3.0)); }, [](T x) { return torch::trunc(x[0] * 3.0); }},
      {"sign", {{4, 5}}, [](L x) { return c::sign(x[0]); }, [](T x) { return torch::sign(x[0]); }},
      {"erf", {{4, 5}}, [](L x) { return c::erf(x[0]); }, [](T x) { return torch::erf(x[0]); }},
      {"erfinv", {{4, 5}}, [](L x) { return c::erfinv(c::mul(c::tanh(x[0]), 0.95)); },
       [](T x) { return torch::erfinv(torch::tanh(x[0]) * 0.95); }},
      {"expm1", {{4, 5}}, [](L x) { return c::expm1(x[0]); }, [](T x) { return torch::expm1(x[0]); }},
      {"log2", {{4, 5}}, [](L x) { return c::log2(c::add(c::abs(x[0]), 0.1)); },
       [](T x) { return torch::log2(x[0].abs() + 0.1); }},
      {"log10", {{4, 5}}, [](L x) { return c::log10(c::add(c::abs(x[0]), 0.1)); },
       [](T x) { return torch::log10(x[0].abs() + 0.1); }},
      {"tril -1", {{2, 4, 5}}, [](L x) { return c::tril(x[0], -1); }, [](T x) { return torch::tril(x[0], -1); }},
      {"triu 2", {{4, 5}}, [](L x) { return c::triu(x[0], 2); }, [](T x) { return torch::triu(x[0], 2); }},
      {"flip", {{3, 4, 5}}, [](L x) { return c::flip(x[0], {0, 2}); }, [](T x) { return torch::flip(x[0], {0, 2}); }},
      {"roll", {{3, 4, 5}}, [](L x) { return c::roll(x[0], {2, -7}, {1, 2}); },
       [](T x) { return torch::roll(x[0], {2, -7}, {1, 2}); }},
      {"roll flat", {{3, 4}}, [](L x) { return c::roll(x[0], {5}); }, [](T x) { return torch::roll(x[0], {5}); }},
      {"repeat", {{2, 3}}, [](L x) { return c::repeat(x[0], {2, 1, 3}); }, [](T x) { return x[0].repeat({2, 1, 3}); }},
      {"tile", {{2, 3}}, [](L x) { return c::tile(x[0], {2}); }, [](T x) { return torch::tile(x[0], {2}); }},
      {"repeat_interleave", {{2, 3}}, [](L x) { return c::repeat_interleave(x[0], 2, 1); },
       [](T x) { return torch::repeat_interleave(x[0], 2, 1); }},
      {"cumsum", {{3, 40}}, [](L x) { return c::cumsum(x[0], 1); }, [](T x) { return torch::cumsum(x[0], 1); }},
      {"cumprod", {{7, 3}}, [](L x) { return c::cumprod(x[0], 0); }, [](T x) { return torch::cumprod(x[0], 0); }},
      {"dot", {{6}, {6}}, [](L x) { return c::dot(x[0], x[1]); }, [](T x) { return torch::dot(x[0], x[1]); }},
      {"outer", {{3}, {4}}, [](L x) { return c::outer(x[0], x[1]); }, [](T x) { return torch::outer(x[0], x[1]); }},
      {"addcmul", {{3, 4}, {3, 4}, {4}}, [](L x) { return c::addcmul(x[0], x[1], x[2], 0.5); },
       [](T x) { return torch::addcmul(x[0], x[1], x[2], 0.5); }},
      {"addcdiv", {{3, 4}, {3, 4}, {3, 4}}, [](L x) { return c::addcdiv(x[0], x[1], c::add(c::abs(x[2]), 1.0), -2.0); },
       [](T x) { return torch::addcdiv(x[0], x[1], x[2].abs() + 1.0, -2.0); }},
      {"lerp tensor weight", {{5}, {5}, {5}}, [](L x) { return c::lerp(x[0], x[1], x[2]); },
       [](T x) { return torch::lerp(x[0], x[1], x[2]); }},
      {"clamp tensor bounds", {{4, 5}, {5}, {4, 1}}, [](L x) { return c::clamp(x[0], x[1], c::add(x[2], 1.5)); },
       [](T x) { return torch::clamp(x[0], x[1], x[2] + 1.5); }},
      {"remainder", {{4, 5}, {4, 5}}, [](L x) { return c::remainder(c::mul(x[0], 5.0), c::add(c::abs(x[1]), 0.5)); },
       [](T x) { return torch::remainder(x[0] * 5.0, x[1].abs() + 0.5); }},
      {"fmod", {{4, 5}}, [](L x) { return c::fmod(c::mul(x[0], 5.0), 1.5); },
       [](T x) { return torch::fmod(x[0] * 5.0, 1.5); }},
      {"floor_divide", {{4, 5}}, [](L x) { return c::floor_divide(c::mul(x[0], 5.0), 1.5); },
       [](T x) { return torch::floor_divide(x[0] * 5.0, 1.5); }, false},
      {"sort values", {{4, 6}}, [](L x) { return c::sort(x[0], 1).first; },
       [](T x) { return std::get<0>(torch::sort(x[0], 1)); }},
      {"sort descending indices", {{4, 6}}, [](L x) { return c::sort(x[0], 0, true).second; },
       [](T x) { return std::get<1>(torch::sort(x[0], 0, true)); }, false},
      {"topk values", {{4, 6}}, [](L x) { return c::topk(x[0], 3, 1).first; },
       [](T x) { return std::get<0>(torch::topk(x[0], 3, 1)); }},
      {"topk smallest indices", {{4, 6}}, [](L x) { return c::topk(x[0], 2, 0, false).second; },
       [](T x) { return std::get<1>(torch::topk(x[0], 2, 0, false)); }, false},
      {"masked_select", {{4, 6}}, [](L x) { return c::masked_select(x[0], c::gt(x[0], 0.2)); },
       [](T x) { return torch::masked_select(x[0], x[0] > 0.2); }},
      {"nonzero", {{4, 6}}, [](L x) { return c::nonzero(c::gt(x[0], 0.0)); },
       [](T x) { return torch::nonzero(x[0] > 0.0); }, false},
      {"any/all/isnan/isinf/isfinite", {{4, 6}},
       [](L x) {
         Tensor y = c::div(x[0], c::round(x[0]));  // 0/0 = NaN and x/0 = inf where |x| < 0.5
         return c::stack({c::any(c::isnan(y), 1).to(c::kFloat64), c::all(c::isfinite(y), 1).to(c::kFloat64),
                          c::any(c::isinf(y), 1).to(c::kFloat64)});
       },
       [](T x) {
         torch::Tensor y = x[0] / torch::round(x[0]);
         return torch::stack({y.isnan().any(1).to(torch::kFloat64), y.isfinite().all(1).to(torch::kFloat64),
                              y.isinf().any(1).to(torch::kFloat64)});
       },
       false},
      // Activations and losses (nn/functional).
      {"leaky_relu", {{4, 5}}, [](L x) { return F::leaky_relu(x[0], 0.1); },
       [](T x) { return torch::leaky_relu(x[0], 0.1); }},
      {"elu", {{4, 5}}, [](L x) { return F::elu(c::mul(x[0], 3.0), 0.7); },
       [](T x) { return torch::elu(x[0] * 3.0, 0.7); }},
      {"softplus (across the threshold)", {{4, 5}}, [](L x) { return F::softplus(c::mul(x[0], 15.0), 2.0, 20.0); },
       [](T x) { return torch::softplus(x[0] * 15.0, 2.0, 20.0); }},
      {"hardswish", {{4, 5}}, [](L x) { return F::hardswish(c::mul(x[0], 3.0)); },
       [](T x) { return torch::hardswish(x[0] * 3.0); }},
      {"mish", {{4, 5}}, [](L x) { return F::mish(c::mul(x[0], 3.0)); }, [](T x) { return torch::mish(x[0] * 3.0); }},
      {"prelu per channel", {{2, 3, 4}, {3}}, [](L x) { return F::prelu(x[0], x[1]); },
       [](T x) { return torch::prelu(x[0], x[1]); }},
      {"l1_loss", {{4, 5}, {4, 5}}, [](L x) { return F::l1_loss(x[0], x[1]); },
       [](T x) { return torch::l1_loss(x[0], x[1]); }},
      {"smooth_l1_loss beta 0.5", {{4, 5}, {4, 5}}, [](L x) { return F::smooth_l1_loss(x[0], x[1], F::Reduction::Sum, 0.5); },
       [](T x) { return torch::smooth_l1_loss(x[0], x[1], at::Reduction::Sum, 0.5); }},
      {"huber_loss delta 0.7", {{4, 5}, {4, 5}}, [](L x) { return F::huber_loss(x[0], x[1], F::Reduction::Mean, 0.7); },
       [](T x) { return torch::huber_loss(x[0], x[1], at::Reduction::Mean, 0.7); }},
      {"kl_div batchmean", {{4, 5}, {4, 5}},
       [](L x) { return F::kl_div(c::log_softmax(x[0], 1), c::softmax(x[1], 1), {.batch_mean = true}); },
       [](T x) { return torch::kl_div(torch::log_softmax(x[0], 1), torch::softmax(x[1], 1), at::Reduction::Sum) / 4.0; }},
      {"kl_div log_target", {{4, 5}, {4, 5}},
       [](L x) { return F::kl_div(c::log_softmax(x[0], 1), c::log_softmax(x[1], 1), {.log_target = true}); },
       [](T x) {
         return torch::kl_div(torch::log_softmax(x[0], 1), torch::log_softmax(x[1], 1), at::Reduction::Mean, true);
       }},
      {"binary_cross_entropy", {{4, 5}, {4, 5}},  // (PyTorch: not differentiable in the weight)
       [](L x) {
         return F::binary_cross_entropy(c::sigmoid(x[0]), c::sigmoid(x[1]),
                                        c::arange(1, 6, 1, c::TensorOptions{.dtype = c::kFloat64}));
       },
       [](T x) {
         return torch::binary_cross_entropy(torch::sigmoid(x[0]), torch::sigmoid(x[1]),
                                            torch::arange(1, 6, torch::kFloat64));
       }},
      {"cosine_embedding_loss", {{6, 4}, {6, 4}, {6}},
       [](L x) { return F::cosine_embedding_loss(x[0], x[1], c::sign(x[2].detach()), 0.2); },
       [](T x) { return torch::cosine_embedding_loss(x[0], x[1], torch::sign(x[2].detach()), 0.2); }},
  };
  for (const Case& k : cases) check(k);
}

TEST_CASE("einsum equals libtorch's on the common forms, forward and backward", "[tensor][libtorch][einsum]") {
  torch::set_num_threads(1);
  namespace c = chorus;
  using L = const c::TensorList&;
  using T = const std::vector<torch::Tensor>&;
  auto ein = [](std::string eq, std::vector<std::vector<int64_t>> shapes) {
    return Case{eq, shapes, [eq](L x) { return c::einsum(eq, x); },
                [eq](T x) { return torch::einsum(eq, std::vector<torch::Tensor>(x.begin(), x.end())); }};
  };
  const std::vector<Case> cases = {
      ein("ij,jk->ik", {{3, 4}, {4, 5}}),
      ein("bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}),
      ein("bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}),
      ein("ij,jk", {{3, 4}, {4, 5}}),
      ein("ba,cb", {{3, 4}, {5, 3}}),
      ein("Ab,ba", {{3, 4}, {4, 3}}),
      ein("ii->", {{4, 4}}),
      ein("ii->i", {{4, 4}}),
      ein("ii", {{5, 5}}),
      ein("bii->bi", {{2, 3, 3}}),
      ein("iji->j", {{3, 2, 3}}),
      ein("i,j->ij", {{3}, {4}}),
      ein("i,i->", {{5}, {5}}),
      ein("ij->", {{3, 4}}),
      ein("ij->ji", {{3, 4}}),
      ein("ij", {{3, 4}}),
      ein("...ij,...jk->...ik", {{2, 3, 4, 5}, {3, 5, 2}}),
      ein("...ij,jk", {{2, 3, 4}, {4, 5}}),
      ein("b...,b...->b", {{2, 3, 4}, {2, 3, 4}}),
      ein("...ij->...ji", {{2, 3, 4}}),
      ein("...ij->ij", {{2, 3, 4}}),
      ein("ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}),
      ein("bn,anm,bm->ba", {{2, 3}, {4, 3, 5}, {2, 5}}),
      ein("ij,kj->ikj", {{1, 3}, {4, 3}}),
      ein("bij,bkj->bik", {{1, 2, 3}, {4, 5, 3}}),
  };
  for (const Case& k : cases) check(k);
  // float32 too, on the attention form.
  c::manual_seed(3);
  Tensor q = c::randn({2, 3, 4, 8}), k = c::randn({2, 3, 5, 8});
  torch::Tensor tq = to_torch(q).to(torch::kFloat32), tk = to_torch(k).to(torch::kFloat32);
  Tensor out = c::einsum("bhqd,bhkd->bhqk", {q, k});
  CHECK(out.dtype() == c::kFloat32);
  CHECK(max_diff(out, torch::einsum("bhqd,bhkd->bhqk", {tq, tk})) < 1e-5);
}
