#pragma once
// What chiar_bench's benchmark files share.
#include <ATen/ATen.h>

#include <algorithm>

namespace chiar_bench {

// |a - b| / |b| over all elements: how every benchmark checks its result
// against a plain (usually float64) computation before timing it.
inline double rel_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

}  // namespace chiar_bench
