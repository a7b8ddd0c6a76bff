#pragma once
// Loads and stores of the kernels' floating types (real_type.h) through
// fp32, the type every kernel computes in.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace chiar::cuda {

template <typename T>
__device__ float load(const T* p);
template <>
__device__ inline float load<float>(const float* p) {
  return *p;
}
template <>
__device__ inline float load<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
template <>
__device__ inline float load<__half>(const __half* p) {
  return __half2float(*p);
}

template <typename T>
__device__ void store(T* p, float v);
template <>
__device__ inline void store<float>(float* p, float v) {
  *p = v;
}
template <>
__device__ inline void store<__nv_bfloat16>(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16(v);
}
template <>
__device__ inline void store<__half>(__half* p, float v) {
  *p = __float2half(v);
}

}  // namespace chiar::cuda
