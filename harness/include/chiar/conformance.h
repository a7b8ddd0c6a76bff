#pragma once
// The checks every plugin should pass, shared by the in-tree plugins' tests and
// by out-of-tree plugins (the scaffold's test calls them). Each returns the
// failures, one readable line each; empty means the plugin conforms.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chiar/export.h"
#include "chiar/operator.h"
#include "chiar/router.h"
#include "chiar/task.h"

namespace chiar {

// make(d_model, n_heads) builds a fresh operator. Checked: a colour in its
// traits of the form #rrggbb; in float64: shape and
// dtype, finite outputs, causality (when traits().causal), padding invariance
// (when traits().padded), forward_rows == rows of forward (with and without
// OpContext::host_rows), flops() non-negative
// and increasing in T, and a finite-difference gradient check.
CHIAR_API std::vector<std::string> check_operator(
    const std::function<std::shared_ptr<Operator>(int64_t d_model, int64_t n_heads)>& make);

// The operator test matrix, after llama.cpp's test-backend-ops: each case
// runs an operator in a dtype on a device and compares it with the same
// operator, same weights, in float64 on the CPU (which check_operator holds
// to finite differences, and the in-tree tests to definitions). The same
// cases feed `chiar_bench --ops`, which times what it has checked.
struct CHIAR_API OperatorCase {
  int64_t batch = 2, T = 7, d_model = 16, n_heads = 2;
  bool causal = false;  // OpContext::causal
  bool padded = false;  // the last third of every sequence but the first is padding
  bool bf16 = false;    // under bf16 autocast, as train.precision "bf16" runs (fp32 weights); else fp32
  bool cuda = false;    // on the first CUDA device; else the CPU
  // "T=7 d=16 h=2 causal fp32 cpu": what filters match.
  std::string name() const;
};

// The standard cases for an operator with `traits`: T 1, 7, 128 at (d, heads)
// (16, 2), (64, 4), (256, 4), and T 1024 at (64, 4); each in a plain
// context, a causal one (traits.causal) and a padded one (traits.padded,
// T > 2); fp32 and bf16; on the CPU, and on CUDA when `cuda`. The CPU's
// bf16 cases only where cpu_bf16_sums_in_fp32(): their bounds below assume
// products that sum in fp32.
CHIAR_API std::vector<OperatorCase> operator_cases(const OperatorTraits& traits, bool cuda);

// Whether libtorch's bf16 matrix products on the CPU sum in fp32, probed
// once: some CPU kernels sum in bf16 (Debian's libtorch 1.13 without
// AVX-512: 512 products of ones give 256; a bf16 product of inner size K
// then loses about K u^2 / 3 of NMSE, 1.3e-3 at K 1024, measured), which
// costs a bf16 run most of its precision in every long sum.
CHIAR_API bool cpu_bf16_sums_in_fp32();

// The normalised mean squared error, ||got - ref||^2 / ||ref||^2, a case may
// reach: bf16 keeps 8 bits of mantissa (unit roundoff u = 2^-8), so an
// output within a few u of the reference has NMSE of order (4u)^2 ~ 2.4e-4,
// and gradients, which pass through one more product chain, (12u)^2 ~ 2.2e-3;
// fp32 paths (u = 2^-24) must stay under 1e-9 for outputs and 1e-7 for
// gradients, far above their roundoff yet far below any wrong kernel.
struct OperatorTolerance {
  double output = 0, gradient = 0;
};
CHIAR_API OperatorTolerance operator_tolerance(bool bf16);

struct OperatorCaseResult {
  // The worst NMSE of the outputs (forward, and forward_rows on a sample of
  // rows; valid rows only) and of the gradients (input and every parameter).
  double output_nmse = 0, gradient_nmse = 0;
  OperatorTolerance tolerance;
  std::string failure;  // empty when the case passes
};

// An operator, its inputs and context, built for one case: what
// run_operator_case checks and a benchmark times.
struct PreparedOperatorCase {
  std::shared_ptr<Operator> op, reference;  // the case's dtype and device; float64 on the CPU, same weights
  at::Tensor x, probe;                      // (B, T, d) float64 on the CPU: the input and the loss's weights
  OpContext context;                        // on the CPU; the case's device copies it
};
CHIAR_API PreparedOperatorCase
prepare_operator_case(const std::function<std::shared_ptr<Operator>(int64_t d_model, int64_t n_heads)>& make,
                      const OperatorCase& c, uint64_t seed = 0);
// The input and context on the case's device (fp32), ready for op->forward.
CHIAR_API std::pair<at::Tensor, OpContext> case_inputs(const PreparedOperatorCase& p, const OperatorCase& c);
CHIAR_API OperatorCaseResult
run_operator_case(const std::function<std::shared_ptr<Operator>(int64_t d_model, int64_t n_heads)>& make,
                  const OperatorCase& c, uint64_t seed = 0);

// make(operators) builds a router over that many operators (2 and 3 are tried;
// a factory that refuses a count is skipped). The names stand for operator
// roles, cheapest first ("cheap_mixing", "intermediate_mixing",
// "global_mixing"); no operator is made. Checked: weights (B, T, K) are
// non-negative and sum to 1, choice is the argmax of the weights, hard routers
// give one-hot weights, and causal decisions never depend on later tokens.
CHIAR_API std::vector<std::string> check_router(
    const std::function<std::shared_ptr<Router>(const std::vector<std::string>& operators)>& make);

// Checked: every split has examples and tokens; training batches are a pure
// function of (seed, step); targets lie in the vocabulary or the classes;
// evaluation batches exist and have masks of their token shape.
CHIAR_API std::vector<std::string> check_task(const Task& task);

}  // namespace chiar
