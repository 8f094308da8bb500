#include "nn/rnn.h"

#include <fmt/ranges.h>

#include <cmath>
#include <numeric>
#include <utility>

#include "nn/functional/basic.h"
#include "nn/init.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::nn {

namespace {

namespace F = functional;

int64_t gate_count(RNNMode mode) {
  switch (mode) {
    case RNNMode::LSTM: return 4;
    case RNNMode::GRU: return 3;
    default: return 1;
  }
}

RNNMode rnn_mode(const std::string& nonlinearity) {
  if (nonlinearity == "tanh") return RNNMode::RNNTanh;
  if (nonlinearity == "relu") return RNNMode::RNNRelu;
  fail("RNN: unknown nonlinearity '{}', expected 'tanh' or 'relu'", nonlinearity);
}

// One time step. gi = x W_ih^T + b_ih is computed by the caller (for a whole sequence at once in the
// layers); h [N, H], c [N, H] (LSTM only). Returns (h', c'), c' undefined but for LSTM.
std::pair<Tensor, Tensor> step(RNNMode mode, const Tensor& gi, const Tensor& h, const Tensor& c, const Tensor& w_hh,
                               const Tensor& b_hh, const Tensor& w_hr = Tensor()) {
  const Tensor gh = F::linear(h, w_hh, b_hh);
  switch (mode) {
    case RNNMode::RNNTanh: return {tanh(add(gi, gh)), Tensor()};
    case RNNMode::RNNRelu: return {relu(add(gi, gh)), Tensor()};
    case RNNMode::LSTM: {
      const TensorList gates = chunk(add(gi, gh), 4, 1);  // i, f, g, o
      const Tensor c_next = add(mul(sigmoid(gates[1]), c), mul(sigmoid(gates[0]), tanh(gates[2])));
      const Tensor h_next = mul(sigmoid(gates[3]), tanh(c_next));
      return {w_hr.defined() ? F::linear(h_next, w_hr, Tensor()) : h_next, c_next};
    }
    case RNNMode::GRU: {
      // r and z see both halves summed; the candidate n sees the hidden half gated by r, bias included
      // (PyTorch's and cuDNN's form, not the paper's r * h inside the product).
      const TensorList in = chunk(gi, 3, 1), hid = chunk(gh, 3, 1);  // r, z, n
      const Tensor r = sigmoid(add(in[0], hid[0]));
      const Tensor z = sigmoid(add(in[1], hid[1]));
      const Tensor n = tanh(add(in[2], mul(r, hid[2])));
      return {add(mul(rsub(z, 1.0), n), mul(z, h)), Tensor()};
    }
  }
  fail("RNN: unknown mode");
}

struct DirectionOutput {
  Tensor output;  // [sum(batch_sizes), H]
  Tensor h_n, c_n;
};

// One direction of one layer over time-major packed rows. Sequences are sorted longest first, so
// step t runs the first batch_sizes[t] rows of the state. Going forward the batch shrinks: the rows
// that drop out hold their sequence's last state and are set aside. Going backward it grows: a
// sequence starts (from its h0 row) at its own last step.
DirectionOutput run_direction(RNNMode mode, const RNNBase::LayerWeights& w, const Tensor& rows,
                              const std::vector<int64_t>& batch_sizes, const Tensor& h0, const Tensor& c0,
                              bool reverse) {
  const TensorList gi = split(F::linear(rows, w.w_ih, w.b_ih), batch_sizes, 0);
  const int64_t steps = static_cast<int64_t>(batch_sizes.size());
  const bool lstm = mode == RNNMode::LSTM;
  TensorList outputs(steps);
  DirectionOutput out;
  if (!reverse) {
    Tensor h = h0, c = c0;
    TensorList finished_h, finished_c;
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t running = batch_sizes[t], held = h.size(0);
      if (running < held) {
        finished_h.push_back(narrow(h, 0, running, held - running));
        h = narrow(h, 0, 0, running);
        if (lstm) {
          finished_c.push_back(narrow(c, 0, running, held - running));
          c = narrow(c, 0, 0, running);
        }
      }
      std::tie(h, c) = step(mode, gi[t], h, c, w.w_hh, w.b_hh, w.w_hr);
      outputs[t] = h;
    }
    // The rows set aside last sit just below the ones still running.
    auto assemble = [](const Tensor& last, const TensorList& finished) {
      if (finished.empty()) return last;
      TensorList parts{last};
      parts.insert(parts.end(), finished.rbegin(), finished.rend());
      return cat(parts, 0);
    };
    out.h_n = assemble(h, finished_h);
    if (lstm) out.c_n = assemble(c, finished_c);
  } else {
    Tensor h = narrow(h0, 0, 0, batch_sizes.back());
    Tensor c = lstm ? narrow(c0, 0, 0, batch_sizes.back()) : Tensor();
    for (int64_t t = steps - 1; t >= 0; --t) {
      const int64_t running = batch_sizes[t], held = h.size(0);
      if (running > held) {
        h = cat({h, narrow(h0, 0, held, running - held)}, 0);
        if (lstm) c = cat({c, narrow(c0, 0, held, running - held)}, 0);
      }
      std::tie(h, c) = step(mode, gi[t], h, c, w.w_hh, w.b_hh, w.w_hr);
      outputs[t] = h;
    }
    out.h_n = h;
    out.c_n = c;
  }
  out.output = cat(outputs, 0);
  return out;
}

std::string shape_or_undefined(const Tensor& t) { return t.defined() ? shape_str(t.sizes()) : "an undefined tensor"; }

}  // namespace

// ---------------------------------------------------------------- RNNBase

RNNBase::RNNBase(const char* type_name, RNNMode mode, int64_t input_size, int64_t hidden_size,
                 RNNBaseOptions options)
    : Module(type_name), mode(mode), input_size(input_size), hidden_size(hidden_size), options(options) {
  if (input_size <= 0 || hidden_size <= 0) {
    fail("{}: input_size ({}) and hidden_size ({}) must be positive", type_name, input_size, hidden_size);
  }
  if (options.num_layers < 1) fail("{}: num_layers must be at least 1, got {}", type_name, options.num_layers);
  if (!(options.dropout >= 0.0 && options.dropout <= 1.0)) {
    fail("{}: dropout must be a probability in [0, 1], got {}", type_name, options.dropout);
  }
  if (options.proj_size != 0 && mode != RNNMode::LSTM) {
    fail("{}: proj_size ({}) is only supported for LSTM, not RNN or GRU", type_name, options.proj_size);
  }
  if (options.proj_size < 0 || (options.proj_size > 0 && options.proj_size >= hidden_size)) {
    fail("{}: proj_size must be in [0, hidden_size), got proj_size {} with hidden_size {}", type_name,
         options.proj_size, hidden_size);
  }
  const int64_t gates = gate_count(mode) * hidden_size;
  const int64_t directions = options.bidirectional ? 2 : 1;
  for (int64_t layer = 0; layer < options.num_layers; ++layer) {
    const int64_t layer_input = layer == 0 ? input_size : state_size() * directions;
    for (int64_t direction = 0; direction < directions; ++direction) {
      const std::string suffix = fmt::format("_l{}{}", layer, direction == 1 ? "_reverse" : "");
      LayerWeights w;
      w.w_ih = register_parameter("weight_ih" + suffix, empty({gates, layer_input}));
      w.w_hh = register_parameter("weight_hh" + suffix, empty({gates, state_size()}));
      if (options.bias) {
        w.b_ih = register_parameter("bias_ih" + suffix, empty({gates}));
        w.b_hh = register_parameter("bias_hh" + suffix, empty({gates}));
      }
      if (options.proj_size > 0) w.w_hr = register_parameter("weight_hr" + suffix, empty({options.proj_size, hidden_size}));
      weights_.push_back(w);
    }
  }
  reset_parameters();
}

void RNNBase::reset_parameters() {
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  for (Tensor& p : parameters(false)) init::uniform_(p, -bound, bound);
}

std::string RNNBase::extra_repr() const {
  std::string s = fmt::format("{}, {}", input_size, hidden_size);
  if (options.num_layers != 1) s += fmt::format(", num_layers={}", options.num_layers);
  if (mode == RNNMode::RNNRelu) s += ", nonlinearity=relu";
  if (!options.bias) s += ", bias=false";
  if (options.batch_first) s += ", batch_first=true";
  if (options.dropout != 0.0) s += fmt::format(", dropout={}", options.dropout);
  if (options.bidirectional) s += ", bidirectional=true";
  if (options.proj_size > 0) s += fmt::format(", proj_size={}", options.proj_size);
  return s;
}

void RNNBase::check_state(const char* what, const Tensor& state, int64_t batch, bool batched, int64_t features) const {
  if (!state.defined()) return;
  const int64_t stacked = options.num_layers * (options.bidirectional ? 2 : 1);
  const Shape expected = batched ? Shape{stacked, batch, features} : Shape{stacked, features};
  if (state.sizes() != expected) {
    fail("{}: expected {} of shape {} ([num_layers * directions, {}{}]), got {}", type_name(), what,
         shape_str(expected), batched ? "batch, " : "", features == hidden_size ? "hidden_size" : "proj_size",
         shape_or_undefined(state));
  }
}

std::tuple<Tensor, Tensor, Tensor> RNNBase::run(const Tensor& input, const Tensor& hx, const Tensor& cx) {
  if (!input.defined() || (input.dim() != 2 && input.dim() != 3)) {
    fail("{}: expected a 3-D input ([L, N, input_size], [N, L, input_size] with batch_first) or a 2-D unbatched "
         "one [L, input_size], got {}",
         type_name(), shape_or_undefined(input));
  }
  const bool batched = input.dim() == 3;
  const Tensor x = !batched ? unsqueeze(input, 1) : options.batch_first ? transpose(input, 0, 1) : input;
  if (x.size(2) != input_size) {
    fail("{}: expected input with {} features (input_size) in its last dim, got input {}", type_name(), input_size,
         shape_str(input.sizes()));
  }
  const int64_t steps = x.size(0), batch = x.size(1);
  if (steps == 0 || batch == 0) fail("{}: got an empty input {}", type_name(), shape_str(input.sizes()));
  check_state(mode == RNNMode::LSTM ? "h0" : "hx", hx, batch, batched, state_size());
  check_state("c0", cx, batch, batched, hidden_size);
  auto time_major_state = [&](const Tensor& s) { return !s.defined() || batched ? s : unsqueeze(s, 1); };

  const Tensor rows = reshape(x, {steps * batch, input_size});
  auto [output, h_n, c_n] =
      run_packed(rows, std::vector<int64_t>(steps, batch), time_major_state(hx), time_major_state(cx));
  output = reshape(output, {steps, batch, output.size(1)});
  if (!batched) {
    output = squeeze(output, 1);
    h_n = squeeze(h_n, 1);
    if (c_n.defined()) c_n = squeeze(c_n, 1);
  } else if (options.batch_first) {
    output = transpose(output, 0, 1);
  }
  return {output, h_n, c_n};
}

std::tuple<PackedSequence, Tensor, Tensor> RNNBase::run(const PackedSequence& input, const Tensor& hx,
                                                        const Tensor& cx) {
  const std::vector<int64_t> batch_sizes = input.batch_sizes_vector();
  const int64_t total = std::accumulate(batch_sizes.begin(), batch_sizes.end(), int64_t{0});
  if (batch_sizes.empty() || batch_sizes.back() < 1 ||
      !std::is_sorted(batch_sizes.rbegin(), batch_sizes.rend())) {
    fail("{}: a PackedSequence's batch_sizes must be positive and non-increasing, got {}", type_name(), batch_sizes);
  }
  if (!input.data.defined() || input.data.dim() != 2 || input.data.size(0) != total ||
      input.data.size(1) != input_size) {
    fail("{}: expected packed data [{}, {}] (sum of batch_sizes, input_size), got {}", type_name(), total,
         input_size, shape_or_undefined(input.data));
  }
  const int64_t batch = batch_sizes[0];
  check_state(mode == RNNMode::LSTM ? "h0" : "hx", hx, batch, true, state_size());
  check_state("c0", cx, batch, true, hidden_size);
  auto sorted = [&](const Tensor& s) {
    return s.defined() && input.sorted_indices.defined() ? index_select(s, 1, input.sorted_indices) : s;
  };
  auto [output, h_n, c_n] = run_packed(input.data, batch_sizes, sorted(hx), sorted(cx));
  if (input.unsorted_indices.defined()) {
    h_n = index_select(h_n, 1, input.unsorted_indices);
    if (c_n.defined()) c_n = index_select(c_n, 1, input.unsorted_indices);
  }
  return {PackedSequence{output, input.batch_sizes, input.sorted_indices, input.unsorted_indices}, h_n, c_n};
}

std::tuple<Tensor, Tensor, Tensor> RNNBase::run_packed(const Tensor& rows, const std::vector<int64_t>& batch_sizes,
                                                       Tensor h0, Tensor c0) {
  const int64_t directions = options.bidirectional ? 2 : 1;
  const bool lstm = mode == RNNMode::LSTM;
  const int64_t stacked = options.num_layers * directions;
  const TensorOptions state_options{.dtype = rows.dtype(), .device = rows.device()};
  if (!h0.defined()) h0 = zeros({stacked, batch_sizes[0], state_size()}, state_options);
  if (lstm && !c0.defined()) c0 = zeros({stacked, batch_sizes[0], hidden_size}, state_options);

  Tensor layer_input = rows;
  TensorList h_n, c_n;
  for (int64_t layer = 0; layer < options.num_layers; ++layer) {
    TensorList outputs;
    for (int64_t direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      DirectionOutput out = run_direction(mode, weights_[index], layer_input, batch_sizes, select(h0, 0, index),
                                          lstm ? select(c0, 0, index) : Tensor(), direction == 1);
      outputs.push_back(out.output);
      h_n.push_back(out.h_n);
      if (lstm) c_n.push_back(out.c_n);
    }
    layer_input = directions == 2 ? cat(outputs, 1) : outputs[0];
    if (layer + 1 < options.num_layers && options.dropout > 0.0 && is_training()) {
      layer_input = F::dropout(layer_input, options.dropout, true);
    }
  }
  return {layer_input, stack(h_n, 0), lstm ? stack(c_n, 0) : Tensor()};
}

// ---------------------------------------------------------------- RNN, LSTM, GRU

RNN::RNN(int64_t input_size, int64_t hidden_size, RNNOptions o)
    : RNNBase("RNN", rnn_mode(o.nonlinearity), input_size, hidden_size,
              {.num_layers = o.num_layers,
               .bias = o.bias,
               .batch_first = o.batch_first,
               .dropout = o.dropout,
               .bidirectional = o.bidirectional}) {}

std::tuple<Tensor, Tensor> RNN::forward(const Tensor& input, const Tensor& h0) {
  auto [output, h_n, c_n] = run(input, h0, Tensor());
  return {output, h_n};
}

std::tuple<PackedSequence, Tensor> RNN::forward(const PackedSequence& input, const Tensor& h0) {
  auto [output, h_n, c_n] = run(input, h0, Tensor());
  return {output, h_n};
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, LSTMOptions options)
    : RNNBase("LSTM", RNNMode::LSTM, input_size, hidden_size, options) {}

std::tuple<Tensor, LSTM::State> LSTM::forward(const Tensor& input, const std::optional<State>& hx) {
  auto [output, h_n, c_n] = hx ? run(input, std::get<0>(*hx), std::get<1>(*hx)) : run(input, Tensor(), Tensor());
  return {output, {h_n, c_n}};
}

std::tuple<PackedSequence, LSTM::State> LSTM::forward(const PackedSequence& input, const std::optional<State>& hx) {
  auto [output, h_n, c_n] = hx ? run(input, std::get<0>(*hx), std::get<1>(*hx)) : run(input, Tensor(), Tensor());
  return {output, {h_n, c_n}};
}

GRU::GRU(int64_t input_size, int64_t hidden_size, GRUOptions options)
    : RNNBase("GRU", RNNMode::GRU, input_size, hidden_size, options) {}

std::tuple<Tensor, Tensor> GRU::forward(const Tensor& input, const Tensor& h0) {
  auto [output, h_n, c_n] = run(input, h0, Tensor());
  return {output, h_n};
}

std::tuple<PackedSequence, Tensor> GRU::forward(const PackedSequence& input, const Tensor& h0) {
  auto [output, h_n, c_n] = run(input, h0, Tensor());
  return {output, h_n};
}

// ---------------------------------------------------------------- cells

RNNCellBase::RNNCellBase(const char* type_name, RNNMode mode, int64_t input_size, int64_t hidden_size, bool bias)
    : Module(type_name), mode(mode), input_size(input_size), hidden_size(hidden_size) {
  if (input_size <= 0 || hidden_size <= 0) {
    fail("{}: input_size ({}) and hidden_size ({}) must be positive", type_name, input_size, hidden_size);
  }
  const int64_t gates = gate_count(mode) * hidden_size;
  weight_ih = register_parameter("weight_ih", empty({gates, input_size}));
  weight_hh = register_parameter("weight_hh", empty({gates, hidden_size}));
  if (bias) {
    bias_ih = register_parameter("bias_ih", empty({gates}));
    bias_hh = register_parameter("bias_hh", empty({gates}));
  }
  reset_parameters();
}

void RNNCellBase::reset_parameters() {
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  for (Tensor& p : parameters(false)) init::uniform_(p, -bound, bound);
}

std::string RNNCellBase::extra_repr() const {
  return fmt::format("{}, {}{}{}", input_size, hidden_size, bias_ih.defined() ? "" : ", bias=false",
                     mode == RNNMode::RNNRelu ? ", nonlinearity=relu" : "");
}

bool RNNCellBase::prepare(Tensor& input, Tensor& h, Tensor& c) const {
  if (!input.defined() || (input.dim() != 1 && input.dim() != 2) || input.size(-1) != input_size) {
    fail("{}: expected input [N, {}] or unbatched [{}] (input_size {}), got {}", type_name(), input_size, input_size,
         input_size, shape_or_undefined(input));
  }
  const bool batched = input.dim() == 2;
  if (!batched) input = unsqueeze(input, 0);
  const Shape expected = batched ? Shape{input.size(0), hidden_size} : Shape{hidden_size};
  auto prepare_state = [&](Tensor& s, const char* what) {
    if (!s.defined()) {
      s = zeros({input.size(0), hidden_size}, {.dtype = input.dtype(), .device = input.device()});
      return;
    }
    if (s.sizes() != expected) {
      fail("{}: expected {} of shape {} for input {}, got {}", type_name(), what, shape_str(expected),
           shape_str(batched ? input.sizes() : Shape{input_size}), shape_or_undefined(s));
    }
    if (!batched) s = unsqueeze(s, 0);
  };
  prepare_state(h, mode == RNNMode::LSTM ? "h" : "hx");
  if (mode == RNNMode::LSTM) prepare_state(c, "c");
  return batched;
}

RNNCell::RNNCell(int64_t input_size, int64_t hidden_size, bool bias, const std::string& nonlinearity)
    : RNNCellBase("RNNCell", rnn_mode(nonlinearity), input_size, hidden_size, bias) {}

Tensor RNNCell::forward(const Tensor& input, const Tensor& hx) {
  Tensor x = input, h = hx, c;
  const bool batched = prepare(x, h, c);
  Tensor h_next = step(mode, F::linear(x, weight_ih, bias_ih), h, c, weight_hh, bias_hh).first;
  return batched ? h_next : squeeze(h_next, 0);
}

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, bool bias)
    : RNNCellBase("LSTMCell", RNNMode::LSTM, input_size, hidden_size, bias) {}

std::tuple<Tensor, Tensor> LSTMCell::forward(const Tensor& input, const std::optional<std::tuple<Tensor, Tensor>>& hx) {
  Tensor x = input, h, c;
  if (hx) std::tie(h, c) = *hx;
  const bool batched = prepare(x, h, c);
  auto [h_next, c_next] = step(mode, F::linear(x, weight_ih, bias_ih), h, c, weight_hh, bias_hh);
  if (batched) return {h_next, c_next};
  return {squeeze(h_next, 0), squeeze(c_next, 0)};
}

GRUCell::GRUCell(int64_t input_size, int64_t hidden_size, bool bias)
    : RNNCellBase("GRUCell", RNNMode::GRU, input_size, hidden_size, bias) {}

Tensor GRUCell::forward(const Tensor& input, const Tensor& hx) {
  Tensor x = input, h = hx, c;
  const bool batched = prepare(x, h, c);
  Tensor h_next = step(mode, F::linear(x, weight_ih, bias_ih), h, c, weight_hh, bias_hh).first;
  return batched ? h_next : squeeze(h_next, 0);
}

}  // namespace chorus::nn
