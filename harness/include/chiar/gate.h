#pragma once
// Pieces shared by learned routers: the entropy-aware gate and the v2 collapse
// regulariser.
#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "chiar/export.h"

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

}  // namespace chiar
