// RNN, LSTM, GRU and their cells: against libtorch 1.13 (Debian's libtorch-dev) with the same weights
// copied in — outputs, h_n, c_n and every gradient in float64 to round-off, padded and packed
// (unsorted, variable-length) batches, dropout in eval and at p = 1 — and on their own: gradcheck
// of every cell and layer form, PyTorch's parameter names and init, padding that never reaches h_n,
// unbatched inputs, and the errors bad arguments get.
#include <torch/nn/modules/rnn.h>
#include "tests/libtorch_testing.h"  // after the torch headers ([Narrow torch headers])

#include <array>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "data/mnist.h"
#include "nn/nn.h"
#include "optim/optimizer.h"
#include "tensor/ops.h"
#include "tests/nn/reference.h"

namespace {

namespace c = chorus;
namespace U = chorus::nn::utils::rnn;
namespace TU = torch::nn::utils::rnn;
using c::Tensor;
using c::nn_test::error_message;
using Catch::Matchers::Contains;

using chorus::testing::max_diff;
using chorus::testing::to_torch;

enum class Kind { Tanh, Relu, LSTM, GRU };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Tanh: return "RNN tanh";
    case Kind::Relu: return "RNN relu";
    case Kind::LSTM: return "LSTM";
    case Kind::GRU: return "GRU";
  }
  return "";
}

// One chorus module and one libtorch module of the same kind and shape, each run by a lambda that
// takes the input and the initial states ({}, {h0} or {h0, c0}) and returns {output, h_n[, c_n]}.
// The packed runs pack the padded input with the given lengths (enforce_sorted = false) and pad the
// output back.
struct Pair {
  std::shared_ptr<c::nn::Module> ours;
  std::shared_ptr<torch::nn::Module> theirs;
  std::function<c::TensorList(const Tensor&, const c::TensorList&)> run_ours;
  std::function<std::vector<torch::Tensor>(const torch::Tensor&, const std::vector<torch::Tensor>&)> run_theirs;
  std::function<c::TensorList(const Tensor&, const std::vector<int64_t>&, const c::TensorList&)> run_ours_packed;
  std::function<std::vector<torch::Tensor>(const torch::Tensor&, const std::vector<int64_t>&,
                                           const std::vector<torch::Tensor>&)>
      run_theirs_packed;
};

template <typename TorchOptions>
TorchOptions common_torch_options(TorchOptions t, const c::nn::RNNBaseOptions& o) {
  t.num_layers(o.num_layers).bias(o.bias).batch_first(o.batch_first).dropout(o.dropout).bidirectional(o.bidirectional);
  return t;
}

// Runs a chorus or libtorch layer whose forward takes and returns one state tensor (RNN, GRU).
template <typename Ours, typename Theirs>
void single_state_runs(Pair& p, std::shared_ptr<Ours> ours, std::shared_ptr<Theirs> theirs, bool batch_first) {
  p.ours = ours;
  p.theirs = theirs;
  p.run_ours = [ours](const Tensor& x, const c::TensorList& s) {
    auto [out, h] = ours->forward(x, s.empty() ? Tensor() : s[0]);
    return c::TensorList{out, h};
  };
  p.run_theirs = [theirs](const torch::Tensor& x, const std::vector<torch::Tensor>& s) {
    auto [out, h] = theirs->forward(x, s.empty() ? torch::Tensor() : s[0]);
    return std::vector<torch::Tensor>{out, h};
  };
  p.run_ours_packed = [ours, batch_first](const Tensor& x, const std::vector<int64_t>& lengths, const c::TensorList& s) {
    auto [out, h] = ours->forward(U::pack_padded_sequence(x, lengths, batch_first, false), s.empty() ? Tensor() : s[0]);
    return c::TensorList{std::get<0>(U::pad_packed_sequence(out, batch_first)), h};
  };
  p.run_theirs_packed = [theirs, batch_first](const torch::Tensor& x, const std::vector<int64_t>& lengths,
                                              const std::vector<torch::Tensor>& s) {
    auto packed = TU::pack_padded_sequence(x, torch::tensor(lengths), batch_first, false);
    auto [out, h] = theirs->forward_with_packed_input(packed, s.empty() ? torch::Tensor() : s[0]);
    return std::vector<torch::Tensor>{std::get<0>(TU::pad_packed_sequence(out, batch_first)), h};
  };
}

Pair make_pair(Kind kind, int64_t input_size, int64_t hidden_size, c::nn::RNNBaseOptions o = {}) {
  Pair p;
  if (kind == Kind::Tanh || kind == Kind::Relu) {
    const bool relu = kind == Kind::Relu;
    auto ours = std::make_shared<c::nn::RNN>(input_size, hidden_size,
                                             c::nn::RNNOptions{.num_layers = o.num_layers,
                                                               .nonlinearity = relu ? "relu" : "tanh",
                                                               .bias = o.bias,
                                                               .batch_first = o.batch_first,
                                                               .dropout = o.dropout,
                                                               .bidirectional = o.bidirectional});
    auto options = common_torch_options(torch::nn::RNNOptions(input_size, hidden_size), o);
    if (relu) options.nonlinearity(torch::kReLU);
    single_state_runs(p, ours, torch::nn::RNN(options).ptr(), o.batch_first);
  } else if (kind == Kind::GRU) {
    single_state_runs(p, std::make_shared<c::nn::GRU>(input_size, hidden_size, o),
                      torch::nn::GRU(common_torch_options(torch::nn::GRUOptions(input_size, hidden_size), o)).ptr(),
                      o.batch_first);
  } else {
    auto ours = std::make_shared<c::nn::LSTM>(input_size, hidden_size, o);
    auto torch_options = common_torch_options(torch::nn::LSTMOptions(input_size, hidden_size), o);
    if (o.proj_size > 0) torch_options.proj_size(o.proj_size);
    auto theirs = torch::nn::LSTM(torch_options).ptr();
    p.ours = ours;
    p.theirs = theirs;
    auto ours_state = [](const c::TensorList& s) {
      return s.empty() ? std::nullopt : std::optional<c::nn::LSTM::State>({s[0], s[1]});
    };
    auto theirs_state = [](const std::vector<torch::Tensor>& s) {
      return s.empty() ? c10::nullopt : c10::optional<std::tuple<torch::Tensor, torch::Tensor>>({s[0], s[1]});
    };
    p.run_ours = [=](const Tensor& x, const c::TensorList& s) {
      auto [out, state] = ours->forward(x, ours_state(s));
      return c::TensorList{out, std::get<0>(state), std::get<1>(state)};
    };
    p.run_theirs = [=](const torch::Tensor& x, const std::vector<torch::Tensor>& s) {
      auto [out, state] = theirs->forward(x, theirs_state(s));
      return std::vector<torch::Tensor>{out, std::get<0>(state), std::get<1>(state)};
    };
    const bool bf = o.batch_first;
    p.run_ours_packed = [=](const Tensor& x, const std::vector<int64_t>& lengths, const c::TensorList& s) {
      auto [out, state] = ours->forward(U::pack_padded_sequence(x, lengths, bf, false), ours_state(s));
      return c::TensorList{std::get<0>(U::pad_packed_sequence(out, bf)), std::get<0>(state), std::get<1>(state)};
    };
    p.run_theirs_packed = [=](const torch::Tensor& x, const std::vector<int64_t>& lengths,
                              const std::vector<torch::Tensor>& s) {
      auto packed = TU::pack_padded_sequence(x, torch::tensor(lengths), bf, false);
      auto [out, state] = theirs->forward_with_packed_input(packed, theirs_state(s));
      return std::vector<torch::Tensor>{std::get<0>(TU::pad_packed_sequence(out, bf)), std::get<0>(state),
                                        std::get<1>(state)};
    };
  }
  p.ours->to(c::kFloat64);
  p.theirs->to(torch::kFloat64);
  return p;
}

// The cells, run the same way: {h'} or {h', c'}.
Pair make_cell_pair(Kind kind, int64_t input_size, int64_t hidden_size, bool bias) {
  Pair p;
  if (kind == Kind::LSTM) {
    auto ours = std::make_shared<c::nn::LSTMCell>(input_size, hidden_size, bias);
    auto theirs = torch::nn::LSTMCell(torch::nn::LSTMCellOptions(input_size, hidden_size).bias(bias)).ptr();
    p.ours = ours;
    p.theirs = theirs;
    p.run_ours = [ours](const Tensor& x, const c::TensorList& s) {
      auto [h, cell] = ours->forward(x, s.empty() ? std::nullopt : std::optional<std::tuple<Tensor, Tensor>>({s[0], s[1]}));
      return c::TensorList{h, cell};
    };
    p.run_theirs = [theirs](const torch::Tensor& x, const std::vector<torch::Tensor>& s) {
      auto [h, cell] = theirs->forward(
          x, s.empty() ? c10::nullopt : c10::optional<std::tuple<torch::Tensor, torch::Tensor>>({s[0], s[1]}));
      return std::vector<torch::Tensor>{h, cell};
    };
  } else if (kind == Kind::GRU) {
    auto ours = std::make_shared<c::nn::GRUCell>(input_size, hidden_size, bias);
    auto theirs = torch::nn::GRUCell(torch::nn::GRUCellOptions(input_size, hidden_size).bias(bias)).ptr();
    p.ours = ours;
    p.theirs = theirs;
    p.run_ours = [ours](const Tensor& x, const c::TensorList& s) {
      return c::TensorList{ours->forward(x, s.empty() ? Tensor() : s[0])};
    };
    p.run_theirs = [theirs](const torch::Tensor& x, const std::vector<torch::Tensor>& s) {
      return std::vector<torch::Tensor>{theirs->forward(x, s.empty() ? torch::Tensor() : s[0])};
    };
  } else {
    const bool relu = kind == Kind::Relu;
    auto ours = std::make_shared<c::nn::RNNCell>(input_size, hidden_size, bias, relu ? "relu" : "tanh");
    auto options = torch::nn::RNNCellOptions(input_size, hidden_size).bias(bias);
    if (relu) options.nonlinearity(torch::kReLU);
    auto theirs = torch::nn::RNNCell(options).ptr();
    p.ours = ours;
    p.theirs = theirs;
    p.run_ours = [ours](const Tensor& x, const c::TensorList& s) {
      return c::TensorList{ours->forward(x, s.empty() ? Tensor() : s[0])};
    };
    p.run_theirs = [theirs](const torch::Tensor& x, const std::vector<torch::Tensor>& s) {
      return std::vector<torch::Tensor>{theirs->forward(x, s.empty() ? torch::Tensor() : s[0])};
    };
  }
  // libtorch 1.13's cells take batched input only: an unbatched case runs there as a batch of one.
  p.run_theirs = [batched = p.run_theirs](const torch::Tensor& x, const std::vector<torch::Tensor>& s) {
    if (x.dim() != 1) return batched(x, s);
    std::vector<torch::Tensor> one;
    for (const torch::Tensor& t : s) one.push_back(t.unsqueeze(0));
    std::vector<torch::Tensor> outs = batched(x.unsqueeze(0), one);
    for (torch::Tensor& o : outs) o = o.squeeze(0);
    return outs;
  };
  p.ours->to(c::kFloat64);
  p.theirs->to(torch::kFloat64);
  return p;
}

// Copies chorus's parameters into libtorch's module by name; the names and shapes must agree.
void copy_parameters(const Pair& p) {
  auto theirs = p.theirs->named_parameters();
  const auto ours = p.ours->named_parameters();
  REQUIRE(theirs.size() == ours.size());
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : ours) {
    INFO(name);
    torch::Tensor* target = theirs.find(name);
    REQUIRE(target != nullptr);
    REQUIRE(c::Shape(target->sizes().begin(), target->sizes().end()) == t.sizes());
    target->copy_(to_torch(t));
  }
}

struct Run {
  c::Shape input;
  std::vector<c::Shape> states;            // empty: no initial state given
  std::vector<int64_t> lengths = {};       // non-empty: run packed with these lengths
};

// Same weights, same random input and states: every output and every gradient of
// sum_i sum(out_i * g_i) agrees with libtorch's to 1e-10.
void check_against_libtorch(Pair& p, const Run& run) {
  constexpr double tol = 1e-10;
  copy_parameters(p);
  c::manual_seed(42);
  Tensor x = c::randn(run.input, {.dtype = c::kFloat64}).requires_grad_();
  torch::Tensor tx = to_torch(x).requires_grad_();
  c::TensorList states;
  std::vector<torch::Tensor> tstates;
  for (const c::Shape& s : run.states) {
    states.push_back(c::randn(s, {.dtype = c::kFloat64}).requires_grad_());
    tstates.push_back(to_torch(states.back()).requires_grad_());
  }
  const bool packed = !run.lengths.empty();
  const c::TensorList outs = packed ? p.run_ours_packed(x, run.lengths, states) : p.run_ours(x, states);
  const std::vector<torch::Tensor> touts = packed ? p.run_theirs_packed(tx, run.lengths, tstates) : p.run_theirs(tx, tstates);
  REQUIRE(outs.size() == touts.size());
  Tensor loss = c::zeros({}, {.dtype = c::kFloat64});
  torch::Tensor tloss = torch::zeros({}, torch::kFloat64);
  for (size_t i = 0; i < outs.size(); ++i) {
    INFO("output " << i);
    CHECK(max_diff(outs[i], touts[i]) < tol);
    const Tensor g = c::randn(outs[i].sizes(), {.dtype = c::kFloat64});
    loss = c::add(loss, c::sum(c::mul(outs[i], g)));
    tloss = tloss + (touts[i] * to_torch(g)).sum();
  }
  loss.backward();
  tloss.backward();
  CHECK(max_diff(x.grad(), tx.grad()) < tol);
  for (size_t i = 0; i < states.size(); ++i) {
    INFO("gradient of state " << i);
    CHECK(max_diff(states[i].grad(), tstates[i].grad()) < tol);
  }
  auto theirs = p.theirs->named_parameters();
  for (const auto& [name, t] : p.ours->named_parameters()) {
    INFO("gradient of " << name);
    REQUIRE(t.grad().defined());
    CHECK(max_diff(t.grad(), theirs[name].grad()) < tol);
  }
}

// gradcheck of the chorus module's run over the input, the states and every parameter.
void check_gradients(Pair& p, const Run& run) {
  c::manual_seed(3);
  c::TensorList inputs{c::randn(run.input, {.dtype = c::kFloat64}).requires_grad_()};
  for (const c::Shape& s : run.states) inputs.push_back(c::randn(s, {.dtype = c::kFloat64}).requires_grad_());
  const size_t state_count = run.states.size();
  for (const Tensor& param : p.ours->parameters()) inputs.push_back(param);
  auto f = [&](const c::TensorList& in) {
    const c::TensorList states(in.begin() + 1, in.begin() + 1 + static_cast<std::ptrdiff_t>(state_count));
    const c::TensorList outs = run.lengths.empty() ? p.run_ours(in[0], states)
                                                    : p.run_ours_packed(in[0], run.lengths, states);
    c::TensorList flat;
    for (const Tensor& o : outs) flat.push_back(c::reshape(o, {-1}));
    return c::cat(flat, 0);
  };
  CHECK(c::autograd::gradcheck(f, inputs));
}

constexpr Kind kKinds[] = {Kind::Tanh, Kind::Relu, Kind::LSTM, Kind::GRU};

int64_t state_count(Kind k) { return k == Kind::LSTM ? 2 : 1; }

std::vector<c::Shape> states(Kind k, const c::Shape& shape) { return std::vector<c::Shape>(state_count(k), shape); }

}  // namespace

TEST_CASE("cells equal libtorch's: outputs and every gradient, batched and unbatched", "[nn][rnn][libtorch]") {
  torch::set_num_threads(1);
  for (Kind kind : kKinds) {
    for (bool bias : {true, false}) {
      INFO(kind_name(kind) << " cell, bias " << bias);
      Pair p = make_cell_pair(kind, 3, 4, bias);
      check_against_libtorch(p, {{5, 3}, states(kind, {5, 4})});
      check_against_libtorch(p, {{2, 3}, {}});
      check_against_libtorch(p, {{3}, states(kind, {4})});
    }
  }
}

TEST_CASE("RNN, LSTM and GRU equal libtorch's: output, h_n, c_n and every gradient", "[nn][rnn][libtorch]") {
  torch::set_num_threads(1);
  for (Kind kind : kKinds) {
    INFO(kind_name(kind));
    {
      INFO("one layer, no initial state");
      Pair p = make_pair(kind, 3, 4);
      check_against_libtorch(p, {{6, 2, 3}, {}});
    }
    {
      INFO("two layers, bidirectional, batch_first, initial state");
      Pair p = make_pair(kind, 3, 4, {.num_layers = 2, .batch_first = true, .bidirectional = true});
      check_against_libtorch(p, {{2, 5, 3}, states(kind, {4, 2, 4})});
    }
    {
      INFO("three layers without bias");
      Pair p = make_pair(kind, 2, 3, {.num_layers = 3, .bias = false});
      check_against_libtorch(p, {{4, 3, 2}, states(kind, {3, 3, 3})});
    }
  }
}

TEST_CASE("LSTM with proj_size equals libtorch's, padded and packed; gradcheck; errors", "[nn][rnn][libtorch][proj]") {
  torch::set_num_threads(1);
  {
    INFO("two layers, bidirectional, proj_size 2 of hidden 4, initial state");
    Pair p = make_pair(Kind::LSTM, 3, 4, {.num_layers = 2, .bidirectional = true, .proj_size = 2});
    check_against_libtorch(p, {{5, 3, 3}, {{4, 3, 2}, {4, 3, 4}}});
    check_against_libtorch(p, {{5, 4, 3}, {{4, 4, 2}, {4, 4, 4}}, {3, 5, 1, 4}});
    check_gradients(p, {{3, 2, 3}, {{4, 2, 2}, {4, 2, 4}}});
  }
  {
    INFO("batch_first, one layer");
    Pair p = make_pair(Kind::LSTM, 2, 5, {.batch_first = true, .proj_size = 3});
    check_against_libtorch(p, {{2, 4, 2}, {}});
    check_against_libtorch(p, {{2, 4, 2}, {{1, 2, 3}, {1, 2, 5}}});
  }
  c::nn::LSTM lstm(3, 4, {.proj_size = 2});
  CHECK(lstm.named_parameters().size() == 5);
  CHECK(lstm.named_parameters()[4].first == "weight_hr_l0");
  CHECK(lstm.named_parameters()[4].second.sizes() == c::Shape{2, 4});
  CHECK(lstm.named_parameters()[1].second.sizes() == c::Shape{16, 2});
  CHECK_THAT(error_message([] { c::nn::LSTM(3, 4, {.proj_size = 4}); }),
             Contains("proj_size must be in [0, hidden_size), got proj_size 4 with hidden_size 4"));
  CHECK_THAT(error_message([] { c::nn::GRU(3, 4, {.proj_size = 2}); }), Contains("only supported for LSTM"));
  CHECK_THAT(error_message([&] {
               lstm.forward(c::randn({5, 2, 3}), c::nn::LSTM::State{c::zeros({1, 2, 4}), c::zeros({1, 2, 4})});
             }),
             Contains("expected h0 of shape [1, 2, 2] ([num_layers * directions, batch, proj_size])"));
}

TEST_CASE("packed variable-length batches (enforce_sorted false) equal libtorch's", "[nn][rnn][libtorch][packed]") {
  torch::set_num_threads(1);
  for (Kind kind : kKinds) {
    INFO(kind_name(kind));
    {
      INFO("two layers, bidirectional");
      Pair p = make_pair(kind, 3, 4, {.num_layers = 2, .bidirectional = true});
      check_against_libtorch(p, {{5, 4, 3}, states(kind, {4, 4, 4}), {3, 5, 1, 4}});
    }
    {
      INFO("batch_first, one layer, no initial state, every length the longest");
      Pair p = make_pair(kind, 2, 3, {.batch_first = true});
      check_against_libtorch(p, {{3, 4, 2}, {}, {4, 4, 4}});
    }
    {
      INFO("batch_first, bidirectional, lengths with ties");
      Pair p = make_pair(kind, 2, 3, {.batch_first = true, .bidirectional = true});
      check_against_libtorch(p, {{5, 4, 2}, states(kind, {2, 5, 3}), {2, 4, 2, 1, 4}});
    }
  }
}

TEST_CASE("pack_padded_sequence, pad_packed_sequence, pad_sequence and pack_sequence equal libtorch's", "[nn][rnn][libtorch][packed]") {
  c::manual_seed(11);
  Tensor x = c::randn({5, 4, 2}, {.dtype = c::kFloat64});
  const std::vector<int64_t> lengths{2, 5, 3, 1};
  const U::PackedSequence ours = U::pack_padded_sequence(x, lengths, false, false);
  const TU::PackedSequence theirs = TU::pack_padded_sequence(to_torch(x), torch::tensor(lengths), false, false);
  CHECK(max_diff(ours.data, theirs.data()) == 0);
  CHECK(max_diff(ours.batch_sizes, theirs.batch_sizes()) == 0);
  CHECK(max_diff(ours.sorted_indices, theirs.sorted_indices()) == 0);
  CHECK(max_diff(ours.unsorted_indices, theirs.unsorted_indices()) == 0);
  auto [padded, out_lengths] = U::pad_packed_sequence(ours, true, -1.0, 7);
  auto [tpadded, tlengths] = TU::pad_packed_sequence(theirs, true, -1.0, 7);
  CHECK(max_diff(padded, tpadded) == 0);
  CHECK(max_diff(out_lengths, tlengths) == 0);

  const c::TensorList sequences{c::randn({3, 2}, {.dtype = c::kFloat64}), c::randn({5, 2}, {.dtype = c::kFloat64}),
                                 c::randn({1, 2}, {.dtype = c::kFloat64})};
  std::vector<torch::Tensor> tsequences;
  for (const Tensor& s : sequences) tsequences.push_back(to_torch(s));
  CHECK(max_diff(U::pad_sequence(sequences, true, 2.0), TU::pad_sequence(tsequences, true, 2.0)) == 0);
  const U::PackedSequence from_list = U::pack_sequence(sequences, false);
  const TU::PackedSequence tfrom_list = TU::pack_sequence(tsequences, false);
  CHECK(max_diff(from_list.data, tfrom_list.data()) == 0);
  CHECK(max_diff(from_list.batch_sizes, tfrom_list.batch_sizes()) == 0);

  const U::PackedSequence sorted = U::pack_padded_sequence(c::transpose(x, 0, 1), {5, 3, 3, 1}, true);
  CHECK_FALSE(sorted.sorted_indices.defined());
  CHECK(c::nn_test::doubles(sorted.batch_sizes) == std::vector<double>{4, 3, 3, 1, 1});
}

TEST_CASE("dropout between layers: eval equals libtorch's, p = 1 in training too", "[nn][rnn][libtorch][dropout]") {
  torch::set_num_threads(1);
  for (Kind kind : kKinds) {
    INFO(kind_name(kind));
    Pair p = make_pair(kind, 3, 4, {.num_layers = 2, .dropout = 0.5});
    p.ours->eval();
    p.theirs->eval();
    check_against_libtorch(p, {{4, 2, 3}, states(kind, {2, 2, 4})});
    // p = 1 zeroes the first layer's output in training, so both see only the second layer's biases.
    Pair all = make_pair(kind, 3, 4, {.num_layers = 3, .dropout = 1.0, .bidirectional = true});
    check_against_libtorch(all, {{4, 2, 3}, states(kind, {6, 2, 4})});
  }
  // p = 0.5 in training draws a mask: the output differs from eval's.
  c::nn::GRU gru(3, 4, {.num_layers = 2, .dropout = 0.5});
  c::manual_seed(1);
  const Tensor x = c::randn({5, 2, 3});
  const Tensor trained = std::get<0>(gru.forward(x, Tensor()));
  gru.eval();
  CHECK_FALSE(c::allclose(trained, std::get<0>(gru.forward(x, Tensor()))));
}

TEST_CASE("gradcheck of every cell and layer form in float64", "[nn][rnn][gradcheck]") {
  for (Kind kind : kKinds) {
    INFO(kind_name(kind));
    Pair cell = make_cell_pair(kind, 2, 3, true);
    check_gradients(cell, {{2, 2}, states(kind, {2, 3})});
    check_gradients(cell, {{2}, {}});
    Pair deep = make_pair(kind, 2, 2, {.num_layers = 2, .bidirectional = true});
    check_gradients(deep, {{3, 2, 2}, states(kind, {4, 2, 2})});
    Pair first = make_pair(kind, 2, 2, {.batch_first = true});
    check_gradients(first, {{2, 3, 2}, {}});
    Pair packed = make_pair(kind, 2, 2, {.bidirectional = true});
    check_gradients(packed, {{3, 3, 2}, states(kind, {2, 3, 2}), {2, 3, 1}});
    check_gradients(packed, {{3, 2}, states(kind, {2, 2})});  // unbatched
  }
}

TEST_CASE("parameters have PyTorch's names, shapes and init bound", "[nn][rnn]") {
  c::nn::LSTM lstm(3, 4, {.num_layers = 2, .bidirectional = true});
  std::vector<std::string> names;
  for (const auto& [name, t] : lstm.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                                          "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse",
                                          "bias_hh_l0_reverse", "weight_ih_l1", "weight_hh_l1", "bias_ih_l1",
                                          "bias_hh_l1", "weight_ih_l1_reverse", "weight_hh_l1_reverse",
                                          "bias_ih_l1_reverse", "bias_hh_l1_reverse"});
  CHECK(lstm.all_weights()[2].w_ih.sizes() == c::Shape{16, 8});  // layer 1 sees both directions
  CHECK(lstm.all_weights()[0].w_hh.sizes() == c::Shape{16, 4});
  c::nn::GRU gru(5, 16, {.bias = false});
  CHECK(gru.named_parameters().size() == 2);
  CHECK(gru.all_weights()[0].w_ih.sizes() == c::Shape{48, 5});
  // U(-1/4, 1/4), and spread over most of it.
  const Tensor w = gru.all_weights()[0].w_hh;
  CHECK(c::amax(c::abs(w)).item<double>() <= 0.25);
  CHECK(c::amax(c::abs(w)).item<double>() > 0.24);
  c::nn::RNNCell cell(3, 5, false, "relu");
  CHECK(cell.named_parameters().size() == 2);
  CHECK(cell.weight_ih.sizes() == c::Shape{5, 3});
}

TEST_CASE("padded steps never reach h_n or the valid outputs of a packed batch", "[nn][rnn][packed]") {
  c::manual_seed(5);
  c::nn::LSTM lstm(2, 3, {.num_layers = 2, .bidirectional = true});
  Tensor x = c::randn({4, 3, 2});
  const std::vector<int64_t> lengths{2, 4, 1};
  Tensor noisy = c::clone(x);
  {
    // Overwrite every padded step with large values.
    c::Tensor mask = c::zeros({4, 3, 1});
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t t = lengths[b]; t < 4; ++t) c::narrow(c::narrow(mask, 0, t, 1), 1, b, 1).fill_(1.0);
    }
    noisy = c::add(x, c::mul(mask, 100.0));
  }
  auto run = [&](const Tensor& input) { return lstm.forward(U::pack_padded_sequence(input, lengths, false, false)); };
  auto [out, state] = run(x);
  auto [noisy_out, noisy_state] = run(noisy);
  CHECK(c::equal(std::get<0>(state), std::get<0>(noisy_state)));
  CHECK(c::equal(std::get<1>(state), std::get<1>(noisy_state)));
  CHECK(c::equal(out.data, noisy_out.data));
  // Each sequence's h_n equals running it alone over its own length.
  for (int64_t b = 0; b < 3; ++b) {
    const Tensor alone = c::narrow(c::narrow(x, 1, b, 1), 0, 0, lengths[b]);
    auto [alone_out, alone_state] = lstm.forward(alone, std::nullopt);
    CHECK(c::allclose(std::get<0>(alone_state), c::narrow(std::get<0>(state), 1, b, 1), 1e-6, 1e-6));
  }
}

TEST_CASE("unbatched input equals a batch of one", "[nn][rnn]") {
  c::manual_seed(8);
  c::nn::GRU gru(3, 4, {.num_layers = 2});
  const Tensor x = c::randn({5, 3}), h0 = c::randn({2, 4});
  auto [out, h_n] = gru.forward(x, h0);
  auto [batched_out, batched_h] = gru.forward(c::unsqueeze(x, 1), c::unsqueeze(h0, 1));
  CHECK(out.sizes() == c::Shape{5, 4});
  CHECK(h_n.sizes() == c::Shape{2, 4});
  CHECK(c::equal(out, c::squeeze(batched_out, 1)));
  CHECK(c::equal(h_n, c::squeeze(batched_h, 1)));
  // The single-input forward (for Sequential) returns the output alone, from zero states.
  CHECK(c::equal(gru.forward(x), std::get<0>(gru.forward(x, Tensor()))));
}

TEST_CASE("a packed bidirectional LSTM on the sim device gives the CPU's outputs and gradients", "[nn][rnn][sim]") {
  c::manual_seed(4);
  c::nn::LSTM lstm(3, 4, {.num_layers = 2, .bidirectional = true});
  lstm.to(c::kFloat64);
  const Tensor x = c::randn({5, 3, 3}, {.dtype = c::kFloat64});
  const std::vector<int64_t> lengths{2, 5, 3};
  auto run = [&](const c::Device& device) {
    auto [out, state] = lstm.forward(U::pack_padded_sequence(x.to(device), lengths, false, false));
    const Tensor padded = std::get<0>(U::pad_packed_sequence(out));
    c::add(c::sum(c::mul(padded, padded)), c::sum(std::get<1>(state))).backward();
    c::TensorList results{padded.to(c::kCPU), std::get<0>(state).to(c::kCPU), std::get<1>(state).to(c::kCPU)};
    for (const Tensor& p : lstm.parameters()) results.push_back(p.grad().to(c::kCPU));
    lstm.zero_grad();
    return results;
  };
  const c::TensorList cpu = run(c::kCPU);
  lstm.to(c::Device("sim:0"));
  const c::TensorList sim = run(c::Device("sim:0"));
  REQUIRE(lstm.parameters()[0].device() == c::Device("sim:0"));
  REQUIRE(cpu.size() == sim.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("result " << i);
    CHECK(c::allclose(sim[i], cpu[i], 1e-12, 1e-12));
  }
}

TEST_CASE("bad arguments are errors naming what was given and what was expected", "[nn][rnn][errors]") {
  CHECK_THAT(error_message([] { c::nn::LSTM(3, 4, {.num_layers = 0}); }), Contains("num_layers must be at least 1, got 0"));
  CHECK_THAT(error_message([] { c::nn::GRU(3, 4, {.dropout = 1.5}); }), Contains("dropout") && Contains("[0, 1], got 1.5"));
  CHECK_THAT(error_message([] { c::nn::RNN(3, 4, {.dropout = -0.1}); }), Contains("got -0.1"));
  CHECK_THAT(error_message([] { c::nn::RNN(3, 4, {.nonlinearity = "sigmoid"}); }),
             Contains("'sigmoid'") && Contains("'tanh' or 'relu'"));
  CHECK_THAT(error_message([] { c::nn::LSTM(0, 4); }), Contains("input_size (0)"));

  c::nn::LSTM lstm(3, 4, {.num_layers = 2});
  CHECK_THAT(error_message([&] { lstm.forward(c::randn({5, 2, 6}), std::nullopt); }),
             Contains("LSTM") && Contains("3 features") && Contains("[5, 2, 6]"));
  CHECK_THAT(error_message([&] { lstm.forward(c::randn({5}), std::nullopt); }), Contains("3-D input") && Contains("[5]"));
  CHECK_THAT(error_message([&] {
               lstm.forward(c::randn({5, 2, 3}), c::nn::LSTM::State{c::randn({1, 2, 4}), c::randn({2, 2, 4})});
             }),
             Contains("h0 of shape [2, 2, 4]") && Contains("got [1, 2, 4]"));
  CHECK_THAT(error_message([&] {
               lstm.forward(c::randn({5, 2, 3}), c::nn::LSTM::State{c::randn({2, 2, 4}), c::randn({2, 3, 4})});
             }),
             Contains("c0 of shape [2, 2, 4]") && Contains("got [2, 3, 4]"));
  c::nn::GRU gru(3, 4);
  CHECK_THAT(error_message([&] { gru.forward(c::randn({5, 3}), c::randn({1, 2, 4})); }),
             Contains("hx of shape [1, 4]") && Contains("got [1, 2, 4]"));
  c::nn::GRUCell cell(3, 4);
  CHECK_THAT(error_message([&] { cell.forward(c::randn({2, 5}), Tensor()); }),
             Contains("GRUCell") && Contains("input_size 3") && Contains("[2, 5]"));
  CHECK_THAT(error_message([&] { cell.forward(c::randn({2, 3}), c::randn({3, 4})); }),
             Contains("hx of shape [2, 4]") && Contains("got [3, 4]"));

  const Tensor x = c::randn({4, 3, 3});
  CHECK_THAT(error_message([&] { U::pack_padded_sequence(x, {2, 3, 1}); }),
             Contains("not sorted longest first") && Contains("enforce_sorted = false"));
  CHECK_THAT(error_message([&] { U::pack_padded_sequence(x, {5, 3, 1}); }), Contains("between 1 and the input's 4"));
  CHECK_THAT(error_message([&] { U::pack_padded_sequence(x, {3, 1}); }), Contains("2 lengths for a batch of 3"));
  CHECK_THAT(error_message([&] { U::pad_packed_sequence(U::pack_padded_sequence(x, {4, 3, 1}), false, 0.0, 2); }),
             Contains("total_length 2 is shorter"));
  CHECK_THAT(error_message([] { U::pad_sequence({c::randn({2, 3}), c::randn({4, 2})}); }),
             Contains("sequence 1 has shape [4, 2]") && Contains("[2, 3]"));
  CHECK_THAT(error_message([&] { gru.forward(U::pack_padded_sequence(c::randn({4, 3, 2}), {4, 3, 1})); }),
             Contains("packed data [8, 3]") && Contains("got [8, 2]"));
}

TEST_CASE("a character-level LSTM on real text: the training loss falls", "[nn][rnn][train]") {
  // The corpus tools/setup.sh installs (data/sotu in $CHORUS_DATA_DIR); the 1790 address is 8 KB.
  std::ifstream file(c::data::default_data_dir() + "/sotu/1790_george_washington_n.txt");
  REQUIRE(file);
  const std::string text{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  REQUIRE(text.size() > 5000);
  std::array<int64_t, 256> id_of;
  id_of.fill(-1);
  int64_t vocab = 0;
  std::vector<int64_t> ids;
  for (unsigned char ch : text) {
    if (id_of[ch] < 0) id_of[ch] = vocab++;
    ids.push_back(id_of[ch]);
  }
  const Tensor corpus = c::tensor(ids);
  const int64_t batch = 16, steps = 32;

  c::manual_seed(0);
  c::nn::Embedding embed(vocab, 16);
  c::nn::LSTM lstm(16, 64, {.batch_first = true});
  c::nn::Linear head(64, vocab);
  std::vector<Tensor> params;
  for (c::nn::Module* m : std::initializer_list<c::nn::Module*>{&embed, &lstm, &head}) {
    for (const Tensor& p : m->parameters()) params.push_back(p);
  }
  c::optim::Adam adam(params, {.lr = 0.01});
  std::vector<double> losses;
  for (int iteration = 0; iteration < 100; ++iteration) {
    // batch windows of steps + 1 characters at random offsets: inputs and next-character targets.
    const Tensor starts = c::randint(0, corpus.size(0) - steps - 1, {batch, 1});
    const Tensor window = c::index(corpus, c::add(starts, c::arange(steps + 1)));
    const Tensor x = c::narrow(window, 1, 0, steps), y = c::narrow(window, 1, 1, steps);
    const Tensor logits = head(lstm(embed(x)));
    const Tensor loss = c::nn::functional::cross_entropy(c::reshape(logits, {-1, vocab}), c::reshape(y, {-1}));
    adam.zero_grad();
    loss.backward();
    adam.step();
    losses.push_back(loss.item<double>());
  }
  auto mean_of = [&](size_t from, size_t count) {
    double s = 0;
    for (size_t i = from; i < from + count; ++i) s += losses[i];
    return s / static_cast<double>(count);
  };
  const double first = mean_of(0, 5), last = mean_of(losses.size() - 10, 10);
  INFO("vocabulary " << vocab << ", loss " << first << " -> " << last);
  CHECK(first > 3.3);  // near log(vocabulary): little learnt yet
  CHECK(last < 2.6);   // below a unigram model's ~3.1 nats: the LSTM uses the preceding characters
}
