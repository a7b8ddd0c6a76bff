#pragma once
// Pieces shared by learned routers: the entropy-aware gate and the v2 collapse
// regulariser.
#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "chiar/export.h"
#include "chiar/router.h"
#include "chiar/task_options.h"

namespace chiar {

// logits = Linear([x, H]): x (B, T, d), H (B, T) -> (B, T, K).
class CHIAR_API EntropyGate : public torch::nn::Module {
 public:
  EntropyGate(int64_t d, int64_t k);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& entropy);

 private:
  torch::nn::Linear linear_{nullptr};  // (d + 1 -> K)
};

// lambda * sum_k m_k log m_k with m = the mean of weights (B, T, K) over tokens:
// minus lambda times the entropy of mean operator usage, so minimising it
// spreads tokens over operators. Returns a () tensor.
CHIAR_API at::Tensor collapse_penalty(const at::Tensor& weights, double lambda);

// A learned router: weights = softmax(EntropyGate(x, H)), choice = argmax.
// mode Soft blends every operator; HardSTE takes the argmax forward with the
// softmax gradient backward. Option collapse_lambda adds collapse_penalty.
class CHIAR_API GatedRouter : public Router {
 public:
  GatedRouter(const RouterSpec& spec, RouteMode mode, std::string name);
  RouteResult route(const at::Tensor& x, const at::Tensor& entropy, const OpContext& ctx) override;
  std::string describe() const override;

 private:
  RouteMode mode_;
  std::string name_;
  double lambda_;
  std::shared_ptr<EntropyGate> gate_;
};

// The options GatedRouter reads, for the plugins that register one
// (Registrar::declare_options).
inline std::vector<PluginOption> gated_router_options() {
  return {{"collapse_lambda", ParamKind::Number, "0",
           "weight of the collapse regulariser (minus the entropy of mean operator usage); 0 turns it off"}};
}

}  // namespace chiar
