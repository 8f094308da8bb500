// The layout-conversion counter behind kernels/layout_conversions.h.
#include "kernels/layout_conversions.h"

#include <atomic>
#include <mutex>

#include <fmt/format.h>

namespace chorus::layout_conversions {
namespace {

const std::string kForward = "forward";
thread_local const std::string* g_phase = nullptr;

struct Counter {
  std::mutex mutex;
  Stats stats;
};
Counter& counter() {
  static Counter* c = new Counter();  // never destroyed: copies may run during static destruction
  return *c;
}

// The one layout `t` is dense in, or nullptr when it is dense in both or neither (no conversion).
const char* only_layout(const Tensor& t) {
  if (t.dim() != 4) return nullptr;
  const bool nchw = t.is_contiguous(), nhwc = t.is_contiguous(MemoryFormat::ChannelsLast);
  if (nchw == nhwc) return nullptr;
  return memory_format_name(nchw ? MemoryFormat::Contiguous : MemoryFormat::ChannelsLast);
}

}  // namespace

std::string Stats::str() const {
  std::string out;
  for (const Kind& k : kinds) {
    out += fmt::format("{} x {}: {} {} on {} {} -> {}\n", k.count, k.phase, dtype_name(k.dtype), shape_str(k.sizes),
                       k.device.str(), k.from, k.to);
  }
  return out;
}

Stats stats() {
  Counter& c = counter();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void reset() {
  Counter& c = counter();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats = Stats();
}

PhaseScope::PhaseScope(const std::string& phase) : previous_(g_phase) { g_phase = &phase; }
PhaseScope::~PhaseScope() { g_phase = previous_; }

namespace detail {

void note_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dim() != 4 || src.dim() != 4 || dst.sizes() != src.sizes()) return;  // the common case, cheaply
  const char* from = only_layout(src);
  const char* to = only_layout(dst);
  if (from == nullptr || to == nullptr || std::string_view(from) == to) return;
  const std::string& phase = g_phase ? *g_phase : kForward;
  Counter& c = counter();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.count += 1;
  c.stats.bytes += static_cast<int64_t>(dst.nbytes());
  for (Kind& k : c.stats.kinds) {
    if (k.phase == phase && k.from == from && k.sizes == dst.sizes() && k.dtype == dst.dtype() &&
        k.device == dst.device()) {
      k.count += 1;
      return;
    }
  }
  c.stats.kinds.push_back(Kind{phase, from, to, dst.sizes(), dst.dtype(), dst.device(), 1});
}

}  // namespace detail
}  // namespace chorus::layout_conversions
