// The activation and loss modules added for issue 18: each module equals its functional form (whose
// values and gradients tests/tensor:libtorch_parity_test checks against libtorch), PReLU's weight
// is a parameter that trains, no NaN gradient from an overflowing unused branch, and bad options
// are refused with a message.
#include <catch2/catch.hpp>

#include <cmath>

#include "nn/nn.h"
#include "tensor/ops.h"

namespace chorus {
namespace F = nn::functional;

TEST_CASE("activation modules equal their functional forms; no NaN gradients at large inputs", "[nn][activation]") {
  manual_seed(1);
  const Tensor x = mul(randn({4, 3, 5}), 4.0);
  CHECK(equal(nn::LeakyReLU(0.2).forward(x), F::leaky_relu(x, 0.2)));
  CHECK(equal(nn::ELU(0.5).forward(x), F::elu(x, 0.5)));
  CHECK(equal(nn::Softplus(2.0, 5.0).forward(x), F::softplus(x, 2.0, 5.0)));
  CHECK(equal(nn::Hardswish().forward(x), F::hardswish(x)));
  CHECK(equal(nn::Mish().forward(x), F::mish(x)));
  // exp(1000) overflows in the branch where() leaves unused: the gradient stays finite.
  Tensor big = tensor(std::vector<float>{1000.f, -1000.f, 0.5f}).requires_grad_();
  sum(add(add(F::elu(big), F::softplus(big)), F::mish(big))).backward();
  CHECK(all(isfinite(big.grad())).item<bool>());
  CHECK_THROWS_WITH(F::softplus(x, 0.0), Catch::Contains("beta is 0; expected a positive number"));
}

TEST_CASE("PReLU: a trained slope per channel", "[nn][activation]") {
  nn::PReLU prelu(3);
  REQUIRE(prelu.parameters().size() == 1);
  CHECK(prelu.named_parameters()[0].first == "weight");
  CHECK(equal(prelu.weight, full({3}, 0.25)));
  const Tensor x = tensor(std::vector<float>{-1, -2, -3, 1, 2, 3}, Shape{2, 3});
  sum(prelu.forward(x)).backward();
  // d/dw_c = sum of the negative inputs of channel c.
  CHECK(equal(prelu.weight.grad(), tensor(std::vector<float>{-1, -2, -3})));
  CHECK_THROWS_WITH(F::prelu(x, ones({4})), Catch::Contains("weight has 4 values; expected 1 or the input's channels"));
  CHECK_THROWS_WITH(nn::PReLU(0), Catch::Contains("num_parameters is 0"));
}

TEST_CASE("loss modules equal the functional losses with their options", "[nn][loss]") {
  manual_seed(2);
  const Tensor a = randn({4, 5}), b = randn({4, 5});
  CHECK(equal(nn::MSELoss().forward(a, b), F::mse_loss(a, b)));
  CHECK(equal(nn::L1Loss(F::Reduction::Sum).forward(a, b), F::l1_loss(a, b, F::Reduction::Sum)));
  CHECK(equal(nn::SmoothL1Loss(F::Reduction::Mean, 0.3).forward(a, b), F::smooth_l1_loss(a, b, F::Reduction::Mean, 0.3)));
  CHECK(equal(nn::HuberLoss(F::Reduction::None, 0.4).forward(a, b), F::huber_loss(a, b, F::Reduction::None, 0.4)));
  const Tensor y = randint(0, 5, {4});
  CHECK(equal(nn::CrossEntropyLoss({.label_smoothing = 0.1}).forward(a, y),
              F::cross_entropy(a, y, {.label_smoothing = 0.1})));
  CHECK(equal(nn::NLLLoss().forward(log_softmax(a, 1), y), F::nll_loss(log_softmax(a, 1), y)));
  const Tensor p = sigmoid(a), t = sigmoid(b);
  CHECK(equal(nn::BCELoss().forward(p, t), F::binary_cross_entropy(p, t)));
  CHECK(equal(nn::BCEWithLogitsLoss().forward(a, t), F::binary_cross_entropy_with_logits(a, t)));
  CHECK(equal(nn::KLDivLoss({.batch_mean = true}).forward(log_softmax(a, 1), softmax(b, 1)),
              F::kl_div(log_softmax(a, 1), softmax(b, 1), {.batch_mean = true})));
  const Tensor s = tensor(std::vector<float>{1, -1, 1, -1});
  CHECK(equal(nn::CosineEmbeddingLoss(0.1).forward(a, b, s), F::cosine_embedding_loss(a, b, s, 0.1)));
  // BCE's log is clamped at -100: p = 0 against t = 1 costs 100, not inf.
  CHECK(F::binary_cross_entropy(zeros({1}), ones({1})).item<float>() == 100.0f);
  CHECK_THROWS_WITH(F::binary_cross_entropy(add(p, 1.0), t), Catch::Contains("must be probabilities in [0, 1]"));
  CHECK_THROWS_WITH(F::l1_loss(a, randn({5})), Catch::Contains("must have the same shape"));
  CHECK_THROWS_WITH(F::huber_loss(a, b, F::Reduction::Mean, 0.0), Catch::Contains("delta is 0"));
  CHECK_THROWS_WITH(nn::MSELoss().Module::forward(a), Catch::Contains("no single-input forward()"));
}

}  // namespace chorus
