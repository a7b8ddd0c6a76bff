#include "cuda_routing.h"

#include <cstdint>
#include <iostream>
#include <string>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "chiar/error.h"
#include "chiar/kernels.h"
#include "routing_kernels.h"  // harness/cuda

namespace chiar {
namespace {

// A kernel that fails to launch or run met a device problem (memory, a
// lost device): an environment failure, named with CUDA's own words.
void check(cudaError_t err, const char* kernel) {
  if (err != cudaSuccess) throw EnvironmentError(std::string(kernel) + ": CUDA error: " + cudaGetErrorString(err));
}

cuda::Real real_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::Real::F32;
    case at::kBFloat16: return cuda::Real::BF16;
    case at::kHalf: return cuda::Real::F16;
    default:
      throw UserError(std::string("spectral entropy kernel: no CUDA kernel for ") + at::toString(t.scalar_type()));
  }
}

}  // namespace

namespace {

// "12.8" for CUDA's 12080.
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Whether the kernels can run here, and the text a run records.
struct KernelsHere {
  bool runnable = false;
  std::string description;
};

KernelsHere kernels_here() {
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess || cudaDriverGetVersion(&driver) != cudaSuccess)
    return {false, "off: the CUDA runtime or driver cannot be queried"};
  if (driver == 0) return {false, "off: no CUDA driver is installed"};
  const std::string versions = "built with CUDA " + cuda_version_text(CUDART_VERSION) + "; runtime " +
                               cuda_version_text(runtime) + ", driver " + cuda_version_text(driver);
  // Within a major version a driver older than the runtime still runs
  // the kernels' machine code (CUDA's minor version compatibility);
  // whether this device can load them is kernels_loadable's question.
  if (driver / 1000 < runtime / 1000)
    return {false, "off: the CUDA runtime loaded is of a newer major version than the driver (" + versions + ")"};
  if (const cudaError_t err = cuda::kernels_loadable(); err != cudaSuccess) {
    (void)cudaGetLastError();  // the failed query must not surface at a later launch check
    return {false, std::string("off: ") + cudaGetErrorString(err) +
                       " (built for the architectures in CHIAR_CUDA_ARCHITECTURES; " + versions + ")"};
  }
  return {true, "on (" + versions + ")"};
}

const KernelsHere& kernels_here_once() {
  static const KernelsHere here = [] {
    KernelsHere h = kernels_here();
    if (!h.runnable)
      std::cerr << "chiar: the CUDA kernels are " << h.description << "; libtorch's compositions run instead\n";
    return h;
  }();
  return here;
}

}  // namespace

bool cuda_kernels_runnable() { return kernels_here_once().runnable; }

std::string cuda_kernels_description() { return kernels_here_once().description; }

bool cuda_entropy_takes(const at::Tensor& c) {
  const auto type = c.scalar_type();
  return type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
}

at::Tensor spectral_entropy_cuda(const at::Tensor& c) {
  const int64_t d = c.size(-1);
  const c10::cuda::CUDAGuard guard(c.device());
  count_cuda_kernel();
  const auto rows = c.contiguous();                                                    // (..., d)
  auto h = at::empty(c.sizes().slice(0, c.dim() - 1), c.options().dtype(at::kFloat));  // (...)
  // Checks the launch only: a fault while the kernel runs surfaces at the
  // next synchronisation, the routing compaction's copy of its counts.
  check(cuda::spectral_entropy_rows(rows.data_ptr(), real_of(c), h.numel(), d, h.data_ptr<float>(),
                                    c10::cuda::getCurrentCUDAStream(c.device().index()).stream()),
        "spectral entropy kernel");
  return h;
}

RowLists rows_by_choice_cuda(const at::Tensor& choice, int64_t K, bool with_host) {
  if (K < 1 || K > kMaxCudaOperators)
    throw UserError("rows_by_choice: K must lie in 1.." + std::to_string(kMaxCudaOperators) + " on a GPU, found " +
                    std::to_string(K));
  const c10::cuda::CUDAGuard guard(choice.device());
  const auto c = choice.reshape({-1}).contiguous();  // (N,)
  const int64_t n = c.numel();
  // The kernels count tiles of 256 choices per operator in int.
  if (K * ((n + 255) / 256) > INT32_MAX)
    throw UserError("rows_by_choice: " + std::to_string(n) + " choices of " + std::to_string(K) +
                    " operators exceed the CUDA kernel's table");
  count_cuda_kernel();
  const auto k = static_cast<int>(K);
  auto workspace =
      at::empty({static_cast<int64_t>(cuda::rows_by_choice_workspace(n, k))}, c.options().dtype(at::kByte));
  auto buffer = at::empty({K + n}, c.options());  // (K + N,) the counts, then the rows
  auto counts = buffer.narrow(0, 0, K);           // (K,)
  auto rows = buffer.narrow(0, K, n);             // (N,) every operator's rows, operator by operator
  check(cuda::rows_by_choice(c.data_ptr<int64_t>(), n, k, workspace.data_ptr(), rows.data_ptr<int64_t>(),
                             counts.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream(c.device().index()).stream()),
        "routing compaction kernel");
  at::Tensor host;  // the one synchronisation: the lists' sizes, and with_host the lists
  try {
    host = (with_host ? buffer : counts).to(at::kCPU);
  } catch (const c10::Error& e) {
    // A kernel fault surfaces at the first synchronisation after it: the
    // fault may be this kernel's, the entropy kernel's before it, or any
    // other queued since the last synchronisation.
    throw EnvironmentError(std::string("routing compaction (its copy of the row counts, the first synchronisation "
                                       "after the routing kernels): ") +
                           e.what_without_backtrace());
  }
  const int64_t* count = host.data_ptr<int64_t>();
  RowLists out;
  int64_t start = 0;
  for (int64_t j = 0; j < K; ++j) {
    out.rows.push_back(rows.narrow(0, start, count[j]));                          // (N_j,)
    if (with_host) out.host_rows.push_back(host.narrow(0, K + start, count[j]));  // (N_j,)
    start += count[j];
  }
  return out;
}

}  // namespace chiar
