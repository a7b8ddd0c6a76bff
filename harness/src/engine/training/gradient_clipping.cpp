#include "engine/training/gradient_clipping.h"

#include <ATen/ATen.h>

#include "chiar/torch_version.h"

namespace chiar::engine {

at::Tensor clip_gradient_norm(const std::vector<at::Tensor>& params, double max_norm) {
  // Not recorded even where a gradient requires one (libtorch works on .data()).
  const at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return at::zeros({});
  const auto norms = at::_foreach_norm(grads, 2);                                  // n x (), in the gradients' dtypes
  const auto norm = norms.size() == 1 ? norms.front() : at::stack(norms).norm(2);  // ()
  // libtorch's expression: max_norm / t is t-shaped max_norm divided by t,
  // in t's dtype; clamp keeps a NaN, so a NaN norm makes every gradient NaN
  // (and the run's divergence check stops it), as libtorch's function does.
  const auto scale = at::clamp(max_norm / (norm + 1e-6), c10::nullopt, 1.0);  // ()
#if CHIAR_TORCH_AT_LEAST(2, 1)
  // One multi-tensor launch where the gradients share scale's dtype and
  // device (the trainer's fp32 master gradients).
  at::_foreach_mul_(grads, scale);
#else
  for (const auto& g : grads) g.mul_(scale);
#endif
  return norm;
}

}  // namespace chiar::engine
