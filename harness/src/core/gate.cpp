#include "chiar/gate.h"

#include <ATen/ATen.h>

namespace chiar {

EntropyGate::EntropyGate(int64_t d, int64_t k) {
  linear_ = register_module("linear", torch::nn::Linear(d + 1, k));
}

at::Tensor EntropyGate::forward(const at::Tensor& x, const at::Tensor& entropy) {
  return linear_(at::cat({x, entropy.unsqueeze(-1).to(x.scalar_type())}, -1));
}

at::Tensor collapse_penalty(const at::Tensor& weights, double lambda) {
  auto usage = weights.reshape({-1, weights.size(-1)}).mean(0);  // (K,)
  return lambda * (usage * usage.clamp_min(1e-12).log()).sum();
}

}  // namespace chiar
