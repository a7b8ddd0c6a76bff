#pragma once
// Tensor entry points to the routed layer's CUDA kernels (harness/cuda),
// compiled only into a build that has them (CHIAR_CUDA_KERNELS in
// chiar_build_info.h): callers check cuda_kernels_enabled() (chiar/kernels.h)
// and the tensor's device and type first.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "chiar/rows.h"

namespace chiar {

// Whether the driver supports the loaded CUDA runtime's major version (a
// newer major one makes every launch fail) and the build holds code the
// current device can load; the first call says once on stderr when not.
// cuda_kernels_usable() (chiar/kernels.h) answers with it.
bool cuda_kernels_runnable();
// What a run records of the kernels here (cuda_kernels_state): "on (built
// with CUDA 12.8; runtime 12.8, driver 12.4)", or "off: " and why.
std::string cuda_kernels_description();
// The most operators rows_by_choice_cuda takes.
constexpr int64_t kMaxCudaOperators = 4096;
// Whether the entropy kernel takes c's type: fp32, bf16 or fp16.
bool cuda_entropy_takes(const at::Tensor& c);
// spectral_entropy_from_coeffs without autograd: c (..., d) on a CUDA
// device, d >= 2 -> H (...) fp32.
at::Tensor spectral_entropy_cuda(const at::Tensor& c);
// rows_by_choice for an int64 choice on a CUDA device and 1 <= K <=
// kMaxCudaOperators: K index tensors, views of one buffer, sized by one copy
// of the K counts to the host; with `with_host`, that copy brings the lists
// too, and host_rows holds them (else it is empty).
RowLists rows_by_choice_cuda(const at::Tensor& choice, int64_t K, bool with_host);

}  // namespace chiar
