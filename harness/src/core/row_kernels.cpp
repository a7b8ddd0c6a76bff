#include "chiar/row_kernels.h"

#include <cstring>
#include <limits>

namespace chiar {

namespace {

// exp(x) for x <= 0 as 2^n p(r): n = round(x / ln 2), r = x - n ln 2 in
// [-ln2/2, ln2/2] (ln 2 split in two so n ln 2 is exact), p the degree-7
// Taylor polynomial of exp (remainder r^8/8! < 6e-9, under fp32's rounding).
// x below -87.3 gives 0 (2^-127 has no normal exponent: its bits are zero),
// as the masked scores, the lowest float, must.
inline float exp_nonpositive(float x) {
  x = x < -88.f ? -88.f : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no floor call,
  // which would stop the loop from vectorising).
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

}  // namespace

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

}  // namespace chiar
