// Recurrent layers as PyTorch's: RNN, LSTM, GRU and their single-step cells. Parameter names, shapes,
// gate order (LSTM i,f,g,o; GRU r,z,n) and init (U(-1/sqrt(hidden), 1/sqrt(hidden))) match
// torch::nn's, so state dicts map one to one. Each step is made of linear, sigmoid, tanh and slicing,
// so autograd and every device come from those ops. A PackedSequence (nn/utils/rnn.h) runs each
// sequence over its own length only.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "nn/module.h"
#include "nn/utils/rnn.h"

namespace chorus::nn {

using utils::rnn::PackedSequence;

enum class RNNMode { RNNTanh, RNNRelu, LSTM, GRU };

// The knobs the three layers share (torch::nn::RNNOptions less input and hidden size).
struct RNNBaseOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;  // input and output [N, L, *] instead of [L, N, *]; h_n stays [layers, N, H]
  double dropout = 0.0;      // on every layer's output but the last, in training
  bool bidirectional = false;
  // LSTM only: h is projected to this many features by weight_hr (0: no projection, h has
  // hidden_size features); must be smaller than hidden_size.
  int64_t proj_size = 0;
};

struct RNNOptions {
  int64_t num_layers = 1;
  std::string nonlinearity = "tanh";  // or "relu"
  bool bias = true;
  bool batch_first = false;
  double dropout = 0.0;
  bool bidirectional = false;
};
using LSTMOptions = RNNBaseOptions;
using GRUOptions = RNNBaseOptions;

// Parameters per layer l and direction (suffix "_reverse" for the backward one):
// weight_ih_l{l} [G*H, in], weight_hh_l{l} [G*H, R], bias_ih_l{l}, bias_hh_l{l} [G*H], with G gates
// (1 for RNN, 4 for LSTM, 3 for GRU), R = proj_size if set else H, and in = input_size for layer 0,
// R * directions above it; with proj_size, LSTM also has weight_hr_l{l} [proj_size, H].
class RNNBase : public Module {
 public:
  struct LayerWeights {
    Tensor w_ih, w_hh, b_ih, b_hh;  // biases undefined without bias
    Tensor w_hr;                    // LSTM's projection; undefined without proj_size
  };

  void reset_parameters();
  // Layer by layer, forward direction then reverse.
  const std::vector<LayerWeights>& all_weights() const { return weights_; }

  RNNMode mode;
  int64_t input_size, hidden_size;
  RNNBaseOptions options;

 protected:
  RNNBase(const char* type_name, RNNMode mode, int64_t input_size, int64_t hidden_size, RNNBaseOptions options);
  std::string extra_repr() const override;

  // The whole stack over a padded input [L, N, I] / [N, L, I] / unbatched [L, I], or a packed one.
  // hx: h0 [layers * directions, N, H] ([layers * directions, H] unbatched) or undefined for zeros;
  // cx the same for LSTM's c0. Returns (output, h_n, c_n), c_n undefined but for LSTM.
  std::tuple<Tensor, Tensor, Tensor> run(const Tensor& input, const Tensor& hx, const Tensor& cx);
  std::tuple<PackedSequence, Tensor, Tensor> run(const PackedSequence& input, const Tensor& hx, const Tensor& cx);

 private:
  // Time-major packed rows [sum(batch_sizes), I] through every layer; h0/c0 in sorted batch order.
  std::tuple<Tensor, Tensor, Tensor> run_packed(const Tensor& rows, const std::vector<int64_t>& batch_sizes,
                                                Tensor h0, Tensor c0);
  void check_state(const char* what, const Tensor& state, int64_t batch, bool batched, int64_t features) const;
  // The features of h: proj_size when set, else hidden_size.
  int64_t state_size() const { return options.proj_size > 0 ? options.proj_size : hidden_size; }

  std::vector<LayerWeights> weights_;
};

class RNN : public RNNBase {
 public:
  RNN(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  // (output [L, N, D*H], h_n [layers*D, N, H]); h0 undefined means zeros.
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& h0);
  std::tuple<PackedSequence, Tensor> forward(const PackedSequence& input, const Tensor& h0 = Tensor());
  // The output alone, for Sequential.
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, Tensor())); }
};

class LSTM : public RNNBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, LSTMOptions options = {});
  using State = std::tuple<Tensor, Tensor>;  // (h, c)
  // (output, (h_n, c_n)); without hx both start at zeros.
  std::tuple<Tensor, State> forward(const Tensor& input, const std::optional<State>& hx);
  std::tuple<PackedSequence, State> forward(const PackedSequence& input, const std::optional<State>& hx = std::nullopt);
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, std::nullopt)); }
};

class GRU : public RNNBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, GRUOptions options = {});
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& h0);
  std::tuple<PackedSequence, Tensor> forward(const PackedSequence& input, const Tensor& h0 = Tensor());
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, Tensor())); }
};

// ---- cells: one time step; input [N, I] or unbatched [I], state [N, H] or [H] (undefined = zeros).
// Parameters weight_ih [G*H, I], weight_hh [G*H, H], bias_ih, bias_hh [G*H].
class RNNCellBase : public Module {
 public:
  void reset_parameters();

  RNNMode mode;
  int64_t input_size, hidden_size;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;

 protected:
  RNNCellBase(const char* type_name, RNNMode mode, int64_t input_size, int64_t hidden_size, bool bias);
  std::string extra_repr() const override;
  // Checks the input and state, adds the batch dim to unbatched ones; returns whether it was batched.
  bool prepare(Tensor& input, Tensor& h, Tensor& c) const;
};

class RNNCell : public RNNCellBase {
 public:
  RNNCell(int64_t input_size, int64_t hidden_size, bool bias = true, const std::string& nonlinearity = "tanh");
  Tensor forward(const Tensor& input, const Tensor& hx);
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
};

class LSTMCell : public RNNCellBase {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  // (h', c')
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const std::optional<std::tuple<Tensor, Tensor>>& hx);
  Tensor forward(const Tensor& input) override { return std::get<0>(forward(input, std::nullopt)); }
};

class GRUCell : public RNNCellBase {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  Tensor forward(const Tensor& input, const Tensor& hx);
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
};

}  // namespace chorus::nn
