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
#include <c10/core/ScalarType.h>

#include "chiar/export.h"

namespace chiar {

// sum_i w_i (logsumexp(h_i W^T) - (h_i W^T)[t_i]): the token cross-entropy
// of the logits h W^T, weighted per token. Differentiable in hidden and
// weight; targets and token weights are data.
//   hidden        (N, d)
//   weight        (V, d) the head's weight (tied: the embedding table)
//   targets       (N,) int64 in [0, V); one outside throws UserError (on a
//                 GPU it gives its row NaN instead, without a host round trip)
//   token_weights (N,) of hidden's dtype, e.g. valid / valid.sum(); undefined
//                 for 1/N each (the mean)
//   rows_per_pass how many rows' logits share the buffer; 0 picks as many as
//                 fit 256 MiB (the whole batch at V 8192, 2048 tokens)
// Returns () in hidden's dtype. A row whose logits are not all finite gives
// NaN, as libtorch's cross-entropy does. fp32 on the CPU outside autocast
// runs fused on the process's GEMM library (chiar/linear.h); under bf16
// autocast on the CPU the same blocks take bf16 products summed in fp32
// (gemm_bf16), with the logits, softmax, loss and gradients in fp32 and the
// logits' gradient rounded to bf16 once for the two backward products; the
// loss is then fp32. On a GPU the same blocks run in libtorch's products, in
// autocast's type where it is on, with the head's CUDA kernel between them
// (chunked_linear_cross_entropy). Everything else (fp64, the "aten" kernel
// policy) computes the logits with linear() and takes at::cross_entropy_loss,
// with the same value and gradients.
CHIAR_API at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                          const at::Tensor& token_weights = {}, int64_t rows_per_pass = 0);

// linear_cross_entropy as a GPU computes it, on any device: the same blocks
// of rows as the host kernel, in libtorch's products. Each block's logits are
// computed in `compute` (fp64, fp32 or bf16: bf16 under autocast; not fp16,
// whose range cannot hold a mean's per-token gradients),
// turned into their own gradient in place, in fp32 (fp64 for fp64), by the
// head's CUDA kernel where the build has it and the policy allows
// (chiar/kernels.h), else by a composition, and multiplied into the
// gradients of the hidden states and of the weight at once, in forward.
// No (N, V) tensor is made. The products see the weight padded with zero
// rows to a multiple of 64: a vocabulary like GPT-2's 50,257 would give the
// logits a row length no tensor-core GEMM aligns to; the padded columns are
// left out of the softmax, and what the zero rows add is 0.
//   arguments as linear_cross_entropy's, all on hidden's device (else
//   UserError, as for their shapes). A row
//   with a non-finite logit, or a target outside [0, V), gives NaN (no
//   UserError: no host round trip). Gradients come back in hidden's and
//   weight's types.
CHIAR_API at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                  const at::Tensor& targets, const at::Tensor& token_weights,
                                                  at::ScalarType compute, int64_t rows_per_pass = 0);

}  // namespace chiar
