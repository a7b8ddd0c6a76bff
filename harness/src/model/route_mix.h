#pragma once
// How a routed layer executing densely combines its operators' outputs: the
// soft blend y = sum_k w_k out_k, or the chosen output y = out_choice, whose
// gradient reaches the weights as the soft blend's would (straight-through)
// when they require it. On the CPU in fp32 and float64 each is one pass over
// the rows each way; stacking the K outputs and gathering from the stack
// wrote and read K more copies of them in both directions, most of the mix's
// time (chiar bench-train --variants baseline,chiar_hard,chiar_soft;
// docs/performance.md, 'Reading it'). Elsewhere the same values come from
// tensor ops.
#include <ATen/core/Tensor.h>

#include <vector>

namespace chiar::model {

//   outputs  K x (B, T, d), one dtype and device
//   weights  (B, T, K) in the outputs' dtype
// Returns (B, T, d). Differentiable in every output and the weights.
at::Tensor blend_outputs(const std::vector<at::Tensor>& outputs, const at::Tensor& weights);

//   choice   (B, T) int64 in 0 .. K-1
//   weights  (B, T, K), or undefined: the gradient a weight gets is the
//            soft blend's, <dL/dy, out_k> per token; the value is exactly
//            the chosen output's, bit for bit
// Returns (B, T, d). Each output's gradient is dL/dy on its chosen tokens,
// zero elsewhere.
at::Tensor choose_outputs(const std::vector<at::Tensor>& outputs, const at::Tensor& choice, const at::Tensor& weights);

}  // namespace chiar::model
