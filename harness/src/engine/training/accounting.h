#pragma once
// FLOPs and routing statistics of a model on one batch shape.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "engine/store/store.h"

namespace chiar::engine {

struct LayerRoutingStats {
  int64_t layer = 0;
  std::vector<std::pair<std::string, double>> shares;  // operator, share of real tokens
  std::vector<int64_t> histogram;                      // spectral entropy, 20 bins on [0, 1]
};

struct Accounting {
  std::vector<FlopRow> flops;          // per sequence of length T
  double reference_attention_fwd = 0;  // the reference code's rule, see account()
  std::vector<LayerRoutingStats> routing;
};

// Row positions per sequence and operator of a routing choice (B, T):
// positions[b][k] ascending, what Operator::flops_at takes.
std::vector<std::vector<std::vector<int64_t>>> positions_by_operator(const at::Tensor& choice, int64_t K);

// From a forward pass over a batch (B, T) with `out.routing` filled:
// per layer and operator the tokens routed and FLOPs per sequence, as
// executed and as a sparse execution needs them, for the forward pass and a
// training step (forward + backward; learned gates train densely). Also the
// FFN, router and head rows, and the reference code's own formula: forward
// FLOPs of the operators whose traits count attention FLOPs only, a fixed 50%
// share in routed layers.
Accounting account(const model::ChiarModel& model, const model::ModelOutput& out, const at::Tensor& valid, int64_t T);

}  // namespace chiar::engine
