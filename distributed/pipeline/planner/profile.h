// A model's per-layer profile: what the DAPPLE planner knows about each layer of a model given as a
// sequence of layers (forward and backward time, the bytes a layer sends to the next one, the bytes
// it keeps for backward, its parameter bytes), measured at one batch size, and optionally the
// times at other batch sizes (`timings`: a micro-batch of 16 samples is rarely 1/8 of the time of
// 128), the time to add one micro-batch's parameter gradients into those already accumulated, and
// the time of one optimizer step over the layer's parameters. Byte counts scale linearly with the
// number of samples (a micro-batch of b samples holds b / batch of them); times are interpolated
// between the measured batch sizes (see time_at); parameter bytes do not scale.
//
// JSON (profile_to_json / profile_from_json; the `profile` tool writes it):
//   {"batch": 8, "model": "mlp",                          // "model" optional
//    "layers": [{"name": "0", "forward_ms": 1.2, "backward_ms": 2.3, "activation_bytes": 32768,
//                "param_bytes": 1050624, "saved_bytes": 65536,   // the rest optional
//                "grad_accumulate_ms": 0.1, "optimizer_ms": 0.2,
//                "timings": [{"batch": 2, "forward_ms": 0.4, "backward_ms": 0.7}]}]}
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace chorus::distributed::pipeline::planner {

// Forward and backward time of one batch of `batch` samples.
struct BatchTiming {
  int64_t batch = 1;
  double forward_ms = 0;
  double backward_ms = 0;
};

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
  // Adding one micro-batch's gradients into the parameters' accumulated ones (every micro-batch's
  // backward after the first pays it; independent of the micro-batch size). 0: not measured.
  double grad_accumulate_ms = 0;
  double optimizer_ms = 0;  // one optimizer step over the layer's parameters; 0: not measured
  // Times at batch sizes other than the profile's `batch` (no duplicates, none equal to it).
  std::vector<BatchTiming> timings{};

  int64_t saved_or_activation_bytes() const { return saved_bytes >= 0 ? saved_bytes : activation_bytes; }

  // Forward + backward figures for `samples` samples (> 0), from the points measured (the profile's
  // batch and `timings`): linear between the two nearest sizes, and proportional to the samples
  // (time per sample of the nearest size) below the smallest and above the largest. With one point
  // that is the plain linear scaling.
  BatchTiming time_at(double samples, int64_t profile_batch) const;
  // The least time per sample over the measured points (forward, backward): time_at(s) >= s * it
  // for every s, which the planner's lower bounds need.
  std::pair<double, double> min_ms_per_sample(int64_t profile_batch) const;
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
