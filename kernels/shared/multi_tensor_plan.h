// How a multi-tensor kernel (the CUDA optimizer steps over many parameters, kernels/cuda/optim.cu)
// splits a list of tensors into launches, as PyTorch's multi_tensor_apply does: each launch gets
// the addresses of at most `max_tensors` tensors in one struct passed by value (kernel arguments
// are limited to 4 KiB, so a list of 200 parameters cannot travel in one), and at most
// `max_blocks` blocks, block b working on one chunk of `chunk_elements` elements of one tensor.
// A tensor whose chunks do not fit the current launch continues in the next, as that launch's
// first tensor. Plain C++, tested on the CPU (tests/kernels/shared:multi_tensor_plan_test).
#pragma once

#include <cstdint>
#include <vector>

namespace chorus::kernels::shared {

struct MultiTensorLimits {
  int max_tensors = 48;
  int max_blocks = 320;
  int64_t chunk_elements = 65536;
};

// One launch: which tensors of the caller's list it addresses (in order), and for each block the
// position of its tensor in `tensors` and the chunk of that tensor it updates (elements
// [chunk * chunk_elements, min(numel, (chunk + 1) * chunk_elements))).
struct MultiTensorLaunch {
  std::vector<int> tensors;
  std::vector<int> block_tensor;
  std::vector<int64_t> block_chunk;
};

// Launches covering every element of tensors with these element counts exactly once; empty
// tensors get no block and no slot. chorus::Error on limits that cannot make progress (< 1).
std::vector<MultiTensorLaunch> plan_multi_tensor(const std::vector<int64_t>& numels, const MultiTensorLimits& limits);

}  // namespace chorus::kernels::shared
