#pragma once
// Attention's core, softmax(q k^T + mask) v, computed tile by tile so that a
// tile's scores (16 to 128 query rows x the keys they read, fp32, within
// kTileBytes) are made, exponentiated and consumed while they are in the
// core's cache, never written to memory as a whole (each output row is
// divided by its weights' sum after the product). Backward recomputes each tile's weights from the saved row
// statistics (two floats per query) instead of keeping them: the memory is
// that of q, k, v and the output, whatever the sequence length.
//
// On the CPU only, fp32 inputs, or bf16 ones under bf16 products (the
// operator sends other dtypes to its unfused path). The products run on
// chiar::sgemm, so on the process's GEMM library; under bf16 autocast on a
// CPU with oneDNN's bf16 kernels (chiar::cpu_bf16_products, asked at forward
// and kept for backward) they take q, k, v, each tile's weights and its
// scores' gradient in bf16 and sum in fp32 (chiar::gemm_bf16_tile), while
// scores, softmax and the row statistics stay fp32. There q, kt and v may
// come in bf16 (the operator's bf16 projections), read in place and given
// their gradients in bf16, each entry rounded once from its fp32 sum; fp32
// ones are rounded into bf16 copies and get fp32 gradients.
#include <ATen/core/Tensor.h>

namespace chiar_attention {

// The scratch a tile's scores may take (backward holds two such arrays, so
// half each): one core's L2 here. 128 rows reach the GEMM's rate at this
// shape, fewer than 16 fall far below it.
constexpr int64_t kTileBytes = 1 << 20;
constexpr int64_t kMaxTileRows = 128, kMinTileRows = 16;

// Differentiable in q, kt and v.
//   q     (G, h, m, dh)  scaled queries; any strides with unit last stride
//   kt    (G, h, dh, L)  keys, transposed (the product reads them row-major)
//   v     (G, h, L, dh)  values
//   qpos  (G or 1, m) int64: query positions for a causal mask (key j is
//         masked for a query at p when j > p), or undefined: no causal mask
//   valid (G, L) bool: keys that exist (padding is false), or undefined
//   block > 0: causal query blocks over positions 0 .. m-1 (m = L, qpos
//         undefined): the queries of block [s, s + block) read keys
//         [0, min(L, s + block)) and mask those after their own position,
//         exactly the keys the operator's FLOP count charges them;
//         block 0: every query reads all L keys.
// A query whose every key is masked gets uniform weights, as in the unfused
// path. Returns (G, h, m, dh) stored as (G, m, h, dh): its transpose(1, 2),
// the heads side by side per query, is contiguous. fp32, or under bf16
// products (chiar::cpu_bf16_products) bf16, each entry rounded once from its
// fp32 sum: what the output projection reads (its gradient then comes back
// in bf16); q, kt and v's gradients are in their own types.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v, const at::Tensor& qpos,
                           const at::Tensor& valid, int64_t block);

// The same for selected rows, in one call however many sequences and key
// ranges they span (the routed layer's sparse attention): no padding of the
// rows to equal lengths, no copies of the keys.
//   q        (N, h, dh) the rows' scaled queries, unit last stride
//   kt, v    as above, (G, h, dh, L) and (G, h, L, dh)
//   segments (S, 4) int64: (start, count, sequence, keys) — rows [start,
//            start + count) of q read keys [0, keys) of that sequence;
//            consecutive, covering all N rows
//   qpos     (N) positions for the causal mask, or undefined
//   valid    (G, L) or undefined
// Returns (N, h, dh), contiguous. Differentiable in q, kt and v.
at::Tensor fused_attention_rows(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v,
                                const at::Tensor& segments, const at::Tensor& qpos, const at::Tensor& valid);

}  // namespace chiar_attention
