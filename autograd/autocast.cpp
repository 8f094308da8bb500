// Autocast state (thread-local, as PyTorch's) and the casts the ops ask for; see autocast.h.
#include "autograd/autocast.h"

#include <map>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/ops/common.h"
#include "tensor/runtime.h"

namespace chorus::autocast {
namespace {

constexpr int kDeviceTypes = 3;  // CPU, CUDA, Sim

int slot(DeviceType device) { return static_cast<int>(device); }

struct State {
  unsigned enabled_mask = 0;  // bit slot(device)
  DType dtype[kDeviceTypes] = {DType::BFloat16, DType::Float16, DType::Float16};
  int depth = 0;  // nested AutocastGuards with enabled = true
  // A weight's lower-precision copy, keyed by the weight's TensorImpl and, on a device, the stream
  // the cast ran on; the weight is held too so that its address cannot be reused by another tensor
  // while the entry lives.
  struct Entry {
    Tensor source;
    Tensor cast;
    uint32_t version;  // the source's version when cast: an in-place update makes the entry stale
  };
  std::map<std::pair<const void*, const void*>, Entry> cache;
};

thread_local State g_state;

bool floating_castable(const Tensor& t) {
  const DType d = t.dtype();
  return d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16;
}

const Tensor* first_defined(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t && t->defined()) return t;
  return nullptr;
}

}  // namespace

DType default_dtype(DeviceType device) { return device == DeviceType::CPU ? DType::BFloat16 : DType::Float16; }

bool is_enabled(DeviceType device) { return (g_state.enabled_mask >> slot(device)) & 1u; }

DType get_dtype(DeviceType device) { return g_state.dtype[slot(device)]; }

bool any_enabled() { return g_state.enabled_mask != 0; }

void clear_cache() { g_state.cache.clear(); }

AutocastGuard::AutocastGuard(DeviceType device, std::optional<DType> dtype, bool enabled)
    : device_(device), previous_enabled_(is_enabled(device)), previous_dtype_(get_dtype(device)) {
  const DType d = dtype.value_or(default_dtype(device));
  if (d != DType::BFloat16 && d != DType::Float16) {
    fail("autocast: got dtype {} for {}, expected bfloat16 or float16 (the lower precision the matrix products run in)",
         dtype_name(d), device_type_name(device));
  }
  if (enabled) g_state.enabled_mask |= 1u << slot(device);
  else g_state.enabled_mask &= ~(1u << slot(device));
  // A different dtype invalidates the cached copies made in the old one.
  if (d != g_state.dtype[slot(device)]) g_state.cache.clear();
  g_state.dtype[slot(device)] = d;
  ++g_state.depth;
}

AutocastGuard::~AutocastGuard() {
  if (previous_enabled_) g_state.enabled_mask |= 1u << slot(device_);
  else g_state.enabled_mask &= ~(1u << slot(device_));
  if (g_state.dtype[slot(device_)] != previous_dtype_) g_state.cache.clear();
  g_state.dtype[slot(device_)] = previous_dtype_;
  if (--g_state.depth == 0) g_state.cache.clear();
}

DisableGuard::DisableGuard() : previous_mask_(g_state.enabled_mask) { g_state.enabled_mask = 0; }
DisableGuard::~DisableGuard() { g_state.enabled_mask = previous_mask_; }

std::optional<DType> lower_precision(std::initializer_list<const Tensor*> tensors) {
  if (!any_enabled()) return std::nullopt;
  const Tensor* first = first_defined(tensors);
  if (!first || !is_enabled(first->device().type)) return std::nullopt;
  const DType low = get_dtype(first->device().type);
  for (const Tensor* t : tensors) {
    if (t && t->defined() && floating_castable(*t) && t->dtype() != low) return low;
  }
  return std::nullopt;
}

std::optional<DType> full_precision(std::initializer_list<const Tensor*> tensors) {
  if (!any_enabled()) return std::nullopt;
  const Tensor* first = first_defined(tensors);
  if (!first || !is_enabled(first->device().type)) return std::nullopt;
  for (const Tensor* t : tensors) {
    if (t && t->defined() && (t->dtype() == DType::Float16 || t->dtype() == DType::BFloat16)) return DType::Float32;
  }
  return std::nullopt;
}

Tensor cast(const Tensor& t, DType dtype) {
  if (!t.defined() || !floating_castable(t) || t.dtype() == dtype) return t;
  // Only casts that record history are cached: a copy made under NoGradGuard reused later with grad
  // mode on would cut the weight out of the graph.
  const bool cacheable = dtype != DType::Float32 && t.is_leaf() && t.requires_grad() && g_state.depth > 0 &&
                         autograd::GradMode::is_enabled();
  if (!cacheable) return ops::cast(t, dtype);
  // [A cast per stream] On a device the copy is made on the current stream, and a use on another
  // stream would read it with nothing ordering the two (and its memory would go back to the first
  // stream's pool while the second still reads it): each stream gets its own. Until 2026-12-04 one
  // weight shared by forwards on two streams under one guard (two branches, a siamese network) read
  // the first stream's copy unordered (a helper's audit; autocast_test's sim case). PyTorch's cache
  // is keyed by the tensor alone.
  const std::pair<const void*, const void*> key{
      t.unsafe_impl(), t.device().is_cpu() ? nullptr : static_cast<const void*>(current_stream(t.device()).handle())};
  auto it = g_state.cache.find(key);
  if (it != g_state.cache.end() && it->second.cast.dtype() == dtype && it->second.version == t.version())
    return it->second.cast;
  Tensor low = ops::cast(t, dtype);
  g_state.cache[key] = {t, low, t.version()};
  return low;
}

}  // namespace chorus::autocast
