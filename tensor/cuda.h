// The CUDA user API in PyTorch's words (torch::cuda / torch.cuda): whether there is a GPU, waiting
// for it, and its memory statistics. Works in every build: without a CUDA toolkit or GPU,
// is_available() is false and every other call raises "no CUDA device: ...".
// Streams, events and guards for any device are in tensor/runtime.h.
#pragma once

#include "tensor/caching_allocator.h"
#include "tensor/runtime.h"

namespace chorus::cuda {

inline bool is_available() { return chorus::device_count(DeviceType::CUDA) > 0; }
inline int num_devices() { return chorus::device_count(DeviceType::CUDA); }
// Blocks until all work on every stream of cuda:device has completed.
inline void synchronize(int device = 0) { chorus::synchronize(Device::cuda(device)); }
inline void set_device(int device) { chorus::set_device(Device::cuda(device)); }
inline int current_device() { return chorus::current_device_index(DeviceType::CUDA); }
inline Stream current_stream(int device = 0) { return chorus::current_stream(Device::cuda(device)); }
inline size_t memory_allocated(int device = 0) { return chorus::memory_allocated(Device::cuda(device)); }
inline size_t memory_reserved(int device = 0) { return chorus::memory_reserved(Device::cuda(device)); }
inline size_t max_memory_allocated(int device = 0) { return chorus::max_memory_allocated(Device::cuda(device)); }
inline void reset_peak_memory_stats(int device = 0) { chorus::reset_peak_memory_stats(Device::cuda(device)); }
inline void empty_cache(int device = 0) { chorus::empty_cache(Device::cuda(device)); }

}  // namespace chorus::cuda
