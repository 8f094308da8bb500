// The reduction rules every reduce kernel shares, cpu and cuda: which reductions there are, each
// one's identity, and how an element joins the accumulator (NaN sticks in max and min, as PyTorch).
#pragma once

#include <type_traits>

#include "kernels/shared/hd.h"

#if defined(__CUDACC__)
#include <cuda/std/limits>
#else
#include <limits>
#endif

namespace chorus::kernels::shared {

enum class ReduceOp { Sum, Prod, Max, Min };

#if defined(__CUDACC__)
namespace limits_ns = ::cuda::std;
#else
namespace limits_ns = ::std;
#endif

template <typename Acc, ReduceOp Op>
struct ReduceRule {
  static CHORUS_HD CHORUS_INLINE Acc identity() {
    if constexpr (Op == ReduceOp::Sum) return Acc(0);
    else if constexpr (Op == ReduceOp::Prod) return Acc(1);
    // +-inf where the type has it: the max of values that are all -inf is -inf, not the lowest
    // finite value (which an identity of lowest() would give).
    else if constexpr (Op == ReduceOp::Max) {
      if constexpr (limits_ns::numeric_limits<Acc>::has_infinity) return -limits_ns::numeric_limits<Acc>::infinity();
      else return limits_ns::numeric_limits<Acc>::lowest();
    } else {
      if constexpr (limits_ns::numeric_limits<Acc>::has_infinity) return limits_ns::numeric_limits<Acc>::infinity();
      else return limits_ns::numeric_limits<Acc>::max();
    }
  }
  static CHORUS_HD CHORUS_INLINE Acc combine(Acc acc, Acc x) {
    if constexpr (Op == ReduceOp::Sum) return acc + x;
    else if constexpr (Op == ReduceOp::Prod) return acc * x;
    else if constexpr (Op == ReduceOp::Max) {
      if constexpr (std::is_floating_point_v<Acc>) return (x != x || x > acc) ? x : acc;  // NaN sticks
      else return x > acc ? x : acc;
    } else {
      if constexpr (std::is_floating_point_v<Acc>) return (x != x || x < acc) ? x : acc;
      else return x < acc ? x : acc;
    }
  }
  // As a functor, for block and warp reductions that take the combining operation.
  CHORUS_HD CHORUS_INLINE Acc operator()(Acc acc, Acc x) const { return combine(acc, x); }
};

// Batch norm's running statistics after a training batch of `count` values per channel whose
// squared deviations from `mean` sum to `sq` (PyTorch's rule: the running variance takes the
// unbiased estimate). The cpu kernels' two paths and the CUDA fallback kernels all update this way.
template <typename P>
CHORUS_HD CHORUS_INLINE void update_running_stats(P& running_mean, P& running_var, double mean, double sq,
                                                  long long count, double momentum) {
  const double unbiased = count > 1 ? sq / static_cast<double>(count - 1) : sq / static_cast<double>(count);
  running_mean = static_cast<P>((1 - momentum) * running_mean + momentum * mean);
  running_var = static_cast<P>((1 - momentum) * running_var + momentum * unbiased);
}

}  // namespace chorus::kernels::shared
