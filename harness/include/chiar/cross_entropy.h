#pragma once
// A language model's training loss straight from its final hidden states.
// The plain way writes the (N, V) logits, reads them for the log-softmax,
// writes their gradient and reads it twice more for the head's two backward
// products: at the anchor shapes (2048 tokens, V 8192) that is 64 MiB per
// pass, and at V 50,257 each pass is 400 MiB that the two cores wait on. Here
// the logits of a block of rows are computed into one buffer, turned into
// their own gradient in place, and multiplied into the gradients of the
// hidden states and of the head's weight at once, in forward; backward only
// scales them. No (N, V) tensor outlives the call.
#include <ATen/core/Tensor.h>

#include "chiar/export.h"

namespace chiar {

// sum_i w_i (logsumexp(h_i W^T) - (h_i W^T)[t_i]): the token cross-entropy
// of the logits h W^T, weighted per token. Differentiable in hidden and
// weight; targets and token weights are data.
//   hidden        (N, d)
//   weight        (V, d) the head's weight (tied: the embedding table)
//   targets       (N,) int64 in [0, V); one outside throws UserError
//   token_weights (N,) of hidden's dtype, e.g. valid / valid.sum(); undefined
//                 for 1/N each (the mean)
//   rows_per_pass how many rows' logits share the buffer; 0 picks as many as
//                 fit 256 MiB (the whole batch at V 8192, 2048 tokens)
// Returns () in hidden's dtype. A row whose logits are not all finite gives
// NaN, as libtorch's cross-entropy does. fp32 on the CPU outside autocast
// runs fused on the process's GEMM library (chiar/linear.h); everything else
// (fp64, bf16 autocast, other devices) computes the logits with linear() and
// takes at::cross_entropy_loss, with the same value and gradients.
CHIAR_API at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                          const at::Tensor& targets, const at::Tensor& token_weights = {},
                                          int64_t rows_per_pass = 0);

}  // namespace chiar
