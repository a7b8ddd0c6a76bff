// chiar_bench: operator-level benchmarks (Google Benchmark). Every case checks
// its result against the dense/full path before it is timed; a case whose
// check fails is reported as an error, not a time. Run it on a Release build:
//   build/chiar_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//     --benchmark_out=bench.json --benchmark_out_format=json (one command line)
// --ops times the operator test matrix's cases instead (chiar/conformance.h;
// the cases `chiar_tests "[ops]"` checks), e.g.
//   build/chiar_bench --ops --benchmark_filter='ops/attention/T=128 .* cpu/fwd'
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <functional>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "core/autocast_compat.h"
#include "model/mixing_layer.h"
#include "chiar/conformance.h"
#include "chiar/registry.h"
#include "engine/runtime/runtime.h"
#include "engine/training/accounting.h"
#include "chiar/cross_entropy.h"
#include "chiar/error.h"
#include "chiar/kernels.h"
#include "chiar/linear.h"
#include "chiar/rows.h"
#include "chiar/spectral.h"
#include "chiar_build_info.h"
#include "bench/bench_support.h"
#include "bench/product_benchmarks.h"

namespace {

using namespace chiar;
using chiar_bench::rel_error;

std::vector<std::string>& plugin_dirs() {
  static std::vector<std::string> dirs;  // --plugin-dir, before the registry is first used
  return dirs;
}

PluginRegistry& registry() {
  static PluginRegistry* r = [] {
    auto* p = new PluginRegistry();
    p->load_default(plugin_dirs());
    return p;
  }();
  return *r;
}

std::shared_ptr<Operator> make(const std::string& name, int64_t d, const Params& params = {}) {
  OperatorSpec spec;
  spec.d_model = d;
  spec.n_heads = 4;
  spec.seed = 1;
  spec.params = params;
  return registry().make_operator(name, spec);
}

constexpr int64_t kBatch = 4;

// Operator forward (and forward + backward) on (4, T, d), causal where the
// operator can be.
void BM_operator(benchmark::State& state, const std::string& name, bool backward) {
  const int64_t T = state.range(0), d = state.range(1);
  at::manual_seed(0);
  auto op = make(name, d);
  auto x = at::randn({kBatch, T, d});
  OpContext ctx;
  ctx.causal = op->traits().causal;
  {
    at::NoGradGuard g;
    auto rows = at::arange(kBatch * T, at::TensorOptions().dtype(at::kLong));
    const double err = rel_error(op->forward_rows(x, rows, ctx), op->forward(x, ctx).view({-1, d}));
    if (err > 1e-4) {
      state.SkipWithError(("forward_rows disagrees with forward: " + std::to_string(err)).c_str());
      return;
    }
  }
  if (backward) x.requires_grad_(true);
  for (auto _ : state) {
    if (backward) {
      auto y = op->forward(x, ctx);
      y.sum().backward();
      benchmark::DoNotOptimize(x.grad().data_ptr());
      x.mutable_grad() = at::Tensor();
    } else {
      at::NoGradGuard g;
      auto y = op->forward(x, ctx);
      benchmark::DoNotOptimize(y.data_ptr());
    }
  }
  const FlopCount f = op->flops_at(T, every_position(T), d, {ctx.causal, /*spectrum=*/false}) * kBatch;
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(backward ? f.total() : f.forward) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kBatch * T), benchmark::Counter::kIsIterationInvariantRate);
}

// One case of the operator test matrix (chiar/conformance.h), checked
// against float64 by run_operator_case before it is timed: forward, or
// forward and backward of sum(y * probe), in the case's dtype and device.
void BM_operator_case(benchmark::State& state, const std::string& name, const OperatorCase& c, bool backward) {
  const auto maker = [name](int64_t d, int64_t heads) {
    OperatorSpec spec;
    spec.d_model = d;
    spec.n_heads = heads;
    return registry().make_operator(name, spec);
  };
  const OperatorCaseResult checked = run_operator_case(maker, c);
  if (!checked.failure.empty()) {
    state.SkipWithError(checked.failure.c_str());
    return;
  }
  const PreparedOperatorCase p = prepare_operator_case(maker, c);
  auto [x, ctx] = case_inputs(p, c);                            // (B, T, d)
  const at::Tensor probe = p.probe.to(x.device(), at::kFloat);  // (B, T, d)
  if (backward) x.requires_grad_(true);
  for (auto _ : state) {
    autocast::Bf16Scope scope(c.bf16, x.device());
    if (backward) {
      auto y = p.op->forward(x, ctx);  // (B, T, d)
      (y.to(at::kFloat) * probe).sum().backward();
      benchmark::DoNotOptimize(x.grad().data_ptr());
      x.mutable_grad() = at::Tensor();
    } else {
      at::NoGradGuard g;
      benchmark::DoNotOptimize(p.op->forward(x, ctx).data_ptr());
    }
    if (c.cuda) torch::cuda::synchronize();
  }
  const FlopCount f = p.op->flops_at(c.T, every_position(c.T), c.d_model, {c.causal, false}) * c.batch;
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(backward ? f.total() : f.forward) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["NMSE"] = checked.output_nmse;
}

// `chiar_bench --ops`: every registered operator's matrix cases, named
// "ops/<operator>/<case>/fwd" and ".../fwd+bwd"; --benchmark_filter picks.
void register_operator_matrix() {
  const bool cuda = torch::cuda::is_available();
  for (const auto& e : registry().entries()) {
    if (e.kind != "operator") continue;
    OperatorSpec spec;
    spec.d_model = 16;
    spec.n_heads = 2;
    const OperatorTraits traits = registry().make_operator(e.name, spec)->traits();
    for (const OperatorCase& c : operator_cases(traits, cuda))
      for (bool backward : {false, true}) {
        const std::string label = "ops/" + e.name + "/" + c.name() + (backward ? "/fwd+bwd" : "/fwd");
        benchmark::RegisterBenchmark(
            label.c_str(),
            [name = e.name, c, backward](benchmark::State& s) { BM_operator_case(s, name, c, backward); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
  }
}

// An operator with a "core" option (attention) forward (and forward +
// backward) on (4, T, d), causal, with one of its cores: the harness's fused
// core against libtorch's SDPA (builds with libtorch 2.1 or newer) and the
// chunked batched products, the same weights for each. Checked against the
// chunked core in float64, with op's weights, before timing.
// bf16: under bf16 autocast (the products' operands bf16, sums fp32),
// checked to bf16's bound instead.
void BM_attention_core(benchmark::State& state, const std::string& name, const std::string& core, bool backward,
                       bool bf16) {
  const int64_t T = state.range(0), d = state.range(1);
  const auto params = Params().set("core", core);
  at::manual_seed(0);
  auto op = make(name, d, params);
  auto x = at::randn({kBatch, T, d});
  OpContext ctx;
  ctx.causal = true;
  {
    at::NoGradGuard g;
    auto reference = make(name, d, Params().set("core", std::string("chunked")));
    const auto from = op->parameters();
    auto to = reference->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    reference->to(at::kDouble);
    at::Tensor out;
    {
      autocast::Bf16Scope scope(bf16, x.device());
      out = op->forward(x, ctx);
    }
    const double err = rel_error(out.to(at::kDouble), reference->forward(x.to(at::kDouble), ctx));
    if (err > (bf16 ? 3e-2 : 1e-4)) {
      state.SkipWithError(("core " + core + " disagrees with float64: " + std::to_string(err)).c_str());
      return;
    }
  }
  if (backward) x.requires_grad_(true);
  // Forward under the autocast scope, backward after it, as training runs them.
  const auto forward = [&] {
    autocast::Bf16Scope scope(bf16, x.device());
    return op->forward(x, ctx);
  };
  for (auto _ : state) {
    if (backward) {
      forward().sum().backward();
      benchmark::DoNotOptimize(x.grad().data_ptr());
      x.mutable_grad() = at::Tensor();
    } else {
      at::NoGradGuard g;
      benchmark::DoNotOptimize(forward().data_ptr());
    }
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kBatch * T), benchmark::Counter::kIsIterationInvariantRate);
}

// Orthonormal DCT-II of 4096 vectors of size d, by GEMM or by FFT.
void BM_dct(benchmark::State& state, DctImpl impl) {
  const int64_t d = state.range(0);
  auto x = at::randn({4096, d});
  at::NoGradGuard g;
  const double err = rel_error(dct2(x, impl), dct2(x.to(at::kDouble), DctImpl::Gemm).to(at::kFloat));
  if (err > 1e-5) {
    state.SkipWithError("DCT disagrees with the float64 GEMM path");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(dct2(x, impl).data_ptr());
}

// Spectral entropy of the router input (its overhead per routed layer).
void BM_router_entropy(benchmark::State& state) {
  const int64_t T = state.range(0), d = state.range(1);
  auto x = at::randn({kBatch, T, d});
  at::NoGradGuard g;
  for (auto _ : state) benchmark::DoNotOptimize(spectral_entropy(x).data_ptr());
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kBatch * T), benchmark::Counter::kIsIterationInvariantRate);
}

// The router's entropy in training, from coefficients that need a gradient:
// by the row kernel with the closed-form backward (kernel) or by autograd
// through the composition (aten). range(2) 0: the forward alone, as under a
// threshold router, whose hard decision asks no gradient of H; 1: forward
// and backward, as under a learned or soft router.
void BM_router_entropy_train(benchmark::State& state, bool kernel) {
  const int64_t T = state.range(0), d = state.range(1);
  const bool backward = state.range(2) != 0;
  at::manual_seed(0);
  const auto c = at::randn({kBatch, T, d}).requires_grad_(true);  // (B, T, d)
  const auto upstream = at::randn({kBatch, T});                   // (B, T) dL/dH
  // Checked first: both ways give the same H and gradient.
  const auto value_and_gradient = [&](KernelPolicy policy) {
    ScopedKernelPolicy scope(policy);
    const auto h = spectral_entropy_from_coeffs(c);  // (B, T)
    const auto grad = torch::autograd::grad({(h * upstream).sum()}, {c})[0];
    return std::make_pair(h.detach(), grad);
  };
  const auto [h_kernel, g_kernel] = value_and_gradient(KernelPolicy::Auto);
  const auto [h_aten, g_aten] = value_and_gradient(KernelPolicy::Compositions);
  const double h_err = (h_kernel - h_aten).abs().max().item<double>();
  const double g_err = (g_kernel - g_aten).norm().item<double>() / g_aten.norm().item<double>();
  if (h_err > 1e-5 || g_err > 1e-4) {
    state.SkipWithError(
        ("kernel and composition disagree: H by " + std::to_string(h_err) + ", gradient by " + std::to_string(g_err))
            .c_str());
    return;
  }
  ScopedKernelPolicy policy(kernel ? KernelPolicy::Auto : KernelPolicy::Compositions);
  for (auto _ : state) {
    const auto h = spectral_entropy_from_coeffs(c);  // (B, T)
    if (backward)
      benchmark::DoNotOptimize(torch::autograd::grad({(h * upstream).sum()}, {c})[0].data_ptr());
    else
      benchmark::DoNotOptimize(h.data_ptr());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kBatch * T), benchmark::Counter::kIsIterationInvariantRate);
}

// Whether the plugin `name` of `kind` declares the option `key`; for a
// plugin that declares nothing (plugin API 7), whether `probe` (making one
// with the option set) succeeds.
bool takes_option(const std::string& kind, const std::string& name, const std::string& key,
                  const std::function<bool()>& probe) {
  const auto declared = registry().declared_options(kind, name);
  if (!declared) return probe();
  return std::any_of(declared->begin(), declared->end(), [&](const PluginOption& o) { return o.key == key; });
}

// The routed-layer cases' plugins: the registry's first CheapMixing and
// first GlobalMixing operator (dct and attention in-tree), each with the
// shortest of its names for case names (dct, attn), and its first router
// that takes fixed entropy thresholds ("tau"; threshold in-tree). All empty
// when the registry lacks any of them.
struct RoutedPair {
  std::string cheap, global, cheap_short, global_short, router;
};

const RoutedPair& routed_pair() {
  static const RoutedPair pair = [] {
    RoutedPair p;
    for (const auto& e : registry().entries()) {
      std::string shortest = e.name;
      for (const auto& alias : e.aliases)
        if (alias.size() < shortest.size()) shortest = alias;
      if (e.kind == "operator") {
        const OperatorRole role = registry().operator_traits(e.name).role;
        if (role == OperatorRole::CheapMixing && p.cheap.empty()) p.cheap = e.name, p.cheap_short = shortest;
        if (role == OperatorRole::GlobalMixing && p.global.empty()) p.global = e.name, p.global_short = shortest;
      }
      if (e.kind == "router" && p.router.empty()) {
        RouterSpec rs;
        rs.d_model = 16;
        rs.operators = {"cheap_mixing", "global_mixing"};
        rs.params.set("tau", 0.5);
        const auto makes = [&] {
          try {
            registry().make_router(e.name, rs);
            return true;
          } catch (const UserError&) {
            return false;
          }
        };
        // Declaring tau is not enough: the router must take one fixed value.
        if (takes_option("router", e.name, "tau", makes) && makes()) p.router = e.name;
      }
    }
    if (p.cheap.empty() || p.global.empty() || p.router.empty()) p = RoutedPair{};
    return p;
  }();
  return pair;
}

// A cheap|global layer (dct|attn) under threshold routing with a given share
// of the rows of (4, T, d) to the global operator (inference, causal), and its
// executed forward FLOPs relative to a global-operator layer on the same
// input: each operator on its rows per sequence (sparse) or on all (dense),
// plus the router's entropy transform. Checks sparse == dense first; an empty
// layer means it failed.
struct RoutedCase {
  std::shared_ptr<model::MixingLayer> layer;
  at::Tensor x;  // (4, T, d)
  double flop_ratio = 0;
};

RoutedCase routed_case(benchmark::State& state, bool sparse, at::Device device = at::kCPU) {
  const int64_t T = state.range(0), d = state.range(1);
  const double share = static_cast<double>(state.range(2)) / 100.0;
  RoutedCase c;
  at::manual_seed(0);
  c.x = at::randn({kBatch, T, d}).to(device);
  auto h = spectral_entropy(c.x).reshape({-1});
  const double tau = share <= 0 ? 2.0 : share >= 1 ? -1.0 : at::quantile(h, 1.0 - share).item<double>();
  RouterSpec rs;
  rs.d_model = d;
  const RoutedPair& pair = routed_pair();
  rs.operators = {pair.cheap, pair.global};
  rs.params.set("tau", tau);
  auto layer = std::make_shared<model::MixingLayer>(
      1, rs.operators, std::vector<std::shared_ptr<Operator>>{make(pair.cheap, d), make(pair.global, d)},
      registry().make_router(pair.router, rs));
  layer->to(device);
  layer->eval();
  OpContext ctx;
  ctx.causal = true;
  at::NoGradGuard g;
  layer->set_execution(model::Execution::Dense);
  const auto dense = layer->forward(c.x, ctx);
  layer->set_execution(model::Execution::Sparse);
  const double err = rel_error(layer->forward(c.x, ctx), dense);
  if (err > 1e-5) {
    state.SkipWithError(("sparse disagrees with dense: " + std::to_string(err)).c_str());
    return c;
  }
  layer->set_execution(sparse ? model::Execution::Sparse : model::Execution::Dense);
  model::LayerRouting routing;
  layer->forward(c.x, ctx, &routing);
  const auto& ops = layer->operators();
  double executed = static_cast<double>(kBatch * 2 * T * d * d);  // entropy: one d x d transform per token
  const auto positions = engine::positions_by_operator(routing.choice.to(at::kCPU), 2);
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t k = 0; k < 2; ++k)
      executed += static_cast<double>(
          ops[k]->flops_at(T, sparse ? positions[b][k] : every_position(T), d, {true, true}).forward);
  const double full = static_cast<double>(kBatch * ops[1]->flops_at(T, every_position(T), d, {true, false}).forward);
  c.flop_ratio = executed / full;
  c.layer = layer;
  return c;
}

void BM_routed(benchmark::State& state, bool sparse) {
  const auto c = routed_case(state, sparse);
  if (!c.layer) return;
  OpContext ctx;
  ctx.causal = true;
  at::NoGradGuard g;
  for (auto _ : state) benchmark::DoNotOptimize(c.layer->forward(c.x, ctx).data_ptr());
  state.counters["flop_ratio"] = c.flop_ratio;
  state.counters["attention_share"] = static_cast<double>(state.range(2)) / 100.0;
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kBatch * state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

// The CUDA kernels (harness/cuda) against the libtorch compositions they
// replace, on the GPU, each result checked against the other's first; the
// sparse routed layer on the GPU, and the gather and scatter of its rows
// alone, whose ratio says whether a fused gather/scatter would pay.
// Registered where the build has the kernels and a GPU is visible.
#if CHIAR_CUDA_KERNELS
void synchronize() { torch::cuda::synchronize(); }

void BM_cuda_entropy(benchmark::State& state, bool kernel) {
  const int64_t T = state.range(0), d = state.range(1);
  at::manual_seed(0);
  auto c = at::randn({kBatch, T, d}, at::TensorOptions().device(at::kCUDA));
  at::NoGradGuard g;
  at::Tensor composed;
  {
    ScopedKernelPolicy aten(KernelPolicy::Compositions);
    composed = spectral_entropy_from_coeffs(c);
  }
  ScopedKernelPolicy policy(kernel ? KernelPolicy::Auto : KernelPolicy::Compositions);
  const uint64_t launched = cuda_kernel_count();
  const double err = (spectral_entropy_from_coeffs(c) - composed).abs().max().item<double>();
  if (kernel && cuda_kernel_count() == launched) {
    state.SkipWithError("the CUDA kernel did not run (cuda_kernels_usable(): see stderr)");
    return;
  }
  if (err > 1e-5) {
    state.SkipWithError(("kernel and composition disagree: " + std::to_string(err)).c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(spectral_entropy_from_coeffs(c).data_ptr());
    synchronize();
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kBatch * T), benchmark::Counter::kIsIterationInvariantRate);
}

// What the sparse layer runs: the row lists on the device and their copy in
// host memory (for operators that plan there), one wait for both.
void BM_cuda_rows(benchmark::State& state, bool kernel) {
  const int64_t T = state.range(0), K = state.range(1);
  at::manual_seed(0);
  auto choice = at::randint(0, K, {kBatch * T}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  RowLists composed;
  {
    ScopedKernelPolicy aten(KernelPolicy::Compositions);
    composed = rows_by_choice_and_host(choice, K);
  }
  ScopedKernelPolicy policy(kernel ? KernelPolicy::Auto : KernelPolicy::Compositions);
  const uint64_t launched = cuda_kernel_count();
  const auto lists = rows_by_choice_and_host(choice, K);
  if (kernel && cuda_kernel_count() == launched) {
    state.SkipWithError("the CUDA kernel did not run (cuda_kernels_usable(): see stderr)");
    return;
  }
  for (int64_t k = 0; k < K; ++k)
    if (!at::equal(lists.rows[k], composed.rows[k]) || !lists.host_rows[k].device().is_cpu() ||
        !at::equal(lists.host_rows[k], composed.rows[k].cpu())) {
      state.SkipWithError("kernel and composition list different rows");
      return;
    }
  for (auto _ : state) {
    // The host lists are complete when the call returns: no synchronize().
    benchmark::DoNotOptimize(rows_by_choice_and_host(choice, K).host_rows.back().data_ptr());
  }
}

void BM_cuda_routed(benchmark::State& state) {
  const auto c = routed_case(state, /*sparse=*/true, at::kCUDA);
  if (!c.layer) return;
  OpContext ctx;
  ctx.causal = true;
  at::NoGradGuard g;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.layer->forward(c.x, ctx).data_ptr());
    synchronize();
  }
  state.counters["attention_share"] = static_cast<double>(state.range(2)) / 100.0;
}

// What the sparse layer spends moving rows: every row gathered once (into
// the operator that takes it) and scattered once (back into the output).
// With `train`, also the moves a training step's backward adds, as autograd
// makes them: the gradient's rows gathered back out of the output
// (index_copy's backward) and each operator's gradient placed into a zeroed
// input-sized tensor and summed (index_select's backward).
void BM_cuda_gather_scatter(benchmark::State& state, bool train) {
  const int64_t T = state.range(0), d = state.range(1);
  const double share = static_cast<double>(state.range(2)) / 100.0;
  at::manual_seed(0);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  auto x = at::randn({kBatch * T, d}, cuda);                  // (B*T, d)
  const auto grad_y = at::randn({kBatch * T, d}, cuda);       // (B*T, d)
  const auto global = at::rand({kBatch * T}, cuda) < share;   // (B*T,)
  const auto rows = rows_by_choice(global.to(at::kLong), 2);  // 2 x (N_k,)
  auto y = at::empty_like(x);                                 // (B*T, d)
  at::Tensor grad_x;                                          // (B*T, d)
  at::NoGradGuard g;
  const auto moves = [&] {
    for (const auto& r : rows) y.index_copy_(0, r, x.index_select(0, r));
    if (!train) return;
    grad_x = at::Tensor();
    for (const auto& r : rows) {
      auto part = at::zeros_like(x).index_add_(0, r, grad_y.index_select(0, r));  // (B*T, d)
      grad_x = grad_x.defined() ? grad_x + part : part;
    }
  };
  moves();  // checked first: every row moved once each way
  if (!at::equal(y, x) || (train && !at::equal(grad_x, grad_y))) {
    state.SkipWithError("moved rows or gradient rows are not what went in");
    return;
  }
  for (auto _ : state) {
    moves();
    synchronize();
  }
}

// The routed layer in a training step, forward and backward (train mode,
// gradients into the input and every parameter).
void BM_cuda_routed_train(benchmark::State& state) {
  const auto c = routed_case(state, /*sparse=*/true, at::kCUDA);
  if (!c.layer) return;
  c.layer->train();
  OpContext ctx;
  ctx.causal = true;
  const auto x = c.x.detach().requires_grad_(true);  // (B, T, d)
  const auto upstream = at::randn_like(x);           // (B, T, d) dL/dy
  // One step, its output and every gradient (input first, then parameters).
  const auto step = [&] {
    x.mutable_grad() = at::Tensor();
    for (auto& p : c.layer->parameters()) p.mutable_grad() = at::Tensor();
    const auto y = c.layer->forward(x, ctx);  // (B, T, d)
    (y * upstream).sum().backward();
    std::vector<at::Tensor> out{y.detach(), x.grad()};
    for (const auto& p : c.layer->parameters()) out.push_back(p.grad());
    return out;
  };
  // Checked first: the sparse training step gives the dense one's output
  // and gradients (a parameter no token reached has none in either).
  c.layer->set_execution(model::Execution::Dense);
  const auto dense = step();
  c.layer->set_execution(model::Execution::Sparse);
  const auto sparse = step();
  for (size_t i = 0; i < dense.size(); ++i) {
    const bool same =
        dense[i].defined() == sparse[i].defined() && (!dense[i].defined() || rel_error(sparse[i], dense[i]) <= 1e-4);
    if (!same) {
      state.SkipWithError(("sparse and dense training steps disagree in tensor " + std::to_string(i)).c_str());
      return;
    }
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(step().front().data_ptr());
    synchronize();
  }
  state.counters["attention_share"] = static_cast<double>(state.range(2)) / 100.0;
}

// The language model head's loss, forward and backward under bf16 autocast,
// three ways: the blocks with the head kernel (what a run takes), the same
// blocks with libtorch's composition in the kernel's place, and libtorch's
// plain path, which makes the (N, V) logits. Each loss is checked against
// the plain path's first.
enum class HeadWay { Kernel, BlocksAten, Plain };

at::Tensor head_loss(HeadWay way, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets) {
  ScopedKernelPolicy policy(way == HeadWay::Kernel ? KernelPolicy::Auto : KernelPolicy::Compositions);
  const autocast::Bf16Scope cast(true, hidden.device());
  if (way == HeadWay::BlocksAten) return chunked_linear_cross_entropy(hidden, weight, targets, {}, at::kBFloat16);
  return linear_cross_entropy(hidden, weight, targets);
}

void BM_cuda_lm_head(benchmark::State& state, HeadWay way) {
  const int64_t N = state.range(0), V = state.range(1), d = 512;
  at::manual_seed(0);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  auto hidden = at::randn({N, d}, cuda).requires_grad_(true);           // (N, d)
  auto weight = (at::randn({V, d}, cuda) * 0.05).requires_grad_(true);  // (V, d)
  const auto targets = at::randint(V, {N}, cuda.dtype(at::kLong));      // (N,)
  const double plain = head_loss(HeadWay::Plain, hidden, weight, targets).item<double>();
  const uint64_t launched = cuda_kernel_count();
  const double loss = head_loss(way, hidden, weight, targets).item<double>();
  if (way == HeadWay::Kernel && cuda_kernel_count() == launched) {
    state.SkipWithError("the head kernel did not run (cuda_kernels_usable(): see stderr)");
    return;
  }
  if (std::abs(loss - plain) > 1e-2 * std::abs(plain)) {
    state.SkipWithError(
        ("loss " + std::to_string(loss) + " against the plain path's " + std::to_string(plain)).c_str());
    return;
  }
  for (auto _ : state) {
    hidden.mutable_grad() = at::Tensor();
    weight.mutable_grad() = at::Tensor();
    head_loss(way, hidden, weight, targets).backward();
    synchronize();
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(N), benchmark::Counter::kIsIterationInvariantRate);
}
#endif

void register_cuda() {
#if CHIAR_CUDA_KERNELS
  if (!torch::cuda::is_available()) return;
  for (bool kernel : {true, false}) {
    const std::string how = kernel ? "kernel" : "aten";
    auto* e = benchmark::RegisterBenchmark(("cuda/router_entropy/" + how).c_str(),
                                           [kernel](benchmark::State& s) { BM_cuda_entropy(s, kernel); });
    for (int64_t T : {512, 2048, 8192})
      for (int64_t d : {256, 512}) e->Args({T, d});
    e->Unit(benchmark::kMicrosecond)->UseRealTime();
    auto* r = benchmark::RegisterBenchmark(("cuda/rows_by_choice_and_host/" + how).c_str(),
                                           [kernel](benchmark::State& s) { BM_cuda_rows(s, kernel); });
    for (int64_t T : {512, 2048, 8192})
      for (int64_t K : {2, 3}) r->Args({T, K});
    r->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
  // Rows and vocabulary: the target shape (B 16, T 2048, GPT-2's
  // vocabulary) and the anchor's (B 8, T 2048, V 8192).
  for (const auto& [name, way] :
       {std::make_pair("kernel", HeadWay::Kernel), std::make_pair("blocks_aten", HeadWay::BlocksAten),
        std::make_pair("plain", HeadWay::Plain)}) {
    auto* head = benchmark::RegisterBenchmark((std::string("cuda/lm_head/") + name).c_str(),
                                              [way = way](benchmark::State& s) { BM_cuda_lm_head(s, way); });
    head->Args({32768, 50257})->Args({16384, 8192})->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  if (!routed_pair().cheap.empty()) {
    const std::string routed = routed_pair().cheap_short + "_" + routed_pair().global_short;
    auto* layer = benchmark::RegisterBenchmark(("cuda/routed_" + routed + "/sparse").c_str(), BM_cuda_routed);
    auto* moves = benchmark::RegisterBenchmark("cuda/gather_scatter",
                                               [](benchmark::State& s) { BM_cuda_gather_scatter(s, false); });
    auto* layer_train =
        benchmark::RegisterBenchmark(("cuda/routed_" + routed + "/sparse_train").c_str(), BM_cuda_routed_train);
    auto* moves_train = benchmark::RegisterBenchmark("cuda/gather_scatter_train",
                                                     [](benchmark::State& s) { BM_cuda_gather_scatter(s, true); });
    for (auto* b : {layer, moves})
      for (int64_t T : {512, 2048, 8192})
        for (int64_t share : {25, 50}) b->Args({T, 512, share});
    // Training at the lengths where moving rows could matter, within the
    // GPU check's time for this step.
    for (auto* b : {layer_train, moves_train})
      for (int64_t T : {2048, 8192})
        for (int64_t share : {25, 50}) b->Args({T, 512, share});
    for (auto* b : {layer, moves, layer_train, moves_train}) b->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
#endif
}

// Does wall-clock track FLOPs? The sparse routed layer and a full-attention
// layer on the same input, timed alternately in every iteration so that both
// see the same machine (these are shared and drift by 10% within minutes):
// time_ratio = median routed / median full, against flop_ratio;
// deviation = time_ratio / flop_ratio - 1. The reported time is the routed
// layer's.
void BM_tracking(benchmark::State& state) {
  const auto c = routed_case(state, /*sparse=*/true);
  if (!c.layer) return;
  auto full = make(routed_pair().global, state.range(1));
  OpContext ctx;
  ctx.causal = true;
  at::NoGradGuard g;
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  for (int i = 0; i < 2; ++i) full->forward(c.x, ctx), c.layer->forward(c.x, ctx);
  std::vector<double> routed_s, full_s;
  for (auto _ : state) {
    auto t0 = Clock::now();
    benchmark::DoNotOptimize(c.layer->forward(c.x, ctx).data_ptr());
    routed_s.push_back(seconds(t0));
    state.SetIterationTime(routed_s.back());
    t0 = Clock::now();
    benchmark::DoNotOptimize(full->forward(c.x, ctx).data_ptr());
    full_s.push_back(seconds(t0));
  }
  const double time_ratio = engine::median(routed_s) / engine::median(full_s);
  state.counters["attention_share"] = static_cast<double>(state.range(2)) / 100.0;
  state.counters["flop_ratio"] = c.flop_ratio;
  state.counters["time_ratio"] = time_ratio;
  state.counters["deviation"] = time_ratio / c.flop_ratio - 1.0;
  state.counters["full_ms"] = 1e3 * engine::median(full_s);
}

// Whether an operator accepts these options: asked of the plugin itself.
bool accepts(const std::string& name, const Params& params) {
  try {
    make(name, 64, params);
    return true;
  } catch (const UserError&) {
    return false;
  }
}

// Every operator in the registry, forward and forward + backward.
void register_operators(const std::vector<std::string>& operators) {
  for (const auto& op : operators)
    for (bool backward : {false, true}) {
      auto* b = benchmark::RegisterBenchmark((op + (backward ? "/fwd+bwd" : "/fwd")).c_str(),
                                             [op, backward](benchmark::State& s) { BM_operator(s, op, backward); });
      for (int64_t d : {256, 512})
        for (int64_t T : {128, 256, 512, 1024, 2048}) b->Args({T, d});
      b->Unit(benchmark::kMillisecond)->UseRealTime();
    }
}

// Operators with cores (attention, which declares "core"): the chunked
// core is every case's reference; SDPA is refused on builds whose libtorch
// lacks it.
void register_cores(const std::vector<std::string>& operators) {
  for (const auto& op : operators) {
    const auto with_core = [&](const char* core) { return accepts(op, Params().set("core", std::string(core))); };
    if (!takes_option("operator", op, "core", [&] { return with_core("chunked"); }) || !with_core("chunked")) continue;
    std::vector<std::string> cores;
    for (const char* core : {"fused", "chunked", "sdpa"})
      if (with_core(core)) cores.push_back(core);
    // The fused core again under bf16 autocast where oneDNN has bf16 kernels
    // (its bf16 tile products); "fused_bf16" beside "fused" in one run.
    std::vector<std::pair<std::string, bool>> runs;
    for (const auto& core : cores) runs.emplace_back(core, false);
    if (gemm_bf16_native() && with_core("fused")) runs.emplace_back("fused", true);
    for (const auto& [core, bf16] : runs)
      for (bool backward : {false, true}) {
        auto* b = benchmark::RegisterBenchmark(
            (op + "_core/" + core + (bf16 ? "_bf16" : "") + (backward ? "/fwd+bwd" : "/fwd")).c_str(),
            [op, core = core, bf16 = bf16, backward](benchmark::State& s) {
              BM_attention_core(s, op, core, backward, bf16);
            });
        for (int64_t T : {128, 512, 2048}) b->Args({T, 256});
        b->Unit(benchmark::kMillisecond)->UseRealTime();
      }
  }
}

// The DCT's two implementations and the router's entropy.
void register_spectral() {
  for (auto impl : {DctImpl::Gemm, DctImpl::Fft}) {
    auto* b = benchmark::RegisterBenchmark((std::string("dct2/") + to_string(impl)).c_str(),
                                           [impl](benchmark::State& s) { BM_dct(s, impl); });
    for (int64_t d : {64, 256, 512, 1024, 2048, 4096}) b->Arg(d);
    b->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  auto* e = benchmark::RegisterBenchmark("router/entropy", BM_router_entropy);
  for (int64_t T : {256, 1024}) e->Args({T, 256});
  e->Unit(benchmark::kMillisecond)->UseRealTime();
  for (const bool kernel : {true, false}) {
    auto* t =
        benchmark::RegisterBenchmark((std::string("router/entropy_train/") + (kernel ? "kernel" : "aten")).c_str(),
                                     [kernel](benchmark::State& s) { BM_router_entropy_train(s, kernel); });
    for (int64_t backward : {0, 1}) t->Args({1024, 256, backward});
    t->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

// The routed layer, sparse and dense, and its denominator: a global-operator
// layer of the same shapes.
void register_routed(const RoutedPair& pair, const std::string& routed) {
  auto* full = benchmark::RegisterBenchmark(("routed_baseline/" + pair.global).c_str(), [](benchmark::State& s) {
    at::manual_seed(0);
    auto op = make(routed_pair().global, s.range(1));
    auto x = at::randn({kBatch, s.range(0), s.range(1)});
    OpContext ctx;
    ctx.causal = true;
    at::NoGradGuard g;
    for (auto _ : s) benchmark::DoNotOptimize(op->forward(x, ctx).data_ptr());
  });
  for (int64_t T : {128, 512, 2048}) full->Args({T, 256});
  full->Unit(benchmark::kMillisecond)->UseRealTime();
  for (bool sparse : {false, true}) {
    auto* b = benchmark::RegisterBenchmark(("routed_" + routed + (sparse ? "/sparse" : "/dense")).c_str(),
                                           [sparse](benchmark::State& s) { BM_routed(s, sparse); });
    for (int64_t T : {128, 512, 2048})
      for (int64_t share : {0, 25, 50, 100}) b->Args({T, 256, share});
    b->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

void register_all() {
  std::vector<std::string> operators;  // registry order
  for (const auto& e : registry().entries())
    if (e.kind == "operator") operators.push_back(e.name);
  register_operators(operators);
  register_cores(operators);
  register_spectral();
  // The routed cases, when the registry has a cheap and a global operator and
  // a threshold router.
  const RoutedPair& pair = routed_pair();
  const std::string routed = pair.cheap_short + "_" + pair.global_short;  // "dct_attn"
  if (!pair.cheap.empty()) register_routed(pair, routed);
  chiar_bench::register_products();
  if (!pair.cheap.empty()) {
    auto* t = benchmark::RegisterBenchmark(("tracking/" + routed).c_str(), BM_tracking);
    for (int64_t T : {128, 256, 512, 1024, 2048})
      for (int64_t share : {0, 25, 50, 100}) t->Args({T, 256, share});
    t->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(15);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool allow_debug = false;
  // --ops: the operator test matrix's cases instead of the usual benchmarks.
  bool operator_matrix = false;
  // --plugin-dir D (or =D), repeatable: taken out before Google Benchmark
  // reads the rest.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--plugin-dir" && i + 1 < argc) {
      plugin_dirs().push_back(argv[++i]);
    } else if (arg.rfind("--plugin-dir=", 0) == 0) {
      plugin_dirs().push_back(arg.substr(std::strlen("--plugin-dir=")));
    } else if (arg == "--ops") {
      operator_matrix = true;
    } else {
      allow_debug |= arg == "--allow-debug";
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (std::string(CHIAR_BUILD_TYPE) != "Release" && !allow_debug) {
    std::cerr << "chiar_bench: this is a " << CHIAR_BUILD_TYPE
              << " build; timings of non-Release builds mislead (pass --allow-debug to run anyway)\n";
    return 1;
  }
  chiar::engine::configure_allocator();
  const auto info = chiar::engine::probe_runtime(0);
  benchmark::AddCustomContext("chiar_build_type", CHIAR_BUILD_TYPE);
  benchmark::AddCustomContext("libtorch", info.torch_version);
  benchmark::AddCustomContext("threads", std::to_string(info.threads));
  benchmark::AddCustomContext("blas", info.blas);
  benchmark::AddCustomContext("products", info.gemm);  // CHIAR_GEMM=blas|onednn chooses
  benchmark::AddCustomContext("gemm_512_gflops", std::to_string(info.gemm_gflops));
  benchmark::AddCustomContext("blas_gemm_512_gflops", std::to_string(info.blas_gflops));
  benchmark::AddCustomContext("allocator", info.allocator);
  if (operator_matrix) {
    register_operator_matrix();
  } else {
    register_all();
    register_cuda();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
