#include "sdpa.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <limits>
#include <stdexcept>

namespace chiar_attention {
namespace {

// The additive mask of sdpa_attention, (G or 1, 1, m, e) in q's dtype (SDPA
// takes a bool mask or one in the query's dtype), or undefined where nothing
// is masked. Compiled on every build, so 1.13 checks it too.
at::Tensor additive_mask(const at::Tensor& q, int64_t e, bool causal_square, const at::Tensor& qpos,
                         const at::Tensor& valid) {
  at::Tensor allowed;  // bool, broadcasting to (G, 1, m, e)
  if (causal_square || qpos.defined()) {
    const auto long_options = q.options().dtype(at::kLong);
    const auto pos = causal_square ? at::arange(q.size(2), long_options).view({1, 1, -1, 1}) : qpos;
    allowed = at::arange(e, long_options).view({1, 1, 1, e}) <= pos;
  }
  if (valid.defined() && valid.numel() > 0) {
    const auto keys = valid.view({valid.size(0), 1, 1, e});
    allowed = allowed.defined() ? allowed.logical_and(keys) : keys;
  }
  if (!allowed.defined()) return {};
  at::Scalar lowest;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "sdpa_attention",
                                  [&] { lowest = std::numeric_limits<scalar_t>::lowest(); });
  return at::zeros(allowed.sizes(), q.options()).masked_fill_(allowed.logical_not(), lowest);
}

}  // namespace

at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal_square,
                          const at::Tensor& qpos, const at::Tensor& valid) {
  const bool padded = valid.defined() && valid.numel() > 0;
  const bool flag_only = causal_square && !padded;
  const auto mask = flag_only ? at::Tensor() : additive_mask(q, k.size(2), causal_square, qpos, valid);
#if CHIAR_HAS_SDPA
  if (!mask.defined()) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/flag_only, 1.0);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, 1.0);
#else
  (void)v;
  throw std::logic_error("sdpa_attention: this build's libtorch has no scaled_dot_product_attention");
#endif
}

}  // namespace chiar_attention
