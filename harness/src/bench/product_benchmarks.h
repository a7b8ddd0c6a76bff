#pragma once
// chiar_bench's product benchmarks: the model's products on each GEMM
// library and on bf16 operands, attention's batched products, and the LM
// head's loss (product/*, product_bf16/*, batched/*, lm_head/*).

namespace chiar_bench {

void register_products();

}  // namespace chiar_bench
