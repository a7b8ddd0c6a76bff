#pragma once
// Float64 references written from the definitions with explicit loops, not
// through the code paths under test.
#include <ATen/ATen.h>

#include <vector>

namespace chiar::test::ref {

// Orthonormal DCT-II matrix (d, d) from the definition.
at::Tensor dct_matrix(int64_t d);
// DCT-II of each row of x (N, d), summing the definition directly.
at::Tensor dct(const at::Tensor& x);
// Spectral entropy of each row of x (N, d).
at::Tensor entropy(const at::Tensor& x);
// The same from DCT coefficients c (N, d).
at::Tensor entropy_from_coeffs(const at::Tensor& c);

// LayerNorm of (N, d) rows with weight and bias (d,), eps 1e-5.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

struct Linear {
  at::Tensor weight;  // (out, in)
  at::Tensor bias;    // (out,)
};

struct AttentionWeights {
  Linear q, kv, out;
  at::Tensor norm_weight, norm_bias;
  int64_t heads = 1;
  bool rope = true;
  double rope_base = 10000.0;
};

// Multi-head attention + residual + LN for x (B, T, d); valid (B, T) or undefined.
at::Tensor attention(const at::Tensor& x, const AttentionWeights& w, bool causal, const at::Tensor& valid);

struct RbfWeights {
  Linear q, kv, out;
  at::Tensor norm_weight, norm_bias;
  at::Tensor omega;  // (d, R)
  double eps = 1e-3;
};

// The explicit quadratic form of the same random-feature kernel: every a_ts
// formed, summed over the allowed keys, + residual + LN.
at::Tensor rbf_quadratic(const at::Tensor& x, const RbfWeights& w, bool causal, const at::Tensor& valid);

}  // namespace chiar::test::ref
