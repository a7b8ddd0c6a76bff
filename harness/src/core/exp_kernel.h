#pragma once
// exp for the core's vectorised loops (softmax rows, GELU): inline, no libm
// call, so that `omp simd` loops around it vectorise.
#include <cstdint>
#include <cstring>

namespace chiar {

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

}  // namespace chiar
