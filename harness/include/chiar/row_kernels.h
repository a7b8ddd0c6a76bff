#pragma once
// Softmax row kernels on raw fp32 memory, vectorised for the widest ISA the
// CPU has (one clone per ISA, picked at load time). Attention's fused core
// runs them over cache-sized score tiles and the fused cross-entropy over
// logit rows: passes that must not cost more than the products that fill
// them. Plain loops, no libtorch: a call per row is too short for a tensor
// op's set-up. Exported for plugins.
#include <cstdint>

#include "chiar/export.h"

// Put before a row loop's definition: GCC and Clang on x86-64 then build an
// AVX-512, an AVX2 and a baseline copy of it and bind the best one when the
// library loads (elsewhere: the compiler's default ISA). Compile such files
// with -fopenmp-simd (`omp simd` reductions in vector lanes, no OpenMP
// runtime) and -fno-trapping-math (clamps as selects in the AVX2 copy).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CHIAR_ROW_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CHIAR_ROW_KERNEL
#endif

namespace chiar {

// The most fp32 lanes the kernels below run at once (the AVX-512 clone). A
// row whose length is not a multiple of it ends in lanes computed one at a
// time, so a caller free to lengthen a row with masked entries (attention's
// causal rows) rounds it up to a multiple.
constexpr int64_t kRowLanes = 16;

// The largest of s[0, n), or the lowest float when n is 0; *finite says
// whether every s[j] was finite (the other kernels assume they are, so a
// row that is not is set to NaN by the caller, as libtorch's softmax would).
CHIAR_API float row_max(const float* s, int64_t n, bool* finite);

// s[j] = exp((s[j] - shift) - offset) in place, returning the sum of the
// results. Two shifts, not their sum: a row whose every key is masked holds
// the lowest float, its maximum too, and (lowest - lowest) - log n keeps the
// uniform weights that lowest - (lowest + log n) would round away.
CHIAR_API float exp_shifted(float* s, int64_t n, float shift, float offset);

CHIAR_API void scale_row(float* s, int64_t n, float factor);

// ds[j] = p[j] * (ds[j] - delta): softmax's backward for one row, where
// delta = sum_j p[j] dp[j] (= dout . out).
CHIAR_API void softmax_backward_row(const float* p, float* ds, int64_t n, float delta);

// sum_j a[j] b[j]
CHIAR_API float dot(const float* a, const float* b, int64_t n);

// out[j] = the bf16 nearest in[j] (ties to even; NaN stays NaN), as bits:
// c10::BFloat16's rounding, bit for bit, in vector lanes. A tile's fp32
// weights or gradient become the next bf16 product's operand. On a CPU with
// AVX512-BF16 this and the two below round with its conversion instruction
// (three times the lanes per cycle of the integer rounding), whose NaN and
// subnormal lanes are then set as c10 sets them (see bf16_rounding_native).
CHIAR_API void round_to_bf16(const float* in, uint16_t* out, int64_t n);

// out[j] = the bf16 nearest in[j] * factor, rounded as round_to_bf16: a
// softmax row's normalisation and its rounding for the next product in one
// pass (the LM head's logits' gradient).
CHIAR_API void scale_to_bf16(const float* in, float factor, uint16_t* out, int64_t n);

// out[j] = the bf16 nearest in[j], and sums[j] += in[j]: a gradient rounded
// for the products while its column sums (a bias's gradient) are taken from
// the same read.
CHIAR_API void round_to_bf16_adding(const float* in, uint16_t* out, float* sums, int64_t n);

// out[j] = the fp32 value of the bf16 bits in[j], exactly: a bf16 row
// widened for the fp32 kernels (a chunk at a time, kept in L1).
CHIAR_API void widen_bf16(const uint16_t* in, float* out, int64_t n);

// sums[j] += the fp32 value of the bf16 bits in[j]: column sums of a bf16
// gradient (a bias's gradient) in fp32.
CHIAR_API void add_widened_bf16(const uint16_t* in, float* sums, int64_t n);

// Whether the three rounding kernels above take the CPU's bf16 conversion
// instruction (decided once from the CPU) rather than integer rounding. The
// results are the same bits either way; emulate_bf16_rounding(true) forces
// the integer path, so that tests can compare both on one machine.
CHIAR_API bool bf16_rounding_native();
CHIAR_API void emulate_bf16_rounding(bool emulate);

}  // namespace chiar
