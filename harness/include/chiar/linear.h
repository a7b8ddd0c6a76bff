#pragma once
// The model's dense products. libtorch 1.13 sends every fp32 CPU matrix
// product to the system BLAS; oneDNN (which libtorch links anyway) has its own
// JIT sgemm that picks the widest vector ISA the CPU has, and on the 2-core
// AVX-512 machines here it outruns OpenBLAS's Haswell kernels on the model's
// shapes (chiar_bench: product/blas/*, product/onednn/*). Operators and the
// core call linear() for their projections; which library runs it is one
// process-wide choice, made once at start-up and recorded with every run.
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/nn/modules/linear.h>

#include "chiar/export.h"

namespace chiar {

enum class GemmBackend {
  Blas,    // libtorch's own path (at::linear / at::addmm -> sgemm_ of the system BLAS)
  OneDnn,  // dnnl_sgemm from the oneDNN libtorch links, called on the tensors' memory
};

CHIAR_API const char* to_string(GemmBackend backend);
// "blas" or "onednn"; anything else throws UserError naming both.
CHIAR_API GemmBackend gemm_backend_from_string(const std::string& name);

// Whether this build of the core can call oneDNN (found at configure time).
CHIAR_API bool onednn_available();

// "oneDNN 2.6.3 sgemm, ISA avx512_core_bf16": the library version and the
// vector ISA its JIT kernels use on this CPU; "" without oneDNN.
CHIAR_API std::string onednn_description();

// The library that runs linear() from now on. OneDnn in a build without it
// throws UserError.
CHIAR_API void set_gemm_backend(GemmBackend backend);
CHIAR_API GemmBackend gemm_backend();

// Call it qualified, chiar::linear: with at::Tensor arguments an unqualified
// call also finds at::linear and is ambiguous.
// y = x W^T + b + addend, the last two optional (undefined tensors).
//   x      (..., k)
//   weight (n, k)
//   bias   (n)
//   addend (..., n), e.g. a residual stream: added in the product's pass
// Returns (..., n). Differentiable in all four. With more inputs than outputs
// (k > n) and oneDNN, a row-major copy of W^T is kept per weight and redone
// when the weight's version counter, storage or shape changes: change weights
// in place (under NoGradGuard, as optimisers do) or replace them, not through
// .data(), whose writes libtorch does not count. Under bf16 autocast on a CPU
// where oneDNN has bf16 kernels (gemm_bf16_native), x (fp32 or bf16) and W
// are rounded to bf16 (W once per change of the weight, as above), their
// products summed in fp32, and the output is fp32, bias and addend added in
// fp32; backward rounds the incoming gradient to bf16 and sums the weight's
// gradient in fp32 (differentiable again under create_graph, in fp32). That
// path runs oneDNN's bf16 kernels whatever the backend, on the process's
// threads: like gemm_bf16, do not call linear() inside at::parallel_for (call
// sgemm per tile there). Other products that are not fp32 on the CPU, and
// other autocast, take libtorch's path whatever the backend.
CHIAR_API at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {},
                            const at::Tensor& addend = {});

// linear(x, weight, bias) for an output that only products and kernels
// reading bf16 take (an FFN's pre-activation, attention's queries, keys and
// values): under bf16 products (cpu_bf16_products) the output is bf16, each
// entry summed in fp32 with its bias and rounded once as the product writes
// it, and backward takes a bf16 gradient for it. Where x is bf16 too (the
// FFN's bf16 GELU output), its gradient is written in bf16 the same way. Half the bytes of fp32 each way, and no cast
// between the producer and its reader. Elsewhere exactly linear(x, weight, bias).
CHIAR_API at::Tensor linear_bf16_out(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// bias_gelu(linear_bf16_out(x, weight), bias) (chiar/gelu.h): an FFN's up
// projection and activation. Without grad mode, under bf16 products on a
// CPU with bf16 kernels, one product whose kernels add the bias and take the
// GELU on each fp32 sum before its one rounding to bf16 (a post-op of
// oneDNN's), instead of a bf16 pre-activation that a pass of bias_gelu_
// reads and writes again (chiar_bench: ffn_up_gelu/*). That rounds once
// where training's path rounds twice, so the two outputs may differ by bf16's
// rounding. Elsewhere exactly the composition (in place without grad mode).
CHIAR_API at::Tensor linear_bias_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// a b over matching batch dimensions, differentiable in both:
//   a (..., m, k), b (..., k, n) -> (..., m, n)
// Any operand may be a transposed or sliced view (no copy when each matrix
// is row- or column-major). Batch shapes that differ (broadcasting), non-fp32
// or non-CPU operands and autocast take at::matmul.
CHIAR_API at::Tensor batch_matmul(const at::Tensor& a, const at::Tensor& b);

// A registered torch::nn::Linear's product through linear(): the module keeps
// its parameters (and their names in checkpoints), this runs them.
//   x (..., in) -> (..., out); residual (..., out) or undefined
inline at::Tensor project(const torch::nn::Linear& layer, const at::Tensor& x, const at::Tensor& residual = {}) {
  return chiar::linear(x, layer->weight, layer->bias, residual);
}

// C = alpha op(A) op(B) + beta C on raw row-major fp32 memory, one call on
// the current backend and on the calling thread's share of the cores: inside
// at::parallel_for it runs single-threaded, so kernels that tile their own
// work (attention's fused core) call it once per tile. op(X) is X or X^T.
//   op(A) (m, k), A row-major with leading dimension lda (row stride)
//   op(B) (k, n), ldb likewise
//   C     (m, n), ldc
// beta 0 ignores what C held (NaN included).
CHIAR_API void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// C = alpha op(A) op(B) + beta C for bf16 operands summed in fp32, into
// fp32: what a bf16 step wants where a sum must not round to bf16 (a loss's
// logits, a weight gradient summed over blocks of rows). oneDNN's public
// interface has sgemm but no bf16 gemm, so this runs its matmul primitives,
// made on first use and kept: one per shape whose sizes are multiples of 32,
// one per layout for any other (gemm_bf16_primitives_made). Without oneDNN, or where it has
// only its reference bf16 loop for this CPU, the operands are widened to fp32
// for sgemm: the same products (a product of bf16 values is exact in fp32),
// slower. Arguments as sgemm's, A and B bf16; called from one thread (it
// uses the process's threads itself), not inside at::parallel_for.
CHIAR_API void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c,
                         int64_t ldc);
// The same for one tile of a kernel that tiles its own work: on the calling
// thread alone, so it may run inside at::parallel_for (attention's fused
// core calls it per tile, as it calls sgemm in fp32). Primitives and their
// scratch are kept per thread.
CHIAR_API void gemm_bf16_tile(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                              const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta,
                              float* c, int64_t ldc);
// Tile products gemm_bf16_tile ran on oneDNN's bf16 kernels since the
// process started: the tests check that attention's fused core took them
// under bf16 autocast, and did not in fp32.
CHIAR_API uint64_t gemm_bf16_tile_count();
// oneDNN matmul primitives gemm_bf16 and gemm_bf16_tile have made since the
// process started: for one shape (one whose sizes are all multiples of 32;
// one more where a packed B is passed, gemm_bf16_packed_b),
// and for any size of a layout (every other shape's, made once per layout),
// so that row counts that change every step make no primitive each.
struct GemmBf16Primitives {
  uint64_t for_shape = 0;
  uint64_t for_any_size = 0;
};
CHIAR_API GemmBf16Primitives gemm_bf16_primitives_made();
// gemm_bf16 on its layout's primitive for any size whatever the shape
// (oneDNN's jit gemm, where gemm_bf16 may take one made for the shape), for
// tests and benchmarks; widened as gemm_bf16 where there are no kernels.
CHIAR_API void gemm_bf16_any_size(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                  const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta,
                                  float* c, int64_t ldc);
// A bf16 op(B) (k, n), stored as gemm_bf16 reads it (trans_b, ldb), copied
// into the layout oneDNN's kernels read B in, so that a product reading the
// same B many times (a weight, until the optimiser changes it) skips the
// packing each call does: 1.12-1.31x on the anchor model's weight products
// (chiar_bench product_bf16/packed_b/* against product_bf16/gemm_bf16/*).
// The result is opaque: its sizes are op(B)'s (k, n), its storage the
// packed layout. Undefined where gemm_bf16 would not use it: no oneDNN bf16
// kernels, or n or k not a multiple of 32.
CHIAR_API at::Tensor gemm_bf16_pack_b(bool trans_b, int64_t n, int64_t k, const c10::BFloat16* b, int64_t ldb);
// gemm_bf16 given B packed too (gemm_bf16_pack_b of the same B, or
// undefined): a shape with a primitive of its own reads the packed copy
// where its sizes are this op(B)'s, any other reads B as stored. Only the
// sizes are checked: a copy of another B of the same (k, n) would be read,
// so the caller keeps each copy with its B. The same arguments and threads
// as gemm_bf16.
CHIAR_API void gemm_bf16_packed_b(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                  const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb,
                                  const at::Tensor& packed_b, float beta, float* c, int64_t ldc);
// C = op(A) op(B) + bias into a bf16 C, the bias (n) fp32 added to every
// row where it is not null, and with gelu then the exact GELU (which needs
// the bias): each entry summed in fp32 with its bias, through the GELU in
// fp32, and rounded to bf16 once, as it is written (oneDNN's kernels write
// bf16 themselves, the GELU a post-op of theirs; the widening path rounds an
// fp32 buffer). For a product whose output only bf16 readers take: half the
// bytes written, and no cast or pass after.
// No alpha or beta: what C held is ignored. Otherwise as
// gemm_bf16_packed_b, whose packed B it reads where its primitive reads
// that layout (at the anchor model's shapes it does; at some small ones
// oneDNN picks another kernel and B is read as stored).
CHIAR_API void gemm_bf16_packed_b_rounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                          const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb,
                                          const at::Tensor& packed_b, const float* bias, bool gelu, c10::BFloat16* c,
                                          int64_t ldc);
// The same without the GELU: its signature before plugin API 10, kept for
// plugins built against it.
CHIAR_API void gemm_bf16_packed_b_rounded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                          const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb,
                                          const at::Tensor& packed_b, const float* bias, c10::BFloat16* c, int64_t ldc);
// Products gemm_bf16_packed_b ran on a packed B since the process started:
// the tests check that linear() and the LM head read their weights packed.
CHIAR_API uint64_t gemm_bf16_packed_b_reads();
// The widening path on its own, for tests on machines with the kernels.
CHIAR_API void gemm_bf16_widened(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                 const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta,
                                 float* c, int64_t ldc);
// Whether gemm_bf16 runs on oneDNN's bf16 kernels here; probed once.
CHIAR_API bool gemm_bf16_native();
// Whether this thread's products on the CPU run now as bf16 operands summed
// in fp32 (gemm_bf16): bf16 autocast on the CPU, oneDNN's bf16 kernels
// (gemm_bf16_native) and the harness's kernels enabled (chiar/kernels.h).
// linear() asks it; so do kernels with products of their own, which must
// remember the answer for backward (autograd runs it outside autocast).
CHIAR_API bool cpu_bf16_products();

// c = a b + beta c on the current backend, for 2-D fp32 CPU tensors; a and b
// may be transposed views. c must be contiguous. What the GEMM probes time.
CHIAR_API void gemm_into(at::Tensor& c, const at::Tensor& a, const at::Tensor& b, float beta = 0.f);

}  // namespace chiar
