#pragma once
// The routed layer's own CUDA kernels, behind a plain C++ interface (raw
// device pointers, a stream): nvcc compiles them without libtorch's headers,
// and core/cuda_routing.cpp wraps them for tensors. Each has a host kernel
// with the same contract, which the [cuda] tests compare against.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "real_type.h"

namespace chiar::cuda {

// Whether the current device can run these kernels: cudaSuccess where the
// build holds code or PTX for its architecture (CHIAR_CUDA_ARCHITECTURES).
cudaError_t kernels_loadable();

// Normalised spectral entropy of each row, the value
// spectral_entropy_from_coeffs defines (core/entropy_rows.h): one warp per
// row, sums in fp32 whatever the storage type, H written in fp32. A row
// holding a NaN or an infinity gives NaN, as on the host.
//   c (rows, d) row-major on the device, d >= 2; h (rows) fp32
cudaError_t spectral_entropy_rows(const void* c, Real type, int64_t rows, int64_t d, float* h, cudaStream_t stream);

// Stream compaction of routing choices: the rows each of k operators takes
// (1 <= k <= 4096), concatenated by operator, ascending within each; choices
// outside 0..k-1 land in no list. Arguments out of range return
// cudaErrorInvalidValue before anything is launched.
//   choice (n,) int64; rows_out (n,) int64: operator 0's rows first, then 1's, ...;
//   counts (k,) int64: how many rows each operator takes.
// workspace: rows_by_choice_workspace(n, k) bytes of device memory (0 for
// sizes rows_by_choice refuses).
size_t rows_by_choice_workspace(int64_t n, int k);
cudaError_t rows_by_choice(const int64_t* choice, int64_t n, int k, void* workspace, int64_t* rows_out, int64_t* counts,
                           cudaStream_t stream);

}  // namespace chiar::cuda
