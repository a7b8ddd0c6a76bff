#include "chiar/kernels.h"

#include <atomic>

#include "chiar/error.h"
#include "chiar_build_info.h"
#if CHIAR_CUDA_KERNELS
#include "cuda_routing.h"
#endif

namespace chiar {
namespace {
std::atomic<KernelPolicy> g_policy{KernelPolicy::Auto};
}  // namespace

const char* to_string(KernelPolicy policy) { return policy == KernelPolicy::Auto ? "auto" : "aten"; }

KernelPolicy kernel_policy_from_string(const std::string& name) {
  if (name == "auto") return KernelPolicy::Auto;
  if (name == "aten") return KernelPolicy::Compositions;
  throw UserError("unknown kernel policy '" + name + "' (known: auto, aten)");
}

void set_kernel_policy(KernelPolicy policy) { g_policy.store(policy, std::memory_order_relaxed); }
KernelPolicy kernel_policy() { return g_policy.load(std::memory_order_relaxed); }
bool host_kernels_enabled() { return kernel_policy() == KernelPolicy::Auto; }
bool cuda_kernels_enabled() { return CHIAR_CUDA_KERNELS && kernel_policy() == KernelPolicy::Auto; }

std::string cuda_kernels_state() {
#if CHIAR_CUDA_KERNELS
  if (!cuda_kernels_enabled()) return "off by the kernel policy";
  return cuda_kernels_description();
#else
  return "none in this build";
#endif
}

bool cuda_kernels_usable() {
#if CHIAR_CUDA_KERNELS
  return cuda_kernels_runnable();
#else
  return false;
#endif
}

namespace {
std::atomic<uint64_t> g_host_kernels{0};
}  // namespace

void count_host_kernel() { g_host_kernels.fetch_add(1, std::memory_order_relaxed); }
uint64_t host_kernel_count() { return g_host_kernels.load(std::memory_order_relaxed); }

namespace {
std::atomic<uint64_t> g_cuda_kernels{0};
}  // namespace

void count_cuda_kernel() { g_cuda_kernels.fetch_add(1, std::memory_order_relaxed); }
uint64_t cuda_kernel_count() { return g_cuda_kernels.load(std::memory_order_relaxed); }

}  // namespace chiar
