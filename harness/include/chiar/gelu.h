#pragma once
// The FFN's activation with the up projection's bias folded in:
//   bias_gelu(u, b) = gelu(u + b) = z Phi(z), z = u + b,
// Phi the standard normal CDF (the exact GELU, not the tanh form). On fp32
// CPU tensors the bias add, the GELU and, in backward, the bias gradient's
// column sums are one pass each over (rows, n), so the up projection runs
// without a bias (no pre-filled output for its product to accumulate onto)
// and backward needs no separate sum. bf16 u on the CPU (the FFN under bf16
// autocast) takes the same passes on rows widened to fp32 (z = u + b and the
// GELU in fp32, the output and the input gradient rounded to bf16 once, the
// bias gradient summed in fp32); the bias stays fp32. Other dtypes and
// devices take libtorch's gelu(u + b).
#include <ATen/ATen.h>

#include "chiar/export.h"

namespace chiar {

// u (..., n), bias (n) -> (..., n); differentiable in both.
CHIAR_API at::Tensor bias_gelu(const at::Tensor& u, const at::Tensor& bias);

// The same, written over u, without autograd (inference). Returns u.
CHIAR_API at::Tensor& bias_gelu_(at::Tensor& u, const at::Tensor& bias);

}  // namespace chiar
