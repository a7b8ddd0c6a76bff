#pragma once
// Rotary position embedding (RoPE, half-split pairs: feature i turns with
// feature i + dh/2) in one pass from the projection's layout to the layout the
// fused core reads: no cos/sin broadcasts, no concatenation, no transposing
// copy of the keys. On the CPU (the operator's fused path), fp32 or bf16:
// bf16 rows are widened, turned in fp32 and rounded once (bf16 products'
// queries and keys), and backward takes and gives bf16 the same way.
#include <ATen/core/Tensor.h>

namespace chiar_attention {

// Differentiable in x.
//   x      (G, L, h, dh) fp32 or bf16, unit last stride, other strides free (a view of a projection)
//   cos, sin (P, dh/2) fp32 contiguous, P above every position
//   pos    (L) or (G, L) int64 positions, or undefined for 0 .. L-1
//   scale  multiplies the result (queries take 1/sqrt(dh) here)
// Returns (G, h, L, dh) contiguous, or with keys_transposed (G, h, dh, L)
// contiguous: the keys as q k^T reads them; in x's type.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& pos,
                  double scale, bool keys_transposed);

}  // namespace chiar_attention
