#include "head_kernels.h"

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "real_access.cuh"

namespace chiar::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;  // one block per row
constexpr int kWarps = kThreads / kWarp;

// A running softmax denominator: sum exp(x - max) over the values seen.
struct Running {
  float max;
  float sum;
};

__device__ Running merge(Running a, Running b) {
  if (a.sum == 0.f) return b;
  if (b.sum == 0.f) return a;
  const float top = fmaxf(a.max, b.max);
  return {top, a.sum * expf(a.max - top) + b.sum * expf(b.max - top)};
}

// Every thread's (max, sum) and non-finite flag merged over the block; every
// thread gets the result.
__device__ Running block_merge(Running r, bool& bad) {
  __shared__ Running warp_part[kWarps];
  __shared__ int warp_bad[kWarps];
  __shared__ Running whole;
  __shared__ int whole_bad;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const Running other{__shfl_xor_sync(0xffffffffu, r.max, offset), __shfl_xor_sync(0xffffffffu, r.sum, offset)};
    r = merge(r, other);
  }
  const int any_bad = __any_sync(0xffffffffu, bad);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    warp_part[warp] = r;
    warp_bad[warp] = any_bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Running all = warp_part[0];
    int all_bad = warp_bad[0];
    for (int w = 1; w < kWarps; ++w) {
      all = merge(all, warp_part[w]);
      all_bad |= warp_bad[w];
    }
    whole = all;
    whole_bad = all_bad;
  }
  __syncthreads();
  bad = whole_bad != 0;
  return whole;
}

// One block per row: a pass for max and denominator (fp32), then one that
// writes the gradient over the logits it reads.
template <typename T>
__global__ void softmax_cross_entropy_kernel(T* __restrict__ logits, int64_t V, int64_t row_stride,
                                             const int64_t* __restrict__ targets, const float* __restrict__ weights,
                                             bool write_grads, float* __restrict__ nll) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * row_stride;  // (V,)
  const int64_t target = targets[row];
  Running r{-INFINITY, 0.f};
  bool bad = target < 0 || target >= V;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float v = load(x + j);
    if (!isfinite(v)) {
      bad = true;
    } else if (v > r.max) {
      r.sum = r.sum * expf(r.max - v) + 1.f;
      r.max = v;
    } else {
      r.sum += expf(v - r.max);
    }
  }
  r = block_merge(r, bad);
  const float lse = r.max + logf(r.sum);
  // Every thread read the target's logit before any writes over it below.
  const float picked = bad ? NAN : load(x + target);
  __syncthreads();
  if (threadIdx.x == 0) nll[row] = bad ? NAN : lse - picked;
  if (!write_grads) return;
  const float w = weights[row];
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float g = bad ? NAN : w * expf(load(x + j) - lse) - (j == target ? w : 0.f);
    store(x + j, g);
  }
}

template <typename T>
cudaError_t launch(void* logits, int64_t rows, int64_t V, int64_t row_stride, const int64_t* targets,
                   const float* weights, bool write_grads, float* nll, cudaStream_t stream) {
  softmax_cross_entropy_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<T*>(logits), V, row_stride, targets, weights, write_grads, nll);
  return cudaGetLastError();
}

}  // namespace

cudaError_t softmax_cross_entropy_rows(void* logits, Real type, int64_t rows, int64_t V, int64_t row_stride,
                                       const int64_t* targets, const float* weights, bool write_grads, float* nll,
                                       cudaStream_t stream) {
  if (rows < 0 || V < 1 || row_stride < V || (write_grads && weights == nullptr)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // the grid's x limit
  switch (type) {
    case Real::F32: return launch<float>(logits, rows, V, row_stride, targets, weights, write_grads, nll, stream);
    case Real::BF16:
      return launch<__nv_bfloat16>(logits, rows, V, row_stride, targets, weights, write_grads, nll, stream);
    case Real::F16: return launch<__half>(logits, rows, V, row_stride, targets, weights, write_grads, nll, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace chiar::cuda
