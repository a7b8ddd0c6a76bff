#include "engine/runtime/gpu_memory.h"

#include "chiar_build_info.h"  // CHIAR_TORCH_CUDA
#if CHIAR_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace chiar::engine {

#if CHIAR_TORCH_CUDA
namespace {

// Index 0 of the allocator's per-pool statistics is the aggregate over its
// pools (StatType::AGGREGATE, whose namespace moved between libtorch versions).
constexpr size_t kAggregate = 0;

// "cuda" without an index is the current device, as libtorch places tensors.
c10::DeviceIndex index_of(const at::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

}  // namespace

void reset_gpu_memory_peak(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(index_of(device));
}

void release_gpu_cache(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
}

GpuMemoryPeak gpu_memory_peak(const at::Device& device) {
  if (!device.is_cuda()) return {};
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_of(device));
  constexpr double kMiB = 1024.0 * 1024.0;
  return {static_cast<double>(stats.allocated_bytes[kAggregate].peak) / kMiB,
          static_cast<double>(stats.reserved_bytes[kAggregate].peak) / kMiB};
}
#else
// A libtorch without CUDA has no GPU to measure: no marks.
void reset_gpu_memory_peak(const at::Device&) {}
void release_gpu_cache(const at::Device&) {}
GpuMemoryPeak gpu_memory_peak(const at::Device&) { return {}; }
#endif

}  // namespace chiar::engine
