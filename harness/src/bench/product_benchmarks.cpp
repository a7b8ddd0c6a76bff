#include "bench/product_benchmarks.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_support.h"
#include "chiar/cross_entropy.h"
#include "chiar/gelu.h"
#include "chiar/linear.h"
#include "core/autocast_compat.h"

namespace chiar_bench {

namespace {

using namespace chiar;

// Times run() on one GEMM library, after checking it against a float64
// value computed the plain way; the library in force before comes back.
template <class Run>
void time_product(benchmark::State& state, GemmBackend backend, const Run& run, const at::Tensor& expected,
                  double flops) {
  struct Restore {
    GemmBackend saved = gemm_backend();
    ~Restore() { set_gemm_backend(saved); }
  } restore;
  set_gemm_backend(backend);
  at::NoGradGuard g;
  const double err = rel_error(run(), expected);
  if (err > 1e-5) {
    state.SkipWithError(("product disagrees with float64: " + std::to_string(err)).c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(run().data_ptr());
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

at::Tensor f64(const at::Tensor& t) { return t.to(at::kDouble); }

// The model's products (chiar/linear.h):
// layout 0: y = x W^T, x (M, K), W (N, K) -- a projection's forward;
// layout 1: (M, N) x (N, K) = gy W -- its input gradient;
// layout 2: (N, M) x (M, K) = gy^T x -- its weight gradient.
void BM_product(benchmark::State& state, GemmBackend backend) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2), layout = state.range(3);
  at::manual_seed(0);
  auto x = at::randn({M, K}), w = at::randn({N, K}), gy = at::randn({M, N});
  const auto run = [&] {
    if (layout == 0) return chiar::linear(x, w);
    return layout == 1 ? chiar::linear(gy, w.t()) : chiar::linear(gy.t(), x.t());
  };
  const auto expected = layout == 0   ? at::matmul(f64(x), f64(w).t())
                        : layout == 1 ? at::matmul(f64(gy), f64(w))
                                      : at::matmul(f64(gy).t(), f64(x));
  time_product(state, backend, run, expected, 2.0 * static_cast<double>(M * K * N));
}

// The same products on bf16 operands, four ways: gemm_bf16 (oneDNN's
// matmul, sums and output in fp32; at these sizes, multiples of 32, on a
// primitive made for the shape), gemm_bf16_packed_b (the same given the
// weight packed once, outside the timing: what linear() and the LM head run
// under bf16 autocast for the two products that read a weight, layouts 0
// and 1; layout 2 reads activations and packs nothing), gemm_bf16_any_size
// (on the primitive made for any size, which shapes of other sizes take)
// and libtorch's bf16 at::mm (output rounded to bf16: what autocast runs
// without the harness's kernels). Each is checked first against float64
// products of the same bf16 values: within fp32 sums for ours, within
// bf16's rounding of the output (2^-8) for libtorch.
enum class Bf16Product { GemmBf16, PackedB, AnySize, Libtorch };

void BM_product_bf16(benchmark::State& state, Bf16Product way) {
  const bool ours = way != Bf16Product::Libtorch;
  const auto gemm = way == Bf16Product::AnySize ? gemm_bf16_any_size : gemm_bf16;
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2), layout = state.range(3);
  at::manual_seed(0);
  const auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16).contiguous(); };
  const auto x = bf16(at::randn({M, K})), w = bf16(at::randn({N, K})), gy = bf16(at::randn({M, N}));
  const int64_t rows = layout == 2 ? N : M, cols = layout == 1 ? K : (layout == 0 ? N : K);
  auto c = at::empty({rows, cols});  // fp32, gemm_bf16's output
  const auto* xp = x.data_ptr<c10::BFloat16>();
  const auto* wp = w.data_ptr<c10::BFloat16>();
  const auto* gp = gy.data_ptr<c10::BFloat16>();
  float* cp = c.data_ptr<float>();
  // w (N, K) as layout 0 reads it (op(B) = w^T) or layout 1 (op(B) = w).
  const at::Tensor packed = way != Bf16Product::PackedB || layout == 2 ? at::Tensor()
                            : layout == 0                              ? gemm_bf16_pack_b(true, N, K, wp, K)
                                                                       : gemm_bf16_pack_b(false, K, N, wp, K);
  const auto run = [&]() -> at::Tensor {
    if (!ours) return layout == 0 ? at::mm(x, w.t()) : layout == 1 ? at::mm(gy, w) : at::mm(gy.t(), x);
    if (way == Bf16Product::PackedB && layout == 0)
      gemm_bf16_packed_b(false, true, M, N, K, 1.f, xp, K, wp, K, packed, 0.f, cp, N);
    else if (way == Bf16Product::PackedB && layout == 1)
      gemm_bf16_packed_b(false, false, M, K, N, 1.f, gp, N, wp, K, packed, 0.f, cp, K);
    else if (layout == 0)
      gemm(false, true, M, N, K, 1.f, xp, K, wp, K, 0.f, cp, N);
    else if (layout == 1)
      gemm(false, false, M, K, N, 1.f, gp, N, wp, K, 0.f, cp, K);
    if (layout == 2) gemm(true, false, N, K, M, 1.f, gp, N, xp, K, 0.f, cp, K);
    return c;
  };
  const auto expected = layout == 0   ? at::matmul(f64(x), f64(w).t())
                        : layout == 1 ? at::matmul(f64(gy), f64(w))
                                      : at::matmul(f64(gy).t(), f64(x));
  const double err = rel_error(run(), expected), bound = ours ? 1e-5 : std::ldexp(1.0, -8);
  if (err > bound) {
    state.SkipWithError(("product disagrees with float64: " + std::to_string(err)).c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(run().data_ptr());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(M * K * N) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// The language model head's loss on the CPU, forward and backward (the fused
// head computes both in one pass), at the anchor model's shapes (N 2048
// rows, d 256, vocabulary 8192), in fp32 or under bf16 autocast, with
// `rows` rows per block (0: the default, as many as 256 MiB of logits hold).
// The loss is checked first against float64 logits and libtorch's
// cross-entropy: within fp32 sums, or bf16's rounding of the operands.
void BM_lm_head(benchmark::State& state, bool bf16) {
  const int64_t N = state.range(0), d = state.range(1), V = state.range(2), rows = state.range(3);
  at::manual_seed(0);
  auto hidden = at::randn({N, d}).requires_grad_(true);           // (N, d)
  auto weight = (at::randn({V, d}) * 0.05).requires_grad_(true);  // (V, d)
  const auto targets = at::randint(V, {N}, at::kLong);            // (N,)
  const auto loss_of = [&] {
    const autocast::Bf16Scope cast(bf16, hidden.device());
    return linear_cross_entropy(hidden, weight, targets, {}, rows);
  };
  const double expected = at::cross_entropy_loss(at::matmul(f64(hidden), f64(weight).t()), targets).item<double>();
  const double loss = loss_of().item<double>();
  if (std::abs(loss - expected) > (bf16 ? 1e-2 : 1e-5) * std::abs(expected)) {
    state.SkipWithError(("loss " + std::to_string(loss) + " against float64's " + std::to_string(expected)).c_str());
    return;
  }
  for (auto _ : state) {
    hidden.mutable_grad() = at::Tensor();
    weight.mutable_grad() = at::Tensor();
    loss_of().backward();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(3 * 2.0 * static_cast<double>(N * d * V) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// An FFN's up projection and GELU without gradients (inference), at the
// anchor's shape (2048 tokens, d 256, width 1024), under bf16 autocast:
// fused 0, the product then bias_gelu_ over its bf16 output; fused 1,
// linear_bias_gelu, whose product's kernels take the bias and the GELU.
// Each is checked first against float64's gelu of the same bf16 operands.
void BM_ffn_up_gelu(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  const bool fused = state.range(3) != 0;
  at::manual_seed(0);
  const auto x = at::randn({M, K}), w = at::randn({N, K}) * 0.06, b = at::randn({N}) * 0.1;
  const at::NoGradGuard no_grad;
  const autocast::Bf16Scope cast(true, x.device());
  const auto run = [&] {
    if (fused) return linear_bias_gelu(x, w, b);
    auto u = linear_bf16_out(x, w);
    return bias_gelu_(u, b);
  };
  const auto bf16_f64 = [](const at::Tensor& t) { return f64(t.to(at::kBFloat16)); };
  const auto expected = at::gelu(at::matmul(bf16_f64(x), bf16_f64(w).t()) + f64(b));
  const double err = rel_error(run(), expected);
  if (err > std::ldexp(1.0, -7)) {
    state.SkipWithError(("disagrees with float64: " + std::to_string(err)).c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(run().data_ptr());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(M * K * N) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Attention's batched products at the anchor shapes (B 8, 4 heads, dh 64, a
// query block of 128 against e keys): which 0, scores q k^T; which 1, the
// weighted values p v.
void BM_batched(benchmark::State& state, GemmBackend backend) {
  const int64_t e = state.range(0), which = state.range(1);
  at::manual_seed(0);
  auto q = at::randn({8, 4, 128, 64}), k = at::randn({8, 4, e, 64}), p = at::randn({8, 4, 128, e});
  const auto run = [&] { return which == 0 ? batch_matmul(q, k.transpose(-2, -1)) : batch_matmul(p, k); };
  const auto expected = which == 0 ? at::matmul(f64(q), f64(k).transpose(-2, -1)) : at::matmul(f64(p), f64(k));
  time_product(state, backend, run, expected, 2.0 * 32 * 128 * 64 * static_cast<double>(e));
}

}  // namespace

// The anchor model's products (q/out, kv, FFN up, FFN down and its tied LM
// head; 2048 tokens), each in its three layouts, and a 2048^3 product.
void with_anchor_products(benchmark::internal::Benchmark* b) {
  for (const auto& [K, N] :
       std::vector<std::pair<int64_t, int64_t>>{{256, 256}, {256, 512}, {256, 1024}, {1024, 256}, {256, 8192}})
    for (int64_t layout : {0, 1, 2}) b->Args({2048, K, N, layout});
  b->Args({2048, 2048, 2048, 0});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The model's products on each GEMM library, and on bf16 operands.
void register_products() {
  std::vector<GemmBackend> libraries{GemmBackend::Blas};
  if (onednn_available()) libraries.push_back(GemmBackend::OneDnn);
  for (const auto lib : libraries) {
    auto* pr = benchmark::RegisterBenchmark((std::string("product/") + to_string(lib)).c_str(),
                                            [lib](benchmark::State& s) { BM_product(s, lib); });
    with_anchor_products(pr);
    auto* bb = benchmark::RegisterBenchmark((std::string("batched/") + to_string(lib)).c_str(),
                                            [lib](benchmark::State& s) { BM_batched(s, lib); });
    for (int64_t e : {128, 512, 2048})
      for (int64_t which : {0, 1}) bb->Args({e, which});
    bb->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  for (const bool bf16 : {false, true}) {
    auto* h = benchmark::RegisterBenchmark(bf16 ? "lm_head/bf16" : "lm_head/fp32",
                                           [bf16](benchmark::State& s) { BM_lm_head(s, bf16); });
    for (int64_t rows : {0, 64, 128, 256, 512}) h->Args({2048, 256, 8192, rows});
    h->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  auto* ffn = benchmark::RegisterBenchmark("ffn_up_gelu", BM_ffn_up_gelu);
  for (int64_t fused : {0, 1}) ffn->Args({2048, 256, 1024, fused});
  ffn->Unit(benchmark::kMillisecond)->UseRealTime();
  for (const auto& [way, name] : {std::make_pair(Bf16Product::GemmBf16, "product_bf16/gemm_bf16"),
                                  std::make_pair(Bf16Product::PackedB, "product_bf16/packed_b"),
                                  std::make_pair(Bf16Product::AnySize, "product_bf16/any_size"),
                                  std::make_pair(Bf16Product::Libtorch, "product_bf16/libtorch")}) {
    auto* pr = benchmark::RegisterBenchmark(name, [way = way](benchmark::State& s) { BM_product_bf16(s, way); });
    with_anchor_products(pr);
  }
}

}  // namespace chiar_bench
