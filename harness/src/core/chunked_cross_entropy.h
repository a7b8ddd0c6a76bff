#pragma once
// What chunked_linear_cross_entropy (chiar/cross_entropy.h) shares with
// linear_cross_entropy, and its block step: between a block's forward
// product and its two gradient products, the loss of each row and, in place
// of the logits, their gradient.
#include <ATen/core/Tensor.h>

#include <torch/autograd.h>

#include <string>

namespace chiar {

// backward of a head whose forward saved the gradients of hidden and weight
// (undefined for one not wanted): both times the incoming gradient, none
// for the function's other `inputs - 2` inputs.
torch::autograd::variable_list scale_saved_gradients(torch::autograd::AutogradContext* ctx,
                                                     const torch::autograd::variable_list& grads, size_t inputs);

// The shapes and types both heads take: hidden (N, d), weight (V, d),
// targets (N,) int64, token_weights (N,) or undefined. Throws UserError
// prefixed "<function>: ".
void check_head_inputs(const std::string& function, const at::Tensor& hidden, const at::Tensor& weight,
                       const at::Tensor& targets, const at::Tensor& token_weights);

// One block's loss: for logits (n, V) (rows may be strided), returns the
// rows' nll (n,) in fp32 (fp64 for fp64 logits), and when write_grads
// overwrites the logits with w_r (softmax - onehot(t_r)). A row with a
// non-finite logit or a target outside [0, V) gets NaN throughout.
//   targets (n,) int64, weights (n,) on the logits' device
// The CUDA kernel where the build has it and the logits are on a GPU, else
// the composition, which the tests compare it against.
at::Tensor softmax_cross_entropy_block(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& weights,
                                       bool write_grads);
at::Tensor softmax_cross_entropy_composed(const at::Tensor& logits, const at::Tensor& targets,
                                          const at::Tensor& weights, bool write_grads);

}  // namespace chiar
