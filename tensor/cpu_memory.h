// Bytes held by live CPU tensors and their peak: the CPU's counterpart of memory_allocated /
// max_memory_allocated (tensor/caching_allocator.h, device memory). Counted in Storage (bytes each
// owning CPU storage asked for), so it measures what a program keeps alive — e.g. the activations a
// pipeline stage holds for backward (distributed/pipeline) — not what malloc has mapped.
#pragma once

#include <cstddef>

namespace chorus {

size_t cpu_memory_allocated();
size_t cpu_max_memory_allocated();
// The peak restarts from what is allocated now.
void reset_cpu_peak_memory_stats();

}  // namespace chorus
