// Helpers shared by the benchmarks: timing with warm-up and medians, and table printing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace chorus::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of `reps` runs of f after `warmup` untimed runs.
inline double median_time(const std::function<void()>& f, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double s = now_s();
    f();
    t.push_back(now_s() - s);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace chorus::bench
