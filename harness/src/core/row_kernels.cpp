#include "chiar/row_kernels.h"

#include <atomic>
#include <cstring>
#include <limits>

// AVX512-BF16's conversion (GCC and Clang on x86-64 build it whatever the
// baseline ISA; the CPU is asked at load time).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CHIAR_BF16_INSTRUCTIONS 1
#include <immintrin.h>
#else
#define CHIAR_BF16_INSTRUCTIONS 0
#endif

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

namespace {

// The integer rounding (bf16_bits) in vector lanes, on any CPU.
CHIAR_ROW_KERNEL void round_to_bf16_integer(const float* __restrict in, uint16_t* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_bits(in[j]);
}

CHIAR_ROW_KERNEL void scale_to_bf16_integer(const float* __restrict in, float factor, uint16_t* __restrict out,
                                            int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_bits(in[j] * factor);
}

CHIAR_ROW_KERNEL void round_to_bf16_adding_integer(const float* __restrict in, uint16_t* __restrict out,
                                                   float* __restrict sums, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    out[j] = bf16_bits(in[j]);
    sums[j] += in[j];
  }
}

#if CHIAR_BF16_INSTRUCTIONS
#define CHIAR_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// The lanes `special` of r (NaN, or subnormal: what vcvtneps2bf16 rounds
// otherwise than c10) set as bf16_bits sets them: a NaN to 0x7fc0 (the
// instruction keeps its sign and payload), a subnormal, which it flushes to
// zero, rounded as an integer. maskz forms throughout: GCC 12 warns of the
// plain ones' undefined lanes.
CHIAR_BF16_TARGET __attribute__((noinline)) __m256i fix_special(__m512 x, __m256i r, __mmask16 special) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_maskz_srli_epi32(special, bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  r = _mm256_mask_mov_epi16(r, special, _mm512_maskz_cvtepi32_epi16(special, _mm512_maskz_srli_epi32(special, up, 16)));
  return _mm256_mask_mov_epi16(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm256_set1_epi16(0x7fc0));
}

// 16 lanes rounded by vcvtneps2bf16 (to nearest, ties to even, as c10).
// The lanes it rounds otherwise, NaN and nonzero |x| below the smallest
// normal, are found by one compare (zeros excluded: attention's masked
// weights are exactly 0) and fixed off the hot path.
CHIAR_BF16_TARGET inline __m256i round16(__m512 x) {
  const __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  const __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nonzero = _mm512_test_epi32_mask(magnitude, magnitude);
  const __mmask16 special =
      _mm512_mask_cmp_ps_mask(nonzero, _mm512_castsi512_ps(magnitude), _mm512_set1_ps(0x1p-126f), _CMP_NGE_UQ);
  return __builtin_expect(special != 0, 0) ? fix_special(x, r, special) : r;
}

// The lanes [0, left) of a vector, left < 16: a row's last, partial one.
CHIAR_BF16_TARGET inline __mmask16 first_lanes(int64_t left) { return static_cast<__mmask16>((1u << left) - 1u); }

// Whole vectors with plain loads and stores (masked stores are slow on some
// CPUs that have the instruction), the row's end masked.
CHIAR_BF16_TARGET void round_to_bf16_native(const float* in, uint16_t* out, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), round16(_mm512_loadu_ps(in + j)));
  if (j == n) return;
  const __mmask16 lanes = first_lanes(n - j);
  _mm256_mask_storeu_epi16(out + j, lanes, round16(_mm512_maskz_loadu_ps(lanes, in + j)));
}

CHIAR_BF16_TARGET void scale_to_bf16_native(const float* in, float factor, uint16_t* out, int64_t n) {
  const __m512 f = _mm512_set1_ps(factor);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), round16(_mm512_mul_ps(_mm512_loadu_ps(in + j), f)));
  if (j == n) return;
  const __mmask16 lanes = first_lanes(n - j);
  _mm256_mask_storeu_epi16(out + j, lanes, round16(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, in + j), f)));
}

CHIAR_BF16_TARGET void round_to_bf16_adding_native(const float* in, uint16_t* out, float* sums, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 x = _mm512_loadu_ps(in + j);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), round16(x));
    _mm512_storeu_ps(sums + j, _mm512_add_ps(_mm512_loadu_ps(sums + j), x));
  }
  if (j == n) return;
  const __mmask16 lanes = first_lanes(n - j);
  const __m512 x = _mm512_maskz_loadu_ps(lanes, in + j);
  _mm256_mask_storeu_epi16(out + j, lanes, round16(x));
  _mm512_mask_storeu_ps(sums + j, lanes, _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, sums + j), x));
}

bool cpu_converts_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
#else
bool cpu_converts_bf16() { return false; }
#endif

const bool kCpuConvertsBf16 = cpu_converts_bf16();
std::atomic<bool> emulated{false};

bool native() { return kCpuConvertsBf16 && !emulated.load(std::memory_order_relaxed); }

}  // namespace

bool bf16_rounding_native() { return native(); }
void emulate_bf16_rounding(bool emulate) { emulated.store(emulate); }

void round_to_bf16(const float* in, uint16_t* out, int64_t n) {
#if CHIAR_BF16_INSTRUCTIONS
  if (native()) return round_to_bf16_native(in, out, n);
#endif
  round_to_bf16_integer(in, out, n);
}

void scale_to_bf16(const float* in, float factor, uint16_t* out, int64_t n) {
#if CHIAR_BF16_INSTRUCTIONS
  if (native()) return scale_to_bf16_native(in, factor, out, n);
#endif
  scale_to_bf16_integer(in, factor, out, n);
}

void round_to_bf16_adding(const float* in, uint16_t* out, float* sums, int64_t n) {
#if CHIAR_BF16_INSTRUCTIONS
  if (native()) return round_to_bf16_adding_native(in, out, sums, n);
#endif
  round_to_bf16_adding_integer(in, out, sums, n);
}

CHIAR_ROW_KERNEL void widen_bf16(const uint16_t* __restrict in, float* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = bf16_value(in[j]);
}

CHIAR_ROW_KERNEL void add_widened_bf16(const uint16_t* __restrict in, float* __restrict sums, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) sums[j] += bf16_value(in[j]);
}

}  // namespace chiar
