// A model's per-layer profile: what the DAPPLE planner knows about each layer of a model given as a
// sequence of layers (forward and backward time, the bytes a layer sends to the next one, the bytes
// it keeps for backward, its parameter bytes), measured at one batch size. The planner assumes
// time and activation bytes scale linearly with the number of samples (a micro-batch of b samples
// costs b / batch of the profiled figures); parameter bytes do not scale.
//
// JSON (profile_to_json / profile_from_json; the `profile` tool writes it):
//   {"batch": 8, "model": "mlp",                          // "model" optional
//    "layers": [{"name": "0", "forward_ms": 1.2, "backward_ms": 2.3, "activation_bytes": 32768,
//                "param_bytes": 1050624, "saved_bytes": 65536}]}     // "saved_bytes" optional
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::distributed::pipeline::planner {

struct LayerProfile {
  std::string name;
  double forward_ms = 0;         // one forward of the profiled batch
  double backward_ms = 0;        // its backward (input and parameter gradients)
  int64_t activation_bytes = 0;  // the layer's output: what crosses a stage boundary after it
  int64_t param_bytes = 0;
  // What one forward leaves allocated until its backward (the output and every tensor autograd
  // saved). Where not measured, the output size stands in for it (saved_bytes < 0 in memory means
  // "not measured"; saved_or_activation_bytes() resolves it).
  int64_t saved_bytes = -1;

  int64_t saved_or_activation_bytes() const { return saved_bytes >= 0 ? saved_bytes : activation_bytes; }
};

struct ModelProfile {
  std::vector<LayerProfile> layers;
  int64_t batch = 1;  // samples per profiled forward/backward
  std::string model;  // free text: which model, which input

  int num_layers() const { return static_cast<int>(layers.size()); }
};

// Strict JSON: unknown keys, missing keys, wrong types, negative values, batch < 1 or no layers
// are a chorus::Error naming `source` (e.g. the file name), the key and what was expected.
ModelProfile profile_from_json(const std::string& text, const std::string& source = "profile");
std::string profile_to_json(const ModelProfile& profile);
ModelProfile load_profile(const std::string& path);
void save_profile(const ModelProfile& profile, const std::string& path);

}  // namespace chorus::distributed::pipeline::planner
