#pragma once
// Gradient clipping by the joint 2-norm, the trainer's `clip` option, with
// the arithmetic of torch::nn::utils::clip_grad_norm_ and none of its reads
// back to the host:
//   norm = || (||g_1||, ..., ||g_n||) ||_2       in the gradients' dtype
//   g_i *= min(max_norm / (norm + 1e-6), 1)     a 0-dim tensor, NaN kept
// libtorch's function takes one norm per parameter and returns the norm as a
// double, which stalls a GPU step until the backward pass has finished; here
// the norms are one multi-tensor call, the product another, and the norm is
// returned as a tensor. Same bits as libtorch's on the CPU; on a GPU the
// multi-tensor norm sums in another order (tests/test_gradient_clipping.cpp).
#include <ATen/core/Tensor.h>

#include <vector>

namespace chiar::engine {

// Scales the defined gradients of `params` (one device) as above; returns
// the norm, a 0-dim tensor on their device (0 on the CPU when none has one).
at::Tensor clip_gradient_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace chiar::engine
