#include "entropy_rows.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "chiar/row_kernels.h"  // CHIAR_ROW_KERNEL

namespace chiar {
namespace {

// log(x) for a positive normal x: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s) = 2 (s + s^3/3 + ... + s^9/9), s = (m - 1)/(m + 1),
// |s| <= 0.172 (next term < 1e-9); e ln 2 with ln 2 split in two parts.
inline float log_positive(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  int32_t e = (bits >> 23) - 127;
  const int32_t mantissa_bits = (bits & 0x007fffff) | 0x3f800000;
  float m;
  std::memcpy(&m, &mantissa_bits, sizeof m);
  const bool high = m > 1.41421356f;
  m = high ? m * 0.5f : m;
  e = high ? e + 1 : e;
  const float s = (m - 1.f) / (m + 1.f), s2 = s * s;
  const float series = s * (2.f + s2 * (2.f / 3.f + s2 * (2.f / 5.f + s2 * (2.f / 7.f + s2 * (2.f / 9.f)))));
  const auto ef = static_cast<float>(e);
  return ef * 0.693145751953125f + (ef * 1.428606765330187e-06f + series);
}

CHIAR_ROW_KERNEL float row_entropy(const float* c, int64_t d, float inv_log_d) {
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < d; ++j) total += c[j] * c[j];
  const float inv = 1.f / (total > 0.f ? total : 1.f);
  constexpr float tiny = std::numeric_limits<float>::min();
  float plogp = 0.f;
#pragma omp simd reduction(+ : plogp)
  for (int64_t j = 0; j < d; ++j) {
    const float p = c[j] * c[j] * inv;
    plogp += p * log_positive(p > tiny ? p : tiny);
  }
  const float h = -plogp * inv_log_d;
  return h < 0.f ? 0.f : h > 1.f ? 1.f : h;
}

}  // namespace

void spectral_entropy_rows(const float* c, int64_t rows, int64_t d, float* h) {
  const float inv_log_d = static_cast<float>(1.0 / std::log(static_cast<double>(d)));
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) h[r] = row_entropy(c + r * d, d, inv_log_d);
  });
}

}  // namespace chiar
