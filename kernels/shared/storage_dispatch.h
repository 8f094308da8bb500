// The dtype dispatch of the kernels that take float16/bfloat16 storage beside float32 parameters
// (batch_norm, layer_norm, cross_entropy, softmax; on the CPU and CUDA alike): PyTorch's mixed-type
// norms, what autocast and a bfloat16 model give. Host code; nvcc includes it too.
#pragma once

#include <initializer_list>

#include "kernels/shared/pointwise_math.h"
#include "tensor/tensor.h"

namespace chorus::kernels::shared {

// Calls fn.template operator()<T, P>() for x's storage type T (float32, float64, float16,
// bfloat16) and P = opmath_t<T> (float for the 16-bit types, else T), after checking that every
// defined tensor of `params` (statistics, weight, bias, losses, parameter gradients) has dtype P.
template <typename Fn>
void dispatch_float_storage(const Tensor& x, const char* op, std::initializer_list<const Tensor*> params,
                            const Fn& fn) {
  auto run = [&]<typename T>() {
    using P = opmath_t<T>;
    for (const Tensor* t : params) {
      if (t->defined() && t->dtype() != dtype_of<P>::value) {
        fail("{}: a {} input takes {} weight, bias and statistics, got {}", op, dtype_name(x.dtype()),
             dtype_name(dtype_of<P>::value), dtype_name(t->dtype()));
      }
    }
    fn.template operator()<T, P>();
  };
  switch (x.dtype()) {
    case DType::Float32: return run.template operator()<float>();
    case DType::Float64: return run.template operator()<double>();
    case DType::Float16: return run.template operator()<Half>();
    case DType::BFloat16: return run.template operator()<BFloat16>();
    default: fail("{}: expected a floating-point input, got {}", op, dtype_name(x.dtype()));
  }
}

}  // namespace chorus::kernels::shared
