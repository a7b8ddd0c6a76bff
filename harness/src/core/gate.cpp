#include "chiar/gate.h"

#include <ATen/ATen.h>

namespace chiar {

EntropyGate::EntropyGate(int64_t d, int64_t k) { linear_ = register_module("linear", torch::nn::Linear(d + 1, k)); }

at::Tensor EntropyGate::forward(const at::Tensor& x, const at::Tensor& entropy) {
  return linear_(at::cat({x, entropy.unsqueeze(-1).to(x.scalar_type())}, -1));
}

at::Tensor collapse_penalty(const at::Tensor& weights, double lambda) {
  auto usage = weights.reshape({-1, weights.size(-1)}).mean(0);  // (K,)
  return lambda * (usage * usage.clamp_min(1e-12).log()).sum();
}

GatedRouter::GatedRouter(const RouterSpec& spec, RouteMode mode, std::string name)
    : mode_(mode), name_(std::move(name)), lambda_(spec.params.get_double("collapse_lambda", 0.0)) {
  gate_ =
      register_module("gate", std::make_shared<EntropyGate>(spec.d_model, static_cast<int64_t>(spec.operators.size())));
}

RouteResult GatedRouter::route(const at::Tensor& x, const at::Tensor& entropy, const OpContext&) {
  RouteResult r;
  r.weights = at::softmax(gate_->forward(x, entropy), -1);  // (B, T, K)
  r.choice = r.weights.argmax(-1);                          // (B, T)
  r.mode = mode_;
  if (lambda_ > 0) r.aux_loss = collapse_penalty(r.weights, lambda_);
  return r;
}

std::string GatedRouter::describe() const {
  return lambda_ > 0 ? name_ + "(collapse_lambda " + std::to_string(lambda_) + ")" : name_;
}

}  // namespace chiar
