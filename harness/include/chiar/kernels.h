#pragma once
// Which implementation the harness's fast paths take. Every hand-written
// host kernel of the core and the bundled plugins (the fused linear layer on
// oneDNN, LayerNorm, bias+GELU, the LM head's cross-entropy, AdamW, row
// grouping, spectral entropy, route mixing, the sparse layer's scatter, the
// fused attention core, RBF scans, threshold routing) runs on fp32 tensors in
// host memory only; for any other tensor it hands over to a composition of
// libtorch operators, which runs on every device. The policy makes the CPU
// take those compositions too, so that the code a GPU run takes is tested on
// machines without one, against the host kernels it replaces. The two CUDA
// kernels (harness/cuda) replace compositions on a GPU where a build has
// them, and are tested there against the host kernels of the same contract.
#include <cstdint>
#include <string>

#include "chiar/export.h"

namespace chiar {

enum class KernelPolicy {
  Auto,          // host kernels for fp32 CPU tensors, the CUDA kernels (where built)
                 // for theirs on a GPU, compositions for the rest
  Compositions,  // libtorch compositions for every tensor
};

CHIAR_API const char* to_string(KernelPolicy policy);
// "auto" or "aten"; anything else throws UserError naming both.
CHIAR_API KernelPolicy kernel_policy_from_string(const std::string& name);

// Process-wide, like the GEMM library (chiar/linear.h): set once at start-up
// or around a test, not while a step runs.
CHIAR_API void set_kernel_policy(KernelPolicy policy);
CHIAR_API KernelPolicy kernel_policy();

// Whether a host kernel may run at all (the policy is Auto); each fast path
// also checks that its tensors are fp32 (or its own types) in host memory.
CHIAR_API bool host_kernels_enabled();

// Whether the harness's CUDA kernels (harness/cuda: the router's spectral
// entropy, the sparse layer's row lists) may run: the policy is Auto and this
// build has them (built when libtorch has CUDA and CMake finds nvcc). Each
// call site also checks that its tensors are on a CUDA device.
CHIAR_API bool cuda_kernels_enabled();
// Whether they can run in this process: the build has them, the driver
// supports the CUDA runtime they were built with, and they were built for
// the GPU's architecture. Where they cannot, every
// call site takes libtorch's composition, and the first call says why once
// on stderr.
CHIAR_API bool cuda_kernels_usable();
// Their state in this process, as a run on a GPU records it (its device's
// provenance): "none in this build", "off by the kernel policy", "on (built
// with CUDA 12.8; runtime 12.8, driver 12.4)" or "off: " and why.
CHIAR_API std::string cuda_kernels_state();

// Entries into host kernels since the process started (every fast path
// counts itself where it takes its host kernel): the tests check that none
// runs under Compositions.
CHIAR_API void count_host_kernel();
CHIAR_API uint64_t host_kernel_count();
// The same for calls into the CUDA kernels: the [cuda] tests check that the
// kernel, not the composition, gave the result they compare.
CHIAR_API void count_cuda_kernel();
CHIAR_API uint64_t cuda_kernel_count();

// Sets a policy for the scope and restores the previous one.
class ScopedKernelPolicy {
 public:
  explicit ScopedKernelPolicy(KernelPolicy policy) : previous_(kernel_policy()) { set_kernel_policy(policy); }
  ~ScopedKernelPolicy() { set_kernel_policy(previous_); }
  ScopedKernelPolicy(const ScopedKernelPolicy&) = delete;
  ScopedKernelPolicy& operator=(const ScopedKernelPolicy&) = delete;

 private:
  KernelPolicy previous_;
};

}  // namespace chiar
