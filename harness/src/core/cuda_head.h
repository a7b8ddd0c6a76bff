#pragma once
// Tensor entry point to the head's CUDA kernel (harness/cuda/head_kernels.h),
// compiled only into a build that has the kernels (CHIAR_CUDA_KERNELS):
// callers check cuda_kernels_enabled() and cuda_kernels_usable()
// (chiar/kernels.h) and the tensors' device first.
#include <ATen/core/Tensor.h>

namespace chiar {

// Whether the kernel takes logits of this type: fp32, bf16 or fp16.
bool cuda_head_takes(const at::Tensor& logits);
// Per row of logits (n, V) (rows may be strided, columns contiguous) on a
// CUDA device: returns nll (n,) fp32, logsumexp(x) - x[t], and when
// write_grads overwrites the logits with w (softmax(x) - onehot(t)).
//   targets (n,) int64 and weights (n,) fp32 on the same device.
at::Tensor softmax_cross_entropy_cuda(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& weights,
                                      bool write_grads);

}  // namespace chiar
