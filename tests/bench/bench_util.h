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

// Two workloads timed in alternation, for a ratio that the machine's drift does not move: this VM's
// speed wanders by 10-30% over a minute (docs/benchmarks.md), so a ratio of two medians timed one
// after the other measures the drift as much as the code. Each of the `reps` rounds runs f and g
// back to back, in the order f g on even rounds and g f on odd ones (neither always runs second,
// after the other has filled the caches); `ratio` is the median of the rounds' f / g.
struct PairedTimes {
  double a = 0, b = 0;  // median seconds of f and of g
  double ratio = 0;     // median over rounds of f's time / g's time in that round
};

inline PairedTimes paired_median_times(const std::function<void()>& f, const std::function<void()>& g, int warmup,
                                       int reps) {
  for (int i = 0; i < warmup; ++i) {
    f();
    g();
  }
  auto timed = [](const std::function<void()>& h) {
    const double s = now_s();
    h();
    return now_s() - s;
  };
  std::vector<double> ta, tb, ratios;
  for (int i = 0; i < reps; ++i) {
    double x, y;
    if (i % 2 == 0) {
      x = timed(f);
      y = timed(g);
    } else {
      y = timed(g);
      x = timed(f);
    }
    ta.push_back(x);
    tb.push_back(y);
    ratios.push_back(x / y);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  return {median(ta), median(tb), median(ratios)};
}

}  // namespace chorus::bench
