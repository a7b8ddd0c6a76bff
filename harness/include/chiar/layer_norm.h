#pragma once
// LayerNorm over the last dimension with its affine weight and bias:
//   y = (x - mean) / sqrt(var + eps) * weight + bias, per row of x (..., n).
// On fp32 CPU tensors one vectorised pass per row each way, rows spread over
// the cores; backward computes the input gradient and accumulates the weight
// and bias gradients in the same pass. libtorch 1.13's CPU kernel takes
// several times the memory traffic's cost (docs/performance.md, 'What moved
// it'), and the harness runs one per operator and per FFN. Under autocast
// an fp32 input (a bf16 step's residual stream) takes it too: autocast
// computes a LayerNorm of fp32 input in fp32. Other dtypes and devices take
// at::layer_norm.
#include <ATen/ATen.h>
#include <torch/nn/modules/normalization.h>

#include "chiar/export.h"

namespace chiar {

// x (..., n), weight (n), bias (n) -> (..., n); differentiable in all three.
CHIAR_API at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

// A registered torch::nn::LayerNorm run through layer_norm() (the module keeps
// its parameters and their checkpoint names); one without an affine part, or
// over more than the last dimension, runs as the module itself.
inline at::Tensor apply_layer_norm(torch::nn::LayerNorm norm, const at::Tensor& x) {
  const auto& o = norm->options;
  if (!o.elementwise_affine() || o.normalized_shape().size() != 1) return norm->forward(x);
  return layer_norm(x, norm->weight, norm->bias, o.eps());
}

// Where a sub-layer's LayerNorm sits (OperatorSpec::pre_norm, model.norm):
//   post  y = LN(x + f(x))   the paper's blocks
//   pre   y = x + f(LN(x))   the residual stream is never normalised; the
//                            model ends in one more LN (docs/method.md,
//                            "Training recipe": post-LN stalls classification)
// A sub-layer computes f on input(x) and returns output(x + f).
class SublayerNorm {
 public:
  SublayerNorm() = default;
  SublayerNorm(torch::nn::LayerNorm norm, bool pre) : norm_(std::move(norm)), pre_(pre) {}
  at::Tensor input(const at::Tensor& x) const { return pre_ ? apply_layer_norm(norm_, x) : x; }
  at::Tensor output(const at::Tensor& sum) const { return pre_ ? sum : apply_layer_norm(norm_, sum); }
  bool pre() const { return pre_; }

 private:
  torch::nn::LayerNorm norm_{nullptr};
  bool pre_ = false;
};

}  // namespace chiar
