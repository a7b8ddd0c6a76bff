#pragma once
// Row kernels of attention's fused core, vectorised for the widest ISA the
// CPU has (one clone per ISA, picked at load time): the core's scores live in
// a cache-sized tile, and these passes over it must not cost more than the
// products that fill it. Plain loops, no libtorch: a call per row of a tile
// is too short for a tensor op's set-up.
#include <cstdint>

namespace chiar_attention {

// The largest of s[0, n), or the lowest float when n is 0; *finite says
// whether every s[j] was finite (the other kernels assume they are, so a
// row that is not is set to NaN by the caller, as libtorch's softmax would).
float row_max(const float* s, int64_t n, bool* finite);

// s[j] = exp((s[j] - shift) - offset) in place, returning the sum of the
// results. Two shifts, not their sum: a row whose every key is masked holds
// the lowest float, its maximum too, and (lowest - lowest) - log n keeps the
// uniform weights that lowest - (lowest + log n) would round away.
float exp_shifted(float* s, int64_t n, float shift, float offset);

void scale_row(float* s, int64_t n, float factor);

// ds[j] = p[j] * (ds[j] - delta): softmax's backward for one row, where
// delta = sum_j p[j] dp[j] (= dout . out).
void softmax_backward_row(const float* p, float* ds, int64_t n, float delta);

// sum_j a[j] b[j]
float dot(const float* a, const float* b, int64_t n);

}  // namespace chiar_attention
