#include "cuda_head.h"

#include <string>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "head_kernels.h"  // harness/cuda

namespace chiar {

bool cuda_head_takes(const at::Tensor& logits) {
  const auto type = logits.scalar_type();
  return type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
}

at::Tensor softmax_cross_entropy_cuda(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& weights,
                                      bool write_grads) {
  if (logits.dim() != 2 || logits.stride(1) != 1 || logits.stride(0) < logits.size(1) || !cuda_head_takes(logits))
    throw UserError(
        "softmax_cross_entropy_cuda: logits must be (n, V) fp32, bf16 or fp16 with contiguous rows, found " +
        c10::str(logits.sizes()) + " " + c10::str(logits.scalar_type()));
  const int64_t n = logits.size(0), V = logits.size(1);
  // Read through device pointers: their device, type and length first.
  for (const at::Tensor* t : {&targets, &weights})
    if (t->defined() && (t->device() != logits.device() || t->numel() != n))
      throw UserError("softmax_cross_entropy_cuda: targets and weights must be (" + std::to_string(n) + ",) on " +
                      logits.device().str());
  if (targets.scalar_type() != at::kLong || (write_grads && weights.scalar_type() != at::kFloat))
    throw UserError("softmax_cross_entropy_cuda: targets must be int64 and weights fp32");
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto t = targets.contiguous();                               // (n,)
  const auto w = write_grads ? weights.contiguous() : at::Tensor();  // (n,)
  auto nll = at::empty({n}, logits.options().dtype(at::kFloat));     // (n,)
  const cuda::Real type = logits.scalar_type() == at::kFloat      ? cuda::Real::F32
                          : logits.scalar_type() == at::kBFloat16 ? cuda::Real::BF16
                                                                  : cuda::Real::F16;
  count_cuda_kernel();
  const cudaError_t err =
      cuda::softmax_cross_entropy_rows(logits.data_ptr(), type, n, V, logits.stride(0), t.data_ptr<int64_t>(),
                                       write_grads ? w.data_ptr<float>() : nullptr, write_grads, nll.data_ptr<float>(),
                                       c10::cuda::getCurrentCUDAStream(logits.device().index()).stream());
  // The launch only: a fault while it runs surfaces at the step's read of the loss.
  if (err != cudaSuccess)
    throw EnvironmentError(std::string("cross-entropy kernel: CUDA error: ") + cudaGetErrorString(err));
  return nll;
}

}  // namespace chiar
