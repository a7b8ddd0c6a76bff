#pragma once
// libtorch's own fused attention, at::scaled_dot_product_attention (SDPA),
// from release 2.1 on: the first whose SDPA takes a `scale`, which the
// operator needs because its queries come scaled already. libtorch picks the
// kernel: flash or memory-efficient ones on CUDA, a flash kernel on the CPU
// (2.2 on), the plain math otherwise. The operator runs it where its own fused
// core does not apply (float64, bf16 autocast, fp16, other devices) or when
// asked to (core = "sdpa"); builds on 1.13 compile all but the call itself,
// and the operator refuses core = "sdpa" there.
#include <ATen/core/Tensor.h>

#include "chiar/torch_version.h"

namespace chiar_attention {

#define CHIAR_HAS_SDPA CHIAR_TORCH_AT_LEAST(2, 1)
constexpr bool kHasSdpa = CHIAR_HAS_SDPA;

// softmax(q k^T + mask) v through SDPA, differentiable in q, k and v.
//   q      (G, h, m, dh)  queries, already scaled
//   k, v   (G, h, e, dh)
//   causal_square: m = e queries at positions 0 .. m-1, each masking the
//          keys after it: SDPA's own causal flag, no mask tensor made
//   qpos   (G or 1, 1, m, 1) int64 query positions masking the keys after
//          them, or undefined: no causal mask (ignored with causal_square)
//   valid  (G, e) bool, false for padding keys, or undefined
// Masked keys get the dtype's lowest finite score rather than -inf, so a
// query with every key masked gets uniform weights, as in the other cores.
// Any other mask is built once per call as (G or 1, 1, m, e) in q's dtype:
// one value per (query, key) pair, shared by the heads. Returns (G, h, m, dh).
// Throws on builds without SDPA.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal_square,
                          const at::Tensor& qpos, const at::Tensor& valid);

}  // namespace chiar_attention
