// Per-layer profiling (see profiler.h).
#include "distributed/pipeline/planner/profiler.h"

#include <algorithm>
#include <chrono>

#include "tensor/caching_allocator.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace chorus::distributed::pipeline::planner {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The layer's input as a stage would receive it: a leaf that needs a gradient when it is floating
// point (the previous stage wants it back), none for integer inputs such as token ids.
Tensor stage_input(const Tensor& value, bool first) {
  Tensor x = value.detach();
  if (!first && x.is_floating_point()) x.requires_grad_(true);
  return x;
}

// Bytes one forward of `layer` on `device` leaves allocated until its backward: the caching
// allocator's requested bytes after the forward (output and graph alive) minus before.
int64_t saved_bytes_on(nn::Module& layer, const Tensor& cpu_input, bool first, Device device) {
  layer.zero_grad();
  layer.to(device);
  int64_t saved = 0;
  try {
    Tensor x = stage_input(cpu_input.to(device), first);
    // Synchronized before each reading: a device's stream tasks hold the tensors they read until
    // they have run, so a temporary the forward already dropped (e.g. a Linear's output that ReLU
    // consumed) would otherwise still count, or not, depending on how far the stream had got.
    synchronize(device);
    const size_t before = memory_stats(device).requested_bytes;
    Tensor y = layer.forward(x);
    synchronize(device);
    saved = static_cast<int64_t>(memory_stats(device).requested_bytes) - static_cast<int64_t>(before);
    y.backward(ones_like(y));
  } catch (const Error&) {
    layer.zero_grad();
    layer.to(Device::cpu());  // the layer is the caller's: leave it where it was
    throw;
  }
  layer.zero_grad();
  layer.to(Device::cpu());
  return saved;
}

}  // namespace

ModelProfile profile_layers(const NamedLayers& layers, const Tensor& input, const ProfileOptions& options,
                            std::vector<std::string>* notes) {
  if (layers.empty()) fail("profile_layers: got no layers, expected at least one");
  if (options.repeats < 1 || options.warmup < 0)
    fail("profile_layers: got warmup = {}, repeats = {}, expected warmup >= 0 and repeats >= 1", options.warmup,
         options.repeats);
  if (input.dim() < 1) fail("profile_layers: got a 0-d input, expected the batch as the first dimension");
  ModelProfile profile;
  profile.batch = input.size(0);
  Tensor value = input;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& [name, layer] = layers[i];
    if (!layer) fail("profile_layers: layer {} (\"{}\") is null, expected a module", i, name);
    LayerProfile lp;
    lp.name = name;
    for (const Tensor& p : layer->parameters()) lp.param_bytes += static_cast<int64_t>(p.nbytes());
    std::vector<double> forward, backward;
    Tensor output;
    for (int run = 0; run < options.warmup + options.repeats; ++run) {
      layer->zero_grad();
      Tensor x = stage_input(value, i == 0);
      auto t0 = Clock::now();
      Tensor y = layer->forward(x);
      const double f = ms_since(t0);
      Tensor grad = ones_like(y);
      t0 = Clock::now();
      y.backward(grad);
      const double b = ms_since(t0);
      if (run >= options.warmup) forward.push_back(f), backward.push_back(b);
      output = y.detach();
    }
    layer->zero_grad();
    lp.forward_ms = median(forward);
    lp.backward_ms = median(backward);
    lp.activation_bytes = static_cast<int64_t>(output.nbytes());
    if (options.measure_saved_bytes) {
      try {
        lp.saved_bytes = saved_bytes_on(*layer, value, i == 0, options.memory_device);
      } catch (const Error& e) {
        // The layer does not run on the memory device: its output stands in (profile.h), and the
        // caller hears why.
        if (notes) notes->push_back(fmt::format("layer {} (\"{}\"): saved bytes not measured on {}: {}", i, name,
                                                options.memory_device.str(), e.what()));
      }
    }
    profile.layers.push_back(std::move(lp));
    value = output;
  }
  return profile;
}

ModelProfile profile_sequential(const nn::Sequential& model, const Tensor& input, const ProfileOptions& options,
                                std::vector<std::string>* notes) {
  NamedLayers layers;
  for (size_t i = 0; i < model.size(); ++i) layers.push_back({std::to_string(i), model[i]});
  return profile_layers(layers, input, options, notes);
}

}  // namespace chorus::distributed::pipeline::planner
