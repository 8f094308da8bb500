// Per-layer profiling (see profiler.h).
#include "distributed/pipeline/planner/profiler.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "autograd/grad_mode.h"
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

// Per layer: median forward ms, backward ms with no gradient yet (the micro-batch that sets
// .grad) and backward ms adding into existing gradients (every later micro-batch).
struct StackTimes {
  std::vector<double> forward, backward, backward_accumulating;
  std::vector<Tensor> outputs;  // each layer's output (detached), from the last run
};

// Times the layers as a stage runs them, so each sees the caches a training step leaves it (a
// layer timed alone in a loop keeps its weights in cache, which a model larger than the cache does
// not): all forwards in order, then all backwards in reverse, each layer's input a leaf as a
// stage's received activation is, each backward fed the gradient of the next layer's input. Every
// run does this twice: once after zero_grad (backward sets the gradients), once more without (it
// adds to them: AccumulateGrad's in-place add, which micro-batches after the first pay).
StackTimes time_stack(const NamedLayers& layers, const Tensor& input, const ProfileOptions& options) {
  const size_t L = layers.size();
  StackTimes out;
  std::vector<std::vector<double>> f(L), b(L), b_acc(L);
  out.outputs.resize(L);
  for (int run = 0; run < options.warmup + options.repeats; ++run) {
    for (int pass = 0; pass < 2; ++pass) {
      const bool accumulating = pass == 1;
      if (!accumulating)
        for (const auto& [name, layer] : layers) layer->zero_grad();
      std::vector<Tensor> xs(L), ys(L);
      Tensor value = input;
      for (size_t i = 0; i < L; ++i) {
        xs[i] = stage_input(value, i == 0);
        const auto t0 = Clock::now();
        ys[i] = layers[i].second->forward(xs[i]);
        if (run >= options.warmup) f[i].push_back(ms_since(t0));
        value = ys[i].detach();
      }
      Tensor grad = ones_like(ys[L - 1]);
      for (size_t i = L; i-- > 0;) {
        const auto t0 = Clock::now();
        ys[i].backward(grad);
        if (run >= options.warmup) (accumulating ? b_acc : b)[i].push_back(ms_since(t0));
        if (i > 0) grad = xs[i].grad();
      }
      if (run == options.warmup + options.repeats - 1 && !accumulating)
        for (size_t i = 0; i < L; ++i) out.outputs[i] = ys[i].detach();
    }
  }
  for (const auto& [name, layer] : layers) layer->zero_grad();
  for (size_t i = 0; i < L; ++i) {
    out.forward.push_back(median(f[i]));
    out.backward.push_back(median(b[i]));
    out.backward_accumulating.push_back(median(b_acc[i]));
  }
  return out;
}

// `rows` rows of `value` (its first rows, or all of it repeated).
Tensor rows_of(const Tensor& value, int64_t rows) {
  const int64_t have = value.size(0);
  if (rows <= have) return value.narrow(0, 0, rows).contiguous();
  TensorList parts;
  for (int64_t left = rows; left > 0; left -= std::min(left, have)) parts.push_back(value.narrow(0, 0, std::min(left, have)));
  return cat(parts, 0);
}

// The parameters' gradients after one backward (those that got one).
std::vector<std::pair<Tensor, Tensor>> params_with_grads(nn::Module& layer, const Tensor& input, bool first) {
  layer.zero_grad();
  Tensor y = layer.forward(stage_input(input, first));
  y.backward(ones_like(y));
  std::vector<std::pair<Tensor, Tensor>> out;
  for (const Tensor& p : layer.parameters())
    if (p.grad().defined()) out.push_back({p, p.grad()});
  return out;
}

// One optimizer step over the layer's parameters (restored afterwards).
double time_optimizer(nn::Module& layer, const Tensor& input, bool first, const ProfileOptions& options) {
  auto grads = params_with_grads(layer, input, first);
  if (grads.empty()) return 0.0;
  std::vector<Tensor> params, saved;
  for (auto& [p, g] : grads) params.push_back(p), saved.push_back(p.detach().clone());
  std::unique_ptr<optim::Optimizer> optimizer = options.make_optimizer(params);
  std::vector<double> times;
  for (int run = 0; run < options.warmup + options.repeats; ++run) {
    const auto t0 = Clock::now();
    optimizer->step();
    if (run >= options.warmup) times.push_back(ms_since(t0));
  }
  {
    NoGradGuard no_grad;
    for (size_t k = 0; k < params.size(); ++k) params[k].copy_(saved[k]);
  }
  layer.zero_grad();
  return median(times);
}

}  // namespace

ModelProfile profile_layers(const NamedLayers& layers, const Tensor& input, const ProfileOptions& options,
                            std::vector<std::string>* notes) {
  if (layers.empty()) fail("profile_layers: got no layers, expected at least one");
  if (options.repeats < 1 || options.warmup < 0)
    fail("profile_layers: got warmup = {}, repeats = {}, expected warmup >= 0 and repeats >= 1", options.warmup,
         options.repeats);
  if (input.dim() < 1) fail("profile_layers: got a 0-d input, expected the batch as the first dimension");
  for (int64_t b : options.extra_batches)
    if (b < 1) fail("profile_layers: got an extra batch size of {}, expected at least 1", b);
  ModelProfile profile;
  profile.batch = input.size(0);
  std::vector<int64_t> extra;
  for (int64_t b : options.extra_batches)
    if (b != profile.batch && std::find(extra.begin(), extra.end(), b) == extra.end()) extra.push_back(b);
  for (size_t i = 0; i < layers.size(); ++i)
    if (!layers[i].second) fail("profile_layers: layer {} (\"{}\") is null, expected a module", i, layers[i].first);
  const StackTimes main = time_stack(layers, input, options);
  std::vector<StackTimes> others;
  for (int64_t b : extra) others.push_back(time_stack(layers, rows_of(input, b), options));
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& [name, layer] = layers[i];
    const bool first = i == 0;
    const Tensor& layer_input = first ? input : main.outputs[i - 1];
    LayerProfile lp;
    lp.name = name;
    for (const Tensor& p : layer->parameters()) lp.param_bytes += static_cast<int64_t>(p.nbytes());
    lp.forward_ms = main.forward[i];
    lp.backward_ms = main.backward[i];
    lp.activation_bytes = static_cast<int64_t>(main.outputs[i].nbytes());
    for (size_t k = 0; k < extra.size(); ++k) lp.timings.push_back({extra[k], others[k].forward[i], others[k].backward[i]});
    std::sort(lp.timings.begin(), lp.timings.end(),
              [](const BatchTiming& a, const BatchTiming& b) { return a.batch < b.batch; });
    // The extra a backward costs when gradients exist (measured at the profiled batch; the add
    // does not depend on the batch size). Timing noise can make the difference negative: 0 then.
    if (options.measure_grad_accumulate)
      lp.grad_accumulate_ms = std::max(0.0, main.backward_accumulating[i] - main.backward[i]);
    if (options.make_optimizer) lp.optimizer_ms = time_optimizer(*layer, layer_input, first, options);
    if (options.measure_saved_bytes) {
      try {
        lp.saved_bytes = saved_bytes_on(*layer, layer_input, first, options.memory_device);
      } catch (const Error& e) {
        // The layer does not run on the memory device: its output stands in (profile.h), and the
        // caller hears why.
        if (notes) notes->push_back(fmt::format("layer {} (\"{}\"): saved bytes not measured on {}: {}", i, name,
                                                options.memory_device.str(), e.what()));
      }
    }
    profile.layers.push_back(std::move(lp));
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
