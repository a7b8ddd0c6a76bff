#pragma once
// LayerNorm over the last dimension with its affine weight and bias:
//   y = (x - mean) / sqrt(var + eps) * weight + bias, per row of x (..., n).
// On fp32 CPU tensors one vectorised pass per row each way, rows spread over
// the cores; backward computes the input gradient and accumulates the weight
// and bias gradients in the same pass. libtorch 1.13's CPU kernel takes
// several times the memory traffic's cost (docs/performance.md, 'What moved
// it'), and the harness runs one per operator and per FFN. Other
// dtypes, devices and autocast take at::layer_norm.
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

}  // namespace chiar
