#include "routing_kernels.h"

#include <cfloat>
#include <cstdint>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "real_access.cuh"

namespace chiar::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kTile = 256;        // choices per block in the compaction
constexpr int kMaxOperators = 4096;

__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// H = clamp(-sum_j p_j log max(p_j, FLT_MIN) / log d, 0, 1), p_j = c_j^2 / sum c^2
// (the sum taken as 1 when it is 0): two strided passes over the row, the
// second from cache. H is fp32 whatever the storage type, as the
// composition's is under autocast (spectral.cpp).
template <typename T>
__global__ void spectral_entropy_kernel(const T* __restrict__ c, int64_t rows, int64_t d, float inv_log_d,
                                        float* __restrict__ h) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together, so the shuffles stay full
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const T* x = c + row * d;  // (d,)
  float total = 0.f;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float v = load(x + j);
    total += v * v;
  }
  total = warp_sum(total);
  const float inv = 1.f / (total > 0.f ? total : 1.f);
  float plogp = 0.f;
  for (int64_t j = lane; j < d; j += kWarp) {
    const float v = load(x + j);
    const float p = v * v * inv;
    plogp += p * logf(fmaxf(p, FLT_MIN));
  }
  plogp = warp_sum(plogp);
  // Comparisons, not fminf/fmaxf, which would turn the NaN of a row with a
  // NaN or an infinity into 0: the host kernel and at::clamp keep it.
  const float entropy = -plogp * inv_log_d;
  if (lane == 0) h[row] = entropy < 0.f ? 0.f : entropy > 1.f ? 1.f : entropy;
}

template <typename T>
cudaError_t launch_entropy(const void* c, int64_t rows, int64_t d, float* h, cudaStream_t stream) {
  const float inv_log_d = static_cast<float>(1.0 / log(static_cast<double>(d)));
  const auto blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  spectral_entropy_kernel<T>
      <<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(static_cast<const T*>(c), rows, d, inv_log_d, h);
  return cudaGetLastError();
}

// Pass 1: how many choices of each operator every tile holds.
//   tile_counts (k, tiles) int64
__global__ void count_choices_kernel(const int64_t* __restrict__ choice, int64_t n, int k,
                                     int64_t* __restrict__ tile_counts) {
  extern __shared__ int counts[];  // (k,)
  for (int j = threadIdx.x; j < k; j += blockDim.x) counts[j] = 0;
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  if (i < n) {
    const int64_t c = choice[i];
    if (c >= 0 && c < k) atomicAdd(&counts[c], 1);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += blockDim.x)
    tile_counts[static_cast<int64_t>(j) * gridDim.x + blockIdx.x] = counts[j];
}

// Pass 2, after an exclusive scan of tile_counts in (operator, tile) order:
// offsets[j][t] is where tile t's rows of operator j start in rows_out, and
// a block scan of the tile's flags orders them inside it.
//   offsets, tile_counts (k, tiles) int64; rows_out (n,) int64; counts (k,) int64
__global__ void place_rows_kernel(const int64_t* __restrict__ choice, int64_t n, int k,
                                  const int64_t* __restrict__ offsets, const int64_t* __restrict__ tile_counts,
                                  int64_t* __restrict__ rows_out, int64_t* __restrict__ counts) {
  using Scan = cub::BlockScan<int, kTile>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t tiles = gridDim.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  const int64_t c = i < n ? choice[i] : -1;
  for (int j = 0; j < k; ++j) {
    // The same for the whole block, so the scan and its barrier are skipped together.
    if (tile_counts[j * tiles + blockIdx.x] == 0) continue;
    const int flag = c == j ? 1 : 0;
    int before = 0;
    Scan(scan_storage).ExclusiveSum(flag, before);
    if (flag) rows_out[offsets[j * tiles + blockIdx.x] + before] = i;
    __syncthreads();  // scan_storage is reused by the next operator
  }
  if (blockIdx.x == 0) {
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
      const int64_t last = j * tiles + tiles - 1;
      counts[j] = offsets[last] + tile_counts[last] - offsets[j * tiles];
    }
  }
}

constexpr size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t scan_bytes(int items) {
  size_t bytes = 0;
  cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
                                items);
  return bytes;
}

}  // namespace

cudaError_t kernels_loadable() {
  // Fails with cudaErrorInvalidDeviceFunction (or NoKernelImageForDevice)
  // where the image holds neither code nor PTX the current device can run.
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, count_choices_kernel);
}

cudaError_t spectral_entropy_rows(const void* c, Real type, int64_t rows, int64_t d, float* h, cudaStream_t stream) {
  if (rows < 0 || d < 2) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if ((rows + kRowsPerBlock - 1) / kRowsPerBlock > INT32_MAX) return cudaErrorInvalidValue;  // the grid's x limit
  switch (type) {
    case Real::F32: return launch_entropy<float>(c, rows, d, h, stream);
    case Real::BF16: return launch_entropy<__nv_bfloat16>(c, rows, d, h, stream);
    case Real::F16: return launch_entropy<__half>(c, rows, d, h, stream);
  }
  return cudaErrorInvalidValue;
}

size_t rows_by_choice_workspace(int64_t n, int k) {
  const int64_t tiles = (n + kTile - 1) / kTile;
  // rows_by_choice refuses these sizes (its scan counts in int).
  if (n < 0 || k < 1 || static_cast<int64_t>(k) * tiles > INT32_MAX) return 0;
  const size_t table = align_up(static_cast<size_t>(k * tiles) * sizeof(int64_t));
  return 2 * table + align_up(scan_bytes(static_cast<int>(k * tiles)));
}

cudaError_t rows_by_choice(const int64_t* choice, int64_t n, int k, void* workspace, int64_t* rows_out, int64_t* counts,
                           cudaStream_t stream) {
  // k counters in the count kernel's shared memory, within its 48 KiB.
  if (n < 0 || k < 1 || k > kMaxOperators) return cudaErrorInvalidValue;
  if (n == 0) return cudaMemsetAsync(counts, 0, static_cast<size_t>(k) * sizeof(int64_t), stream);
  const int64_t tiles = (n + kTile - 1) / kTile;
  // The scan counts its items in int; so does the grid.
  if (static_cast<int64_t>(k) * tiles > INT32_MAX) return cudaErrorInvalidValue;
  const size_t table = align_up(static_cast<size_t>(k * tiles) * sizeof(int64_t));
  auto* base = static_cast<char*>(workspace);
  auto* tile_counts = reinterpret_cast<int64_t*>(base);
  auto* offsets = reinterpret_cast<int64_t*>(base + table);
  void* scan_temp = base + 2 * table;
  size_t scan_temp_bytes = scan_bytes(static_cast<int>(k * tiles));

  const auto grid = static_cast<unsigned>(tiles);
  count_choices_kernel<<<grid, kTile, static_cast<size_t>(k) * sizeof(int), stream>>>(choice, n, k, tile_counts);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = cub::DeviceScan::ExclusiveSum(scan_temp, scan_temp_bytes, tile_counts, offsets, static_cast<int>(k * tiles),
                                      stream);
  if (err != cudaSuccess) return err;
  place_rows_kernel<<<grid, kTile, 0, stream>>>(choice, n, k, offsets, tile_counts, rows_out, counts);
  return cudaGetLastError();
}

}  // namespace chiar::cuda
