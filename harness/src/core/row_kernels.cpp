#include "chiar/row_kernels.h"

#include <cstring>
#include <limits>

#include "bf16_bits.h"
#include "exp_kernel.h"

namespace chiar {

CHIAR_ROW_KERNEL float row_max(const float* s, int64_t n, bool* finite) {
  float m = std::numeric_limits<float>::lowest();
  float nonfinite = 0.f;  // stays 0 unless some s[j] is infinite or NaN
#pragma omp simd reduction(max : m) reduction(+ : nonfinite)
  for (int64_t j = 0; j < n; ++j) {
    m = s[j] > m ? s[j] : m;
    nonfinite += s[j] * 0.f;
  }
  *finite = nonfinite == 0.f;
  return m;
}

CHIAR_ROW_KERNEL float exp_shifted(float* s, int64_t n, float shift, float offset) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float y = exp_nonpositive((s[j] - shift) - offset);
    s[j] = y;
    sum += y;
  }
  return sum;
}

CHIAR_ROW_KERNEL void scale_row(float* s, int64_t n, float factor) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] *= factor;
}

CHIAR_ROW_KERNEL void softmax_backward_row(const float* p, float* ds, int64_t n, float delta) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - delta);
}

CHIAR_ROW_KERNEL float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

CHIAR_ROW_KERNEL void round_to_bf16(const float* __restrict in, uint16_t* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_bits(in[j]);
}

CHIAR_ROW_KERNEL void scale_to_bf16(const float* __restrict in, float factor, uint16_t* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_bits(in[j] * factor);
}

CHIAR_ROW_KERNEL void round_to_bf16_adding(const float* __restrict in, uint16_t* __restrict out, float* __restrict sums,
                                           int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    out[j] = bf16_bits(in[j]);
    sums[j] += in[j];
  }
}

CHIAR_ROW_KERNEL void widen_bf16(const uint16_t* __restrict in, float* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_value(in[j]);
}

}  // namespace chiar
