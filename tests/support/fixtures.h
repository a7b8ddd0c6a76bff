#pragma once
// Shared by the tests: the in-tree plugins loaded once, normalised error,
// finite-difference gradient checks, and small input makers.
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "chiar/registry.h"
#include "chiar/linear.h"
#include "chiar/operator.h"

namespace chiar::test {

// The registry over build/plugins, loaded on first use.
const PluginRegistry& plugins();

// The GEMM libraries this build has: the BLAS, and oneDNN when found.
std::vector<GemmBackend> gemm_backends();

// Sets the process-wide GEMM library and puts the previous one back however
// the scope ends.
struct BackendScope {
  explicit BackendScope(GemmBackend b) : saved(gemm_backend()) { set_gemm_backend(b); }
  ~BackendScope() { set_gemm_backend(saved); }
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;
  GemmBackend saved;
};

// ||a - b|| / max(||b||, 1e-30), in float64.
double rel_error(const at::Tensor& a, const at::Tensor& b);

// Largest |autograd - central difference| / max(1, |central difference|) over
// every element of every tensor in `inputs` (float64, requires_grad set by the
// caller). loss must recompute from scratch on each call.
double gradcheck(const std::function<at::Tensor()>& loss, const std::vector<at::Tensor>& inputs, double step = 1e-6);

// An operator from the in-tree plugins, in float64 unless told otherwise;
// pre_norm: OperatorSpec::pre_norm. The same seed gives the same parameters
// in either placement.
std::shared_ptr<Operator> make_op(const std::string& name, int64_t d, int64_t heads, const Params& params = {},
                                  bool float64 = true, uint64_t seed = 7, bool pre_norm = false);

// Whether the attention plugin accepts core = "sdpa" (libtorch's fused
// attention, which it offers from libtorch 2.1 on): asked of the plugin itself,
// so the tests never read its private headers.
bool attention_has_sdpa();

// (B, T) bool with the last `pad[b]` positions of sequence b padding.
at::Tensor padding_mask(int64_t T, const std::vector<int64_t>& pad);

// The flat row indices of the positions where mask (B, T) is true, sorted.
at::Tensor rows_where(const at::Tensor& mask);

// Named parameter or buffer of a module, as float64 (throws if absent).
at::Tensor named(const torch::nn::Module& m, const std::string& name);

}  // namespace chiar::test
