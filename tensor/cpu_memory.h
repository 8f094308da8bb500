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
// Bytes of CPU storage the calling thread allocated minus those it freed (negative when it freed
// more). Unlike the totals above, other threads' frees do not change it: what a computation on
// this thread left allocated is the difference of two readings around it, even while, say, a
// communication thread drops the last reference to an older tensor.
long long cpu_memory_allocated_by_this_thread();

}  // namespace chorus
