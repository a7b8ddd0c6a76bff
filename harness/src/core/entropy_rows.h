#pragma once
// The router's spectral entropy of fp32 rows in one pass over each row while
// it is in cache: at inference every routed layer computes it for every
// token, and as a chain of libtorch ops (square, sum, divide, clamp, log,
// multiply, sum) it cost a routed layer at d 256 about as much as the DCT
// product feeding it.
#include <cstdint>

namespace chiar {

// h[r] = clamp(-sum_j p_j log max(p_j, tiny) / log d, 0, 1) with
// p_j = c[r, j]^2 / sum_j c[r, j]^2 (the sum taken as 1 when it is 0), tiny the
// smallest normal float: the value spectral_entropy_from_coeffs defines.
//   c (rows, d) row-major, d >= 2; h (rows)
void spectral_entropy_rows(const float* c, int64_t rows, int64_t d, float* h);

}  // namespace chiar
