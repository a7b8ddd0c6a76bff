#pragma once
// The high-water marks of libtorch's caching allocator on a GPU, recorded
// per run beside the process's peak RSS: what the tensors held at most
// (allocated) and what the allocator held from the driver (reserved, which
// decides whether a larger model fits).
#include <ATen/core/Tensor.h>

namespace chiar::engine {

struct GpuMemoryPeak {
  double allocated_mb = -1;  // -1: not measured (not a CUDA device, or a libtorch without CUDA)
  double reserved_mb = -1;
};

// Starts the marks afresh from what the device holds now (nothing for
// another device).
void reset_gpu_memory_peak(const at::Device& device);
// Hands the allocator's cached, unused blocks back to the driver, so that
// the next reserved mark is one model's alone (a benchmark between variants).
void release_gpu_cache(const at::Device& device);
// The marks since the last reset.
GpuMemoryPeak gpu_memory_peak(const at::Device& device);

}  // namespace chiar::engine
