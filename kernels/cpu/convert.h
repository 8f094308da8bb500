// Element conversion between any two chorus dtypes: the shared Cast functor of
// kernels/shared/pointwise_math.h (float16/bfloat16 go through float32, bit for bit as tensor/dtype),
// so the CPU and CUDA kernels convert alike.
#pragma once

#include "kernels/shared/pointwise_math.h"
#include "tensor/dtype.h"

namespace chorus::kernels::cpu {

using shared::is_reduced_float_v;

template <typename D, typename S>
inline D convert(S v) {
  return shared::Cast<D>{}(v);
}

}  // namespace chorus::kernels::cpu
