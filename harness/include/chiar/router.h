#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "chiar/export.h"
#include "chiar/operator.h"
#include "chiar/params.h"

namespace chiar {

// How a routed layer must execute a routing decision.
enum class RouteMode {
  Soft,     // blend every operator's output with weights: dense execution
  HardSTE,  // one operator per token forward, softmax gradient backward: dense
            // while the gate is being trained, sparse otherwise
  Hard,     // one operator per token, no gradient into the decision: sparse
};

CHIAR_API const char* to_string(RouteMode mode);

struct RouteResult {
  at::Tensor weights;  // (B, T, K) blend weights: softmax for learned routers, one-hot otherwise
  at::Tensor choice;   // (B, T) int64 operator index per token (argmax of weights)
  RouteMode mode = RouteMode::Hard;
  at::Tensor aux_loss;  // () added to the training loss (e.g. collapse regulariser), or undefined
};

struct RouterSpec {
  int64_t d_model = 128;
  // The operators of the routed layer, ordered from the cheapest (chosen for the
  // lowest spectral entropy) to the most expressive (highest entropy).
  std::vector<std::string> operators;
  uint64_t seed = 0;
  Params params;
};

class CHIAR_API Router : public torch::nn::Module {
 public:
  ~Router() override;

  // x: (B, T, d) the layer input; entropy: (B, T) its spectral entropy, computed
  // once by the layer; ctx: causality and padding (a causal decision at t may
  // depend on positions <= t only). Returns the decision for every token.
  virtual RouteResult route(const at::Tensor& x, const at::Tensor& entropy, const OpContext& ctx) = 0;

  // Called before training with a sample of spectral entropies (any shape) from
  // this layer's input. Routers with data-derived settings (thresholds from
  // percentiles) set them here; others ignore it.
  virtual void calibrate(const at::Tensor& entropy_sample);

  // The data-derived settings in force (e.g. {tau_low, tau_high}), for records.
  virtual std::vector<double> thresholds() const;

  virtual std::string describe() const = 0;
};

}  // namespace chiar
