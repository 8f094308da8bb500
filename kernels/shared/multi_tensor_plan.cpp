#include "kernels/shared/multi_tensor_plan.h"

#include "tensor/error.h"

namespace chorus::kernels::shared {

std::vector<MultiTensorLaunch> plan_multi_tensor(const std::vector<int64_t>& numels, const MultiTensorLimits& limits) {
  if (limits.max_tensors < 1 || limits.max_blocks < 1 || limits.chunk_elements < 1) {
    fail("plan_multi_tensor: limits must be >= 1 (got max_tensors {}, max_blocks {}, chunk_elements {})",
         limits.max_tensors, limits.max_blocks, limits.chunk_elements);
  }
  std::vector<MultiTensorLaunch> launches;
  MultiTensorLaunch current;
  for (size_t t = 0; t < numels.size(); ++t) {
    if (numels[t] <= 0) continue;
    current.tensors.push_back(static_cast<int>(t));
    const int64_t chunks = (numels[t] + limits.chunk_elements - 1) / limits.chunk_elements;
    for (int64_t c = 0; c < chunks; ++c) {
      current.block_tensor.push_back(static_cast<int>(current.tensors.size()) - 1);
      current.block_chunk.push_back(c);
      const bool last_chunk = c == chunks - 1;
      const bool tensors_full = static_cast<int>(current.tensors.size()) == limits.max_tensors && last_chunk;
      const bool blocks_full = static_cast<int>(current.block_tensor.size()) == limits.max_blocks;
      if (tensors_full || blocks_full) {
        launches.push_back(std::move(current));
        current = MultiTensorLaunch{};
        // The rest of this tensor's chunks go to the next launch, which addresses it first.
        if (!last_chunk) current.tensors.push_back(static_cast<int>(t));
      }
    }
  }
  if (!current.block_tensor.empty()) launches.push_back(std::move(current));
  return launches;
}

}  // namespace chorus::kernels::shared
