#include "tensor/test_faults.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace chorus::fault {
namespace {

constexpr int kPoints = static_cast<int>(Point::kCount);
std::atomic<bool> g_removed[kPoints];

bool removed_here(Point p) { return g_removed[static_cast<int>(p)].load(std::memory_order_relaxed); }

// Streams armed by fail_next_stream_task; the count keeps the common path (nothing armed) to one load.
std::mutex g_armed_mutex;
std::multiset<const void*> g_armed;
std::atomic<int> g_armed_count{0};

bool take_armed(const void* stream) {
  if (g_armed_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(g_armed_mutex);
  auto it = g_armed.find(stream);
  if (it == g_armed.end()) return false;
  g_armed.erase(it);
  g_armed_count.fetch_sub(1);
  return true;
}

// Reads CHORUS_TEST_FAULT and installs the source, at static initialization of the test binary.
const bool g_installed = [] {
  if (const char* v = std::getenv("CHORUS_TEST_FAULT"); v != nullptr) {
    std::string list = v;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find(',', start), list.size());
      const std::string item = list.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      bool known = false;
      for (int i = 0; i < kPoints; ++i) {
        if (item == name(static_cast<Point>(i))) {
          g_removed[i] = true;
          known = true;
        }
      }
      if (!known) {
        std::string names;
        for (int i = 0; i < kPoints; ++i) names += std::string(i ? ", " : "") + name(static_cast<Point>(i));
        std::fprintf(stderr, "CHORUS_TEST_FAULT: unknown ordering point '%s' (known: %s)\n", item.c_str(), names.c_str());
        std::exit(2);
      }
      std::fprintf(stderr, "CHORUS_TEST_FAULT: ordering point '%s' removed (a negative control)\n", item.c_str());
    }
  }
  install_source(&removed_here);
  install_stream_failure_source(&take_armed);
  return true;
}();

}  // namespace

void set_removed(Point p, bool removed) { g_removed[static_cast<int>(p)].store(removed); }

void fail_next_stream_task(const Stream& stream) {
  std::lock_guard<std::mutex> lock(g_armed_mutex);
  g_armed.insert(stream.handle());
  g_armed_count.fetch_add(1);
}

}  // namespace chorus::fault
