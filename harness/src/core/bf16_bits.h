#pragma once
// bf16 as the bits of its upper half of an fp32, for row kernels that widen
// and round in vector lanes (plain integer ops: `omp simd` vectorises them,
// where c10::BFloat16's conversions stay scalar).
#include <cstdint>
#include <cstring>

namespace chiar {

// The bits of the bf16 nearest x (ties to even; NaN stays NaN): c10::BFloat16's
// rounding.
inline uint16_t bf16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return x != x ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

// The fp32 a bf16 holds, exactly.
inline float bf16_value(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace chiar
