// Helpers shared by the benchmarks: timing with warm-up and medians, and table printing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
// back to back, in the order f g on even rounds and g f on odd ones.
//
// [Order-balanced ratio] Whichever runs second in a round runs slower: the first has just evicted its
// working set from the caches (train_step_bench's MLP, AVX-512 EPYC, 2026-11-30: chorus 2.2-2.4 ms
// first, 2.6-2.8 ms second; libtorch 2.8-3.0 ms first, 3.5-3.8 ms second). A median over single
// rounds' f / g then falls between two clusters (0.63 for f-first rounds, 0.93 for g-first ones) and
// moves by 0.1 between runs. So each ratio sample is a pair of rounds, one in each order:
// (f's two times) / (g's two times); `ratio` is the median of those, the `a` and `b` medians stay per
// round. `reps` is rounded up to an even count.
//
// [Warm-up by time] The untimed warm-up runs at least `warmup` rounds and at least kMinWarmupS
// seconds: the first steps after a change of thread count run slower for a number of steps, not a
// time (the same MLP at 2 threads: ~27 steps at 3.7 ms, then 2.3 ms; page faults on the new OpenMP
// worker), which 5 warm-up rounds of a 3 ms step did not cover; a slow model's 5 rounds already do.
struct PairedTimes {
  double a = 0, b = 0;  // median seconds of f and of g, over single rounds
  double ratio = 0;     // median over pairs of rounds (one in each order) of f's time / g's time
};

inline constexpr double kMinWarmupS = 1.0;

inline PairedTimes paired_median_times(const std::function<void()>& f, const std::function<void()>& g, int warmup,
                                       int reps) {
  const double warm_start = now_s();
  for (int i = 0; i < warmup || now_s() - warm_start < kMinWarmupS; ++i) {
    f();
    g();
  }
  auto timed = [](const std::function<void()>& h) {
    const double s = now_s();
    h();
    return now_s() - s;
  };
  reps = std::max(2, reps + reps % 2);
  // CHORUS_BENCH_ROUNDS=1: every round's two times on stderr (a slow phase hides in a median).
  static const bool print_rounds = std::getenv("CHORUS_BENCH_ROUNDS") != nullptr;
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
    if (i % 2 == 1) ratios.push_back((ta[i - 1] + x) / (tb[i - 1] + y));
    if (print_rounds) std::fprintf(stderr, "round %d (%s first): %.3f ms / %.3f ms\n", i, i % 2 ? "b" : "a", x * 1e3, y * 1e3);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  return {median(ta), median(tb), median(ratios)};
}

}  // namespace chorus::bench
