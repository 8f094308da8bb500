// ConvTranspose1d/2d, EmbeddingBag and the Transformer decoder beyond what the libtorch parity
// test compares: float64 gradchecks of every input over many argument combinations, the chorus::Error
// each kind of bad argument gets, and state_dict names and shapes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "autograd/gradcheck.h"
#include "nn/functional.h"
#include "nn/nn.h"
#include "tensor/ops.h"
#include "tests/nn/reference.h"

namespace c = chorus;
namespace F = chorus::nn::functional;
using c::nn_test::error_message;
using Catch::Matchers::Contains;

namespace {

c::Tensor rand64(const c::Shape& shape) { return c::randn(shape, {.dtype = c::kFloat64}).requires_grad_(); }

std::vector<std::string> state_names(const c::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, t] : m.state_dict()) names.push_back(name);
  return names;
}

}  // namespace

// ------------------------------------------------------------------ transposed convolution

TEST_CASE("conv_transpose2d: gradcheck of input, weight and bias over stride, padding, output_padding, groups, "
          "dilation",
          "[nn][conv_transpose][gradcheck]") {
  struct Combo {
    F::Pair stride, padding, output_padding;
    int64_t groups;
    F::Pair dilation;
  };
  const std::vector<Combo> combos = {
      {{1, 1}, {0, 0}, {0, 0}, 1, {1, 1}}, {{2, 2}, {1, 1}, {1, 1}, 1, {1, 1}}, {{3, 2}, {0, 1}, {2, 0}, 2, {1, 1}},
      {{2, 1}, {1, 0}, {0, 0}, 1, {2, 2}}, {{1, 2}, {1, 1}, {1, 1}, 2, {2, 3}},  // output_padding >= stride, < dilation
  };
  for (const Combo& k : combos) {
    INFO("stride " << k.stride[0] << "," << k.stride[1] << " padding " << k.padding[0] << "," << k.padding[1]
                   << " output_padding " << k.output_padding[0] << "," << k.output_padding[1] << " groups "
                   << k.groups << " dilation " << k.dilation[0] << "," << k.dilation[1]);
    c::manual_seed(11);
    const int64_t c_in = 2 * k.groups, c_out_per_group = 2;
    c::TensorList in = {rand64({2, c_in, 3, 3}), rand64({c_in, c_out_per_group, 2, 3}),
                        rand64({c_out_per_group * k.groups})};
    CHECK(c::autograd::gradcheck(
        [&](const c::TensorList& x) {
          return F::conv_transpose2d(x[0], x[1], x[2], k.stride, k.padding, k.output_padding, k.groups, k.dilation);
        },
        in));
  }
}

TEST_CASE("conv_transpose1d: gradcheck of input, weight and bias, batched and unbatched", "[nn][conv_transpose][gradcheck]") {
  c::manual_seed(12);
  c::TensorList in = {rand64({2, 4, 5}), rand64({4, 1, 3}), rand64({2})};
  CHECK(c::autograd::gradcheck(
      [](const c::TensorList& x) { return F::conv_transpose1d(x[0], x[1], x[2], 2, 1, 1, 2, 2); }, in));
  c::TensorList unbatched = {rand64({3, 4}), rand64({3, 2, 2})};
  CHECK(c::autograd::gradcheck([](const c::TensorList& x) { return F::conv_transpose1d(x[0], x[1], c::Tensor(), 3); },
                               unbatched));
}

TEST_CASE("conv_transpose2d is the adjoint of conv2d: <conv2d(z, W), x> == <z, conv_transpose2d(x, W)>",
          "[nn][conv_transpose]") {
  c::manual_seed(13);
  c::Tensor w = c::randn({4, 3, 3, 2}, {.dtype = c::kFloat64});
  c::Tensor x = c::randn({2, 4, 3, 4}, {.dtype = c::kFloat64});
  c::Tensor y = F::conv_transpose2d(x, w, c::Tensor(), {2, 3}, {1, 0}, {1, 2});
  c::Tensor z = c::randn(y.sizes(), {.dtype = c::kFloat64});
  c::Tensor cz = F::conv2d(z, w, c::Tensor(), {2, 3}, {1, 0});
  REQUIRE(cz.sizes() == x.sizes());
  CHECK(c::sum(c::mul(cz, x)).item<double>() == Approx(c::sum(c::mul(z, y)).item<double>()).epsilon(1e-12));
}

TEST_CASE("conv_transpose2d and embedding_bag: the sim device gives the CPU's values and gradients",
          "[nn][conv_transpose][embedding_bag][sim]") {
  c::manual_seed(14);
  const c::Device sim("sim:0");
  const c::Tensor x = c::randn({2, 4, 3, 4}, {.dtype = c::kFloat64}), w = c::randn({4, 3, 3, 2}, {.dtype = c::kFloat64});
  c::TensorList cpu = {x.clone().requires_grad_(), w.clone().requires_grad_()};
  c::TensorList dev = {x.to(sim).requires_grad_(), w.to(sim).requires_grad_()};
  auto run = [](const c::TensorList& in) {
    return F::conv_transpose2d(in[0], in[1], c::Tensor(), {2, 2}, {1, 0}, {1, 1}, 1, {1, 2});
  };
  const c::Tensor y = run(cpu), ys = run(dev);
  REQUIRE(ys.device() == sim);
  CHECK(c::allclose(ys.to(c::kCPU), y, 1e-12, 1e-12));
  const c::Tensor g = c::randn(y.sizes(), {.dtype = c::kFloat64});
  c::sum(c::mul(y, g)).backward();
  c::sum(c::mul(ys, g.to(sim))).backward();
  CHECK(c::allclose(dev[0].grad().to(c::kCPU), cpu[0].grad(), 1e-12, 1e-12));
  CHECK(c::allclose(dev[1].grad().to(c::kCPU), cpu[1].grad(), 1e-12, 1e-12));

  const c::Tensor table = c::randn({6, 3}, {.dtype = c::kFloat64});
  const c::Tensor idx = c::tensor<int64_t>({2, 0, 5, 5, 1}), off = c::tensor<int64_t>({0, 2, 2});
  for (auto mode : {F::EmbeddingBagMode::Sum, F::EmbeddingBagMode::Mean, F::EmbeddingBagMode::Max}) {
    INFO(F::embedding_bag_mode_name(mode));
    c::Tensor t_cpu = table.clone().requires_grad_(), t_sim = table.to(sim).requires_grad_();
    const c::Tensor b = F::embedding_bag(idx, t_cpu, off, mode);
    const c::Tensor bs = F::embedding_bag(idx.to(sim), t_sim, off.to(sim), mode);
    REQUIRE(bs.device() == sim);
    CHECK(c::allclose(bs.to(c::kCPU), b, 1e-12, 1e-12));
    c::sum(c::mul(b, b)).backward();
    c::sum(c::mul(bs, bs)).backward();
    CHECK(c::allclose(t_sim.grad().to(c::kCPU), t_cpu.grad(), 1e-12, 1e-12));
  }
}

TEST_CASE("ConvTranspose2d/1d: parameter names, shapes and init bounds as PyTorch's", "[nn][conv_transpose]") {
  c::nn::ConvTranspose2d m(c::nn::ConvTranspose2dOptions(6, 4, {3, 2}).groups(2));
  CHECK(state_names(m) == std::vector<std::string>{"weight", "bias"});
  CHECK(m.weight.sizes() == c::Shape{6, 2, 3, 2});
  CHECK(m.bias.sizes() == c::Shape{4});
  // fan_in = weight.size(1) * kH * kW = 12; kaiming_uniform(a = sqrt(5)) gives bound 1/sqrt(fan_in) too.
  const double bound = 1.0 / std::sqrt(12.0);
  CHECK(c::amax(c::abs(m.weight)).item<float>() <= bound);
  CHECK(c::amax(c::abs(m.bias)).item<float>() <= bound);
  c::nn::ConvTranspose1d m1(c::nn::ConvTranspose1dOptions(3, 5, 4).bias(false));
  CHECK(state_names(m1) == std::vector<std::string>{"weight"});
  CHECK(m1.weight.sizes() == c::Shape{3, 5, 4});
  CHECK(m1(c::randn({2, 3, 6})).sizes() == c::Shape{2, 5, 9});
}

TEST_CASE("conv_transpose and ConvTranspose: bad arguments are errors naming what was given",
          "[nn][conv_transpose][errors]") {
  c::Tensor x = c::randn({2, 4, 3, 3}), w = c::randn({4, 2, 3, 3});
  CHECK_THAT(error_message([&] { F::conv_transpose2d(x, w, c::Tensor(), {2, 2}, {0, 0}, {2, 1}); }),
             Contains("output_padding (2, 1)") && Contains("smaller than either stride (2, 2) or dilation (1, 1)"));
  CHECK_THAT(error_message([&] { F::conv_transpose2d(c::randn({2, 3, 3, 3}), w); }),
             Contains("has 3 channels") && Contains("[4, 2, 3, 3] expects 4"));
  CHECK_THAT(error_message([&] { F::conv_transpose2d(x, w, c::Tensor(), {1, 1}, {0, 0}, {0, 0}, 3); }),
             Contains("input channels 4 must be divisible by groups 3"));
  CHECK_THAT(error_message([&] { F::conv_transpose2d(x, w, c::randn({3})); }),
             Contains("bias must have shape [2], got [3]"));
  CHECK_THAT(error_message([&] { F::conv_transpose2d(x, c::randn({4, 2, 3})); }), Contains("4-D weight"));
  CHECK_THAT(error_message([&] { F::conv_transpose2d(x, w, c::Tensor(), {1, 1}, {3, 3}); }),
             Contains("empty output (-1, -1)"));
  CHECK_THAT(error_message([&] { F::conv_transpose1d(c::randn({2, 4, 5}), c::randn({4, 2, 3}), c::Tensor(), 1, 0, 1); }),
             Contains("output_padding 1 must be smaller than either stride 1 or dilation 1"));
  CHECK_THAT(error_message([&] { F::conv_transpose1d(c::randn({2, 3, 5}), c::randn({4, 2, 3})); }),
             Contains("has 3 channels") && Contains("expects 4"));
  CHECK_THAT(error_message([] { c::nn::ConvTranspose2d(c::nn::ConvTranspose2dOptions(4, 6, 3).groups(4)); }),
             Contains("in_channels (4) and out_channels (6) must be divisible by groups (4)"));
  c::nn::ConvTranspose2d m(c::nn::ConvTranspose2dOptions(4, 2, 3).stride(2));
  CHECK_THAT(error_message([&] { m.forward(x, std::vector<int64_t>{9, 7}); }),
             Contains("requested an output size of [9, 7]") && Contains("valid sizes range from 7 to 8 in dim 0"));
  CHECK_THAT(error_message([&] { m.forward(x, std::vector<int64_t>{7, 7, 7}); }),
             Contains("output_size must have 2 or 4 elements") && Contains("7, 7, 7"));
  CHECK(m.forward(x, std::vector<int64_t>{2, 2, 8, 7}).sizes() == c::Shape{2, 2, 8, 7});
}

// ------------------------------------------------------------------ embedding_bag

TEST_CASE("embedding_bag: gradcheck of weight (and per_sample_weights) in each mode", "[nn][embedding_bag][gradcheck]") {
  using M = F::EmbeddingBagMode;
  c::manual_seed(21);
  const c::Tensor idx = c::tensor<int64_t>({2, 0, 5, 5, 1, 3, 4, 0});
  const c::Tensor offsets = c::tensor<int64_t>({0, 3, 3, 5});
  const c::Tensor rows2d = c::tensor<int64_t>({1, 2, 3, 3, 0, 4}, c::Shape{2, 3});
  for (M mode : {M::Sum, M::Mean, M::Max}) {
    INFO(F::embedding_bag_mode_name(mode));
    c::TensorList w = {rand64({6, 3})};
    CHECK(c::autograd::gradcheck([&](const c::TensorList& x) { return F::embedding_bag(idx, x[0], offsets, mode); }, w));
    CHECK(c::autograd::gradcheck(
        [&](const c::TensorList& x) { return F::embedding_bag(idx, x[0], offsets, mode, c::Tensor(), false, 5); }, w));
    CHECK(c::autograd::gradcheck(
        [&](const c::TensorList& x) { return F::embedding_bag(rows2d, x[0], c::Tensor(), mode); }, w));
  }
  c::TensorList with_weights = {rand64({6, 3}), rand64({8})};
  CHECK(c::autograd::gradcheck(
      [&](const c::TensorList& x) {
        return F::embedding_bag(idx, x[0], c::tensor<int64_t>({0, 3, 3, 5, 8}), M::Sum, x[1], true);
      },
      with_weights));
}

TEST_CASE("embedding_bag: empty bags give zeros and padding_idx rows are left out of the mean", "[nn][embedding_bag]") {
  using M = F::EmbeddingBagMode;
  const c::Tensor w = c::tensor<double>({1, 2, 3, 4, 5, 6}, c::Shape{3, 2});
  const c::Tensor idx = c::tensor<int64_t>({0, 2, 1});
  const c::Tensor off = c::tensor<int64_t>({0, 0, 2});
  CHECK(c::nn_test::doubles(F::embedding_bag(idx, w, off, M::Mean, c::Tensor(), false, 2)) ==
        std::vector<double>{0, 0, 1, 2, 3, 4});
  CHECK(c::nn_test::doubles(F::embedding_bag(idx, w, off, M::Max)) == std::vector<double>{0, 0, 5, 6, 3, 4});
  CHECK(c::nn_test::doubles(F::embedding_bag(idx, w, off, M::Sum)) == std::vector<double>{0, 0, 6, 8, 3, 4});
}

TEST_CASE("EmbeddingBag: parameter name, padding row zero, forward with offsets", "[nn][embedding_bag]") {
  c::nn::EmbeddingBag bag(5, 3, {.mode = F::EmbeddingBagMode::Max, .padding_idx = -1});
  CHECK(state_names(bag) == std::vector<std::string>{"weight"});
  CHECK(bag.options.padding_idx == 4);
  CHECK(c::nn_test::doubles(bag.weight.select(0, 4)) == std::vector<double>(3, 0.0));
  CHECK(bag.forward(c::tensor<int64_t>({1, 2, 3}), c::tensor<int64_t>({0, 1})).sizes() == c::Shape{2, 3});
  CHECK(bag(c::tensor<int64_t>({1, 2, 3, 0}, c::Shape{2, 2})).sizes() == c::Shape{2, 3});
}

TEST_CASE("embedding_bag: bad arguments are errors naming what was given", "[nn][embedding_bag][errors]") {
  using M = F::EmbeddingBagMode;
  const c::Tensor w = c::randn({5, 2});
  const c::Tensor idx = c::tensor<int64_t>({0, 1, 4});
  CHECK_THAT(error_message([&] { F::embedding_bag(idx, w); }), Contains("1-D indices need 1-D offsets") && Contains("none"));
  CHECK_THAT(error_message([&] { F::embedding_bag(idx.view({1, 3}), w, c::tensor<int64_t>({0})); }),
             Contains("one bag per row and take no offsets"));
  CHECK_THAT(error_message([&] { F::embedding_bag(idx, w, c::tensor<int64_t>({1, 2})); }), Contains("offsets[0] must be 0") && Contains("got 1"));
  CHECK_THAT(error_message([&] { F::embedding_bag(idx, w, c::tensor<int64_t>({0, 2, 1})); }),
             Contains("non-decreasing") && Contains("0, 2, 1"));
  CHECK_THAT(error_message([&] { F::embedding_bag(idx, w, c::tensor<int64_t>({0, 2}), M::Sum, c::Tensor(), true); }),
             Contains("last offset must be the number of indices 3, got 2"));
  CHECK_THAT(error_message([&] { F::embedding_bag(idx, w, c::tensor<int64_t>({0}), M::Mean, c::randn({3})); }),
             Contains("only supported for mode sum, got mode mean"));
  CHECK_THAT(error_message([&] { F::embedding_bag(idx, w, c::tensor<int64_t>({0}), M::Sum, c::randn({2})); }),
             Contains("per_sample_weights of shape [2] must have the shape of indices [3]"));
  CHECK_THAT(error_message([&] { F::embedding_bag(c::tensor<int64_t>({0, 5}), w, c::tensor<int64_t>({0})); }),
             Contains("index 5 at position 1 is out of range for 5 embeddings"));
  CHECK_THAT(error_message([&] { F::embedding_bag(idx, w, c::tensor<int64_t>({0}), M::Sum, c::Tensor(), false, 5); }),
             Contains("padding_idx 5 must be within the 5 embeddings"));
  CHECK_THAT(error_message([&] { F::embedding_bag(c::randn({3}), w, c::tensor<int64_t>({0})); }),
             Contains("int64 or int32 indices, got float32"));
}

// ------------------------------------------------------------------ Transformer decoder

namespace {

// gradcheck of a module's forward with respect to its inputs and every parameter (perturbed in place).
template <typename Fn>
bool gradcheck_with_parameters(c::nn::Module& m, c::TensorList inputs, Fn fn) {
  const size_t n_inputs = inputs.size();
  for (const auto& [name, p] : m.named_parameters()) inputs.push_back(p);
  return c::autograd::gradcheck(
      [&](const c::TensorList& x) { return fn(c::TensorList(x.begin(), x.begin() + static_cast<int64_t>(n_inputs))); },
      inputs);
}

}  // namespace

TEST_CASE("TransformerDecoderLayer: gradcheck of tgt, memory and every parameter, post- and pre-norm, with masks",
          "[nn][transformer][gradcheck]") {
  for (const bool norm_first : {false, true}) {
    INFO("norm_first " << norm_first);
    c::manual_seed(41);
    c::nn::TransformerDecoderLayer layer(4, 2, {.dim_feedforward = 6, .dropout = 0.0, .activation = norm_first ? "gelu" : "relu",
                                                .norm_first = norm_first});
    layer.to(c::kFloat64);
    const c::Tensor tgt_mask = c::nn::Transformer::generate_square_subsequent_mask(3, {.dtype = c::kFloat64});
    const c::Tensor memory_pad = c::tensor<bool>({false, false, false, true}, c::Shape{2, 2});
    CHECK(gradcheck_with_parameters(layer, {rand64({3, 2, 4}), rand64({2, 2, 4})}, [&](const c::TensorList& x) {
      return layer.forward(x[0], x[1], tgt_mask, c::Tensor(), c::Tensor(), memory_pad);
    }));
  }
}

TEST_CASE("Transformer: gradcheck of src, tgt and every parameter with batch_first and norm_first",
          "[nn][transformer][gradcheck]") {
  c::manual_seed(42);
  c::nn::Transformer model({.d_model = 4, .nhead = 2, .num_encoder_layers = 1, .num_decoder_layers = 1,
                            .dim_feedforward = 4, .dropout = 0.0, .batch_first = true, .norm_first = true});
  model.to(c::kFloat64);
  const c::Tensor tgt_mask = c::nn::Transformer::generate_square_subsequent_mask(2, {.dtype = c::kFloat64});
  CHECK(gradcheck_with_parameters(model, {rand64({2, 3, 4}), rand64({2, 2, 4})}, [&](const c::TensorList& x) {
    return model.forward(x[0], x[1], c::Tensor(), tgt_mask);
  }));
}

TEST_CASE("Transformer: batch_first and unbatched inputs give the sequence-first batched values", "[nn][transformer]") {
  c::manual_seed(43);
  c::nn::TransformerOptions opts{.d_model = 8, .nhead = 4, .num_encoder_layers = 2, .num_decoder_layers = 1,
                                 .dim_feedforward = 16, .dropout = 0.0};
  c::nn::Transformer seq_first(opts);
  opts.batch_first = true;
  c::nn::Transformer batch_first(opts);
  batch_first.load_state_dict(seq_first.state_dict());
  const c::Tensor src = c::randn({5, 2, 8}), tgt = c::randn({3, 2, 8});
  const c::Tensor mask = c::nn::Transformer::generate_square_subsequent_mask(3);
  const c::Tensor y = seq_first.forward(src, tgt, c::Tensor(), mask);
  CHECK(c::allclose(batch_first.forward(src.transpose(0, 1), tgt.transpose(0, 1), c::Tensor(), mask).transpose(0, 1), y,
                    1e-5, 1e-6));
  const c::Tensor one = seq_first.forward(src.select(1, 1), tgt.select(1, 1), c::Tensor(), mask);
  CHECK(one.sizes() == c::Shape{3, 8});
  CHECK(c::allclose(one, y.select(1, 1), 1e-5, 1e-6));
}

TEST_CASE("Transformer: state_dict names as PyTorch's and generate_square_subsequent_mask's values",
          "[nn][transformer]") {
  c::nn::Transformer model({.d_model = 4, .nhead = 2, .num_encoder_layers = 1, .num_decoder_layers = 2,
                            .dim_feedforward = 6});
  const std::vector<std::string> names = state_names(model);
  for (const char* name : {"encoder.layers.0.self_attn.in_proj_weight", "encoder.norm.weight",
                           "decoder.layers.1.multihead_attn.out_proj.weight", "decoder.layers.0.norm3.bias",
                           "decoder.layers.1.linear2.weight", "decoder.norm.bias"}) {
    INFO(name);
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  }
  CHECK(names.size() == 12 + 2 + 2 * 18 + 2);  // encoder layer 12, its norm 2, decoder layers 18 each, norm 2
  CHECK(c::nn_test::doubles(c::nn::Transformer::generate_square_subsequent_mask(3)) ==
        std::vector<double>{0, -INFINITY, -INFINITY, 0, 0, -INFINITY, 0, 0, 0});
  // xavier_uniform on every matrix: the bound for linear1 [6, 4] is sqrt(6 / 10).
  const c::Tensor w = model.decoder->layers->at<c::nn::TransformerDecoderLayer>(0)->linear1->weight;
  CHECK(c::amax(c::abs(w)).item<float>() <= std::sqrt(0.6));
}

TEST_CASE("Transformer and its decoder: bad arguments are errors naming what was given",
          "[nn][transformer][errors]") {
  c::nn::Transformer model({.d_model = 4, .nhead = 2, .num_encoder_layers = 1, .num_decoder_layers = 1,
                            .dim_feedforward = 4});
  CHECK_THAT(error_message([&] { model.forward(c::randn({5, 2, 4}), c::randn({3, 3, 4})); }),
             Contains("batch sizes of src [5, 2, 4] and tgt [3, 3, 4] must be equal"));
  CHECK_THAT(error_message([&] { model.forward(c::randn({5, 2, 4}), c::randn({3, 2, 6})); }),
             Contains("[3, 2, 6] must equal d_model=4"));
  CHECK_THAT(error_message([&] { model.forward(c::randn({5, 2, 4}), c::randn({3, 4})); }),
             Contains("both 3-D") && Contains("[5, 2, 4] and [3, 4]"));
  CHECK_THAT(error_message([&] { model.forward(c::randn({5, 2, 4}), c::randn({3, 2, 4}), c::Tensor(), c::randn({2, 2})); }),
             Contains("attn_mask of shape [2, 2] must be [L=3, S=3]"));
  CHECK_THAT(error_message([] { c::nn::TransformerDecoderLayer(4, 2, {.activation = "tanh"}); }),
             Contains("TransformerDecoderLayer: activation must be 'relu' or 'gelu', got 'tanh'"));
  CHECK_THAT(error_message([] { c::nn::TransformerDecoderLayer(6, 4); }), Contains("embed_dim (6)") && Contains("num_heads (4)"));
  CHECK_THAT(error_message([] { c::nn::TransformerDecoder(4, 2, 0); }), Contains("num_layers must be positive, got 0"));
}
