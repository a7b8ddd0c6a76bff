#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "chiar/export.h"

namespace chiar {

// How the orthonormal DCT is computed. Gemm multiplies by a cached d×d basis;
// Fft uses Makhoul's reordering and one complex FFT of length d.
enum class DctImpl { Auto, Gemm, Fft };

CHIAR_API const char* to_string(DctImpl impl);
CHIAR_API DctImpl dct_impl_from_string(const std::string& name);  // "auto" | "gemm" | "fft"
// The implementation Auto resolves to for feature size d.
CHIAR_API DctImpl resolve_dct_impl(DctImpl impl, int64_t d);

// Orthonormal DCT-II basis B (d, d): B[k][n] = s_k cos(pi (2n+1) k / (2d)),
// s_0 = sqrt(1/d), s_k = sqrt(2/d). Cached per (d, dtype, device); built in float64.
CHIAR_API at::Tensor dct_basis(int64_t d, at::ScalarType dtype, at::Device device);
// B^T (d, d), contiguous and cached likewise: the inverse's basis, idct2(c) =
// c B. A weight of its own, not a view of B, so that products keeping copies
// per weight (bf16 copies, packed layouts) make them once, not per call.
CHIAR_API at::Tensor idct_basis(int64_t d, at::ScalarType dtype, at::Device device);

// Orthonormal DCT-II along the last axis: (..., d) -> (..., d). Differentiable.
CHIAR_API at::Tensor dct2(const at::Tensor& x, DctImpl impl = DctImpl::Auto);
// Its inverse (orthonormal DCT-III): idct2(dct2(x)) == x.
CHIAR_API at::Tensor idct2(const at::Tensor& c, DctImpl impl = DctImpl::Auto);
// dct2 in fp32 at least, under autocast too: bf16 and fp16 x are widened
// first, float64 stays float64, and autocast is switched off for the
// product. These are the coefficients the spectral entropy reads, so that
// a bf16 run's entropy is its fp32 entropy to the last bit. Differentiable.
CHIAR_API at::Tensor dct2_exact(const at::Tensor& x, DctImpl impl = DctImpl::Auto);

// Normalised spectral entropy of each vector along the last axis:
//   c = dct2_exact(x), p_k = c_k^2 / sum_j c_j^2, H = -sum_k p_k log p_k / log d.
// (..., d) -> (...), in [0, 1]; H(0) = 0 and H = 0 when d == 1; NaN for a
// vector holding a NaN or an infinity. H is float64 for float64 input and
// fp32 otherwise (bf16 and fp16 are widened first), whatever the autocast.
// Differentiable.
CHIAR_API at::Tensor spectral_entropy(const at::Tensor& x, DctImpl impl = DctImpl::Auto);
// The same from DCT coefficients already computed (lets a caller reuse them;
// bf16 or fp16 coefficients are widened, so only dct2_exact's keep H exact).
CHIAR_API at::Tensor spectral_entropy_from_coeffs(const at::Tensor& c);

// Thresholds that split the values of h (any shape) into shares.size() groups
// with the given shares (summing to 1), lowest values first: returns
// shares.size() - 1 increasing quantiles. E.g. {0.5, 0.5} -> the median.
CHIAR_API std::vector<double> calibrate_thresholds(const at::Tensor& h, const std::vector<double>& shares);

}  // namespace chiar
