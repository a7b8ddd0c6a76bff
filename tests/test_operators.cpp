#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <torch/cuda.h>

#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/autocast_compat.h"
#include "chiar/error.h"
#include "chiar/linear.h"
#include "chiar/rows.h"
#include "chiar/spectral.h"
#include "support/fixtures.h"
#include "support/reference.h"

using namespace chiar;
namespace ref = chiar::test::ref;
using test::make_op;
using test::named;
using test::rel_error;

namespace {

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

ref::Linear linear(const Operator& op, const std::string& name) {
  return {named(op, name + ".weight"), named(op, name + ".bias")};
}

ref::AttentionWeights attention_weights(const Operator& op, int64_t heads) {
  ref::AttentionWeights w;
  w.q = linear(op, "q");
  w.kv = linear(op, "kv");
  w.out = linear(op, "out");
  w.norm_weight = named(op, "norm.weight");
  w.norm_bias = named(op, "norm.bias");
  w.heads = heads;
  return w;
}

ref::RbfWeights rbf_weights(const Operator& op) {
  ref::RbfWeights w;
  w.q = linear(op, "q");
  w.kv = linear(op, "kv");
  w.out = linear(op, "out");
  w.norm_weight = named(op, "norm.weight");
  w.norm_bias = named(op, "norm.bias");
  w.omega = named(op, "omega");
  return w;
}

// Compares valid rows only: outputs at padding positions are unspecified.
double rel_error_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  if (!valid.defined()) return rel_error(a, b);
  return rel_error(a.masked_select(valid.unsqueeze(-1)), b.masked_select(valid.unsqueeze(-1)));
}

// Every operator, with the options that exercise it.
struct OpCase {
  const char* name;
  Params params;
  bool pre_norm = false;  // OperatorSpec::pre_norm
};

Params chunked() { return Params().set("core", std::string("chunked")); }

// Every operator, with the options that exercise it. The tests run in
// float64, which attention's default core sends to SDPA where the build has
// it, else to the chunked core.
std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases{
      {"dct", Params().set("dct_impl", std::string("gemm"))},
      {"dct", Params().set("dct_impl", std::string("fft"))},
      {"attention", {}},
      {"attention", chunked().set("block", int64_t{3})},  // several query blocks, weights kept by autograd
      {"attention", chunked().set("block", int64_t{3}).set("recompute_mib", 0.0)},  // weights recomputed
      // One sequence and one query row per chunk of work.
      {"attention", chunked().set("block", int64_t{3}).set("chunk_mib", 1e-9)},
      {"attention", chunked().set("block", int64_t{3}).set("chunk_mib", 1e-9).set("recompute_mib", 0.0)},
      {"rbf", Params().set("features", int64_t{16}).set("chunk", int64_t{3})},
      {"rbf", Params().set("features", int64_t{16}).set("chunk", int64_t{64})}};
  if (test::attention_has_sdpa())
    cases.push_back({"attention", Params().set("core", std::string("sdpa")).set("block", int64_t{3})});
  // And each again with its LayerNorm before the sub-layer.
  const size_t post = cases.size();
  for (size_t i = 0; i < post; ++i) cases.push_back({cases[i].name, cases[i].params, true});
  return cases;
}

std::string describe(const OpCase& c) { return c.params.describe() + (c.pre_norm ? ", pre-norm" : ""); }

}  // namespace

TEST_CASE("dct operator equals LN(x + iDCT(DCT(x) * w)) from the definition", "[operator][dct]") {
  for (const char* impl : {"gemm", "fft"}) {
    auto op = make_op("dct", 16, 2, Params().set("dct_impl", std::string(impl)));
    auto x = at::randn({2, 5, 16}, kF64);
    auto m = ref::dct_matrix(16);
    auto filtered = at::matmul(at::matmul(x, m.t()) * named(*op, "filter"), m);
    auto expected =
        ref::layer_norm((x + filtered).view({-1, 16}), named(*op, "norm.weight"), named(*op, "norm.bias")).view_as(x);
    CHECK(rel_error(op->forward(x, {}), expected) < 1e-12);
    // Inference folds the filter into the inverse basis: the same values.
    at::NoGradGuard no_grad;
    CHECK(rel_error(op->forward(x, {}), expected) < 1e-12);
    auto rows = at::tensor(std::vector<int64_t>{1, 4, 7}, at::TensorOptions().dtype(at::kLong));
    CHECK(rel_error(op->forward_rows(x, rows, {}), expected.view({-1, 16}).index_select(0, rows)) < 1e-12);
  }
}

TEST_CASE("dct operator reads the spectrum a routed layer supplies instead of transforming x", "[operator][dct]") {
  at::manual_seed(12);
  auto op = make_op("dct", 16, 2, Params().set("dct_impl", std::string("gemm")));
  auto x = at::randn({2, 5, 16}, kF64);
  auto m = ref::dct_matrix(16);
  const auto expected_from = [&](const at::Tensor& c) {
    return ref::layer_norm((x + at::matmul(c * named(*op, "filter"), m)).view({-1, 16}), named(*op, "norm.weight"),
                           named(*op, "norm.bias"))
        .view_as(x);
  };
  OpContext ctx;
  ctx.spectrum = at::matmul(x, m.t());  // the true spectrum: same result as without
  CHECK(rel_error(op->forward(x, ctx), op->forward(x, {})) < 1e-13);
  // A different spectrum changes the output exactly as the definition says,
  // so the operator used it rather than its own transform.
  ctx.spectrum = at::matmul(x, m.t()) * 2 + 1;
  CHECK(rel_error(op->forward(x, ctx), expected_from(ctx.spectrum)) < 1e-12);
  auto rows = at::tensor(std::vector<int64_t>{0, 3, 4, 9}, at::TensorOptions().dtype(at::kLong));
  CHECK(rel_error(op->forward_rows(x, rows, ctx), expected_from(ctx.spectrum).view({-1, 16}).index_select(0, rows)) <
        1e-12);
}

TEST_CASE("attention equals a naive float64 implementation", "[operator][attention]") {
  at::manual_seed(11);
  // block 256 is one query block at T 9; blocks 1 and 4 split the causal half.
  // "auto" is the fused core in fp32 and SDPA or the chunked core in float64.
  std::vector<std::string> cores{"auto", "chunked"};
  if (test::attention_has_sdpa()) cores.push_back("sdpa");
  for (const auto& core : cores)
    for (bool causal : {true, false})
      for (int64_t heads : {1, 2, 4})
        for (int64_t block : {256, 1, 4}) {
          INFO("core " << core << ", causal " << causal << ", heads " << heads << ", block " << block);
          const auto params = Params().set("block", block).set("core", core);
          auto op = make_op("attention", 16, heads, params);
          auto x = at::randn({3, 9, 16}, kF64);
          OpContext ctx;
          ctx.causal = causal;
          if (!causal) ctx.valid = test::padding_mask(9, {0, 3, 8});
          auto expected = ref::attention(x, attention_weights(*op, heads), causal, ctx.valid);
          CHECK(rel_error_valid(op->forward(x, ctx), expected, ctx.valid) < 1e-12);
          // Float32 against the same float64 reference.
          auto op32 = make_op("attention", 16, heads, params, /*float64=*/false);
          auto expected32 = ref::attention(x, attention_weights(*op32, heads), causal, ctx.valid);
          CHECK(rel_error_valid(op32->forward(x.to(at::kFloat), ctx), expected32, ctx.valid) < 1e-5);
        }
}

TEST_CASE("attention: recomputing the weights in backward gives the stored path's gradients", "[operator][attention]") {
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    std::vector<at::Tensor> grads[2];
    for (int mode = 0; mode < 2; ++mode) {
      auto op = make_op("attention", 16, 2, Params().set("block", int64_t{4}).set("recompute_mib", mode ? 0.0 : 1e12),
                        true, /*seed=*/5);
      at::manual_seed(6);
      auto x = at::randn({3, 11, 16}, kF64).requires_grad_(true);
      OpContext ctx;
      ctx.causal = causal;
      if (!causal) ctx.valid = test::padding_mask(11, {0, 4, 1});
      (op->forward(x, ctx) * at::randn({3, 11, 16}, kF64)).sum().backward();
      grads[mode].push_back(x.grad());
      for (auto& p : op->parameters()) grads[mode].push_back(p.grad());
    }
    for (size_t i = 0; i < grads[0].size(); ++i) CHECK(rel_error(grads[1][i], grads[0][i]) < 1e-12);
  }
}

// The types of the tensors that autograd nodes whose name holds `name` took
// in forward (their gradients' types), over the graph behind `out`.
std::vector<at::ScalarType> node_types(const at::Tensor& out, const std::string& name) {
  std::vector<at::ScalarType> types;
  std::vector<torch::autograd::Node*> stack{out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!node || !seen.insert(node).second) continue;
    if (node->name().find(name) != std::string::npos && node->num_inputs() > 0)
      types.push_back(c10::typeMetaToScalarType(node->input_metadata(0).options().dtype()));
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  return types;
}

TEST_CASE("attention under bf16 products: RoPE and the fused core take bf16 queries, keys and values",
          "[operator][attention][bf16]") {
  // Where oneDNN has bf16 kernels, the projections come out in bf16 and
  // RoPE (two nodes: queries, keys) writes bf16 for the core; in fp32, and
  // under bf16 autocast without those kernels (the projections widened for
  // the core), both stay fp32.
  const bool native = gemm_bf16_native();
  if (!native) WARN("oneDNN has no bf16 kernels here: only the fp32 RoPE is checked");
  auto op = make_op("attention", 16, 2, Params(), false, 21);
  at::manual_seed(23);
  const auto x = at::randn({2, 9, 16}).requires_grad_(true);
  OpContext ctx;
  ctx.causal = true;
  for (const bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16 autocast" : "fp32"));
    at::Tensor out;
    {
      chiar::autocast::Bf16Scope scope(bf16, x.device());
      out = op->forward(x, ctx);
    }
    const auto rope = node_types(out, "Rotary");
    REQUIRE(rope.size() == 2);
    for (const auto type : rope) CHECK(type == (bf16 && native ? at::kBFloat16 : at::kFloat));
    // Backward runs on them: x's gradient is fp32 and finite.
    out.to(at::kFloat).sum().backward();
    CHECK(x.grad().scalar_type() == at::kFloat);
    CHECK(at::isfinite(x.grad()).all().item<bool>());
    x.mutable_grad() = at::Tensor();
  }
}

// Forward and gradients of x and every parameter, through forward or
// forward_rows, with the output's padding rows left out of the loss.
// ctx with its padding mask on as's device.
OpContext on(OpContext ctx, const at::TensorOptions& as) {
  if (ctx.valid.defined()) ctx.valid = ctx.valid.to(as.device());
  return ctx;
}

struct Pass {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};
// bf16: the forward under bf16 autocast on x's device, as training's
// precision "bf16" runs it (fp32 weights and gradients, bf16 products).
Pass run_pass(Operator& op, const at::Tensor& x, const OpContext& ctx, const at::Tensor& rows, const at::Tensor& probe,
              bool bf16 = false) {
  auto input = x.detach().clone().requires_grad_(true);
  op.zero_grad();
  Pass p;
  {
    chiar::autocast::Bf16Scope scope(bf16, x.device());
    p.out = rows.defined() ? op.forward_rows(input, rows, ctx) : op.forward(input, ctx);
  }
  (p.out.to(probe.scalar_type()) * probe).sum().backward();
  p.grads.push_back(input.grad());
  for (auto& w : op.parameters()) p.grads.push_back(w.grad());
  return p;
}

// Operator `name` with `params` in another dtype or on another device (as),
// or under bf16 autocast, against the same operator with `params64` in
// float64 on the CPU (itself checked against the definition and by finite
// differences) with the same weights: every output row (valid ones where
// padded) and every gradient, through forward and forward_rows, to relative
// errors out_tol and grad_tol, in the causal and padded contexts the
// operator's traits allow.
void check_against_f64(const std::string& name, const Params& params, const Params& params64, int64_t T,
                       const at::TensorOptions& as, bool bf16, double out_tol, double grad_tol, bool pre_norm = false,
                       int64_t d = 16) {
  for (bool causal : {true, false})
    for (bool padded : {false, true})
      for (int64_t heads : {1, 2}) {
        INFO(name << " " << params.describe() << (pre_norm ? ", pre-norm" : "") << ", T " << T << ", causal " << causal
                  << ", padded " << padded << ", d " << d << ", heads " << heads << ", " << as
                  << (bf16 ? ", bf16 autocast" : ""));
        auto op = make_op(name, d, heads, params, false, 21, pre_norm);
        auto op64 = make_op(name, d, heads, params64, true, 21, pre_norm);
        const auto traits = op->traits();
        if ((causal && !traits.causal) || (padded && !traits.padded)) continue;
        {
          at::NoGradGuard no_grad;
          auto from = op->parameters();
          auto to = op64->parameters();
          for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
        }
        op->to(as.device(), as.dtype().toScalarType());
        at::manual_seed(22);
        auto x = at::randn({3, T, d}, kF64);
        OpContext ctx;
        ctx.causal = causal;
        if (padded) ctx.valid = test::padding_mask(T, {0, T / 3, 1});
        auto keep = padded ? ctx.valid.unsqueeze(-1).to(at::kDouble) : at::ones({3, T, 1}, kF64);
        auto probe = at::randn({3, T, d}, kF64) * keep;
        auto pick = at::rand({3, T}, kF64) < 0.3;
        pick[1][T - 1] = true;
        const auto rows = test::rows_where(pick);
        auto probe_rows = probe.view({-1, d}).index_select(0, rows);
        for (bool sparse : {false, true}) {
          INFO("forward_rows " << sparse);
          const auto r = sparse ? rows : at::Tensor();
          const auto& pr = sparse ? probe_rows : probe;
          const Pass want = run_pass(*op64, x, ctx, r, pr);
          const Pass got = run_pass(*op, x.to(as), on(ctx, as), sparse ? rows.to(as.device()) : r, pr.to(as), bf16);
          const auto mask = sparse ? (padded ? ctx.valid.reshape({-1}).index_select(0, rows) : at::Tensor())
                                   : (padded ? ctx.valid : at::Tensor());
          const double out_error = rel_error_valid(got.out.cpu().to(at::kDouble), want.out, mask);
          CAPTURE(out_error);
          CHECK(out_error < out_tol);
          for (size_t i = 0; i < want.grads.size(); ++i) {
            const double grad_error = rel_error(got.grads[i].cpu().to(at::kDouble), want.grads[i]);
            CAPTURE(i, grad_error);
            CHECK(grad_error < grad_tol);
          }
        }
      }
}

// Relative errors allowed under bf16 autocast, whose products keep 8 bits
// of mantissa: a few 1e-3 per value. RBF's gradients pass through the
// kernel normaliser's division, which amplifies them (6.3e-2 at most in the
// CPU case below; 0.14 before its phases were kept in fp32).
constexpr double kBf16OutTol = 3e-2;
double bf16_grad_tol(const std::string& op) { return op == "rbf" ? 0.1 : 6e-2; }

// Attention's `core` in fp32 on the CPU, or another dtype and device (as),
// against the float64 chunked core on the CPU.
void check_core(const std::string& core, int64_t T, int64_t block, at::TensorOptions as = at::kFloat,
                double out_tol = 1e-5, double grad_tol = 1e-4) {
  check_against_f64("attention", Params().set("block", block).set("core", core), chunked().set("block", block), T, as,
                    false, out_tol, grad_tol);
}

TEST_CASE("attention's fused fp32 core matches the float64 definition, forward and backward",
          "[operator][attention][fused]") {
  REQUIRE(make_op("attention", 16, 2, {}, false)->describe().find("fused core (fp32 CPU)") != std::string::npos);
  // T 11 in blocks of 3 and 4 (several causal blocks, one tile each), T 300
  // in blocks of 256 and 1000 (blocks cut into tiles of 128 rows), and T 1100
  // in one block (backward's tiles shrink to 64 rows to keep two 1100-key
  // score arrays within kTileBytes).
  for (const auto& [T, block] :
       std::vector<std::pair<int64_t, int64_t>>{{11, 3}, {11, 4}, {300, 256}, {300, 1000}, {1100, 2048}})
    check_core("fused", T, block);
}

TEST_CASE("attention's fused core under bf16 autocast: bf16 products summed in fp32, across tiles and blocks",
          "[operator][attention][fused][bf16]") {
  INFO("oneDNN's bf16 kernels here: " << (chiar::gemm_bf16_native() ? "yes (bf16 tile products)" : "no (fp32 core)"));
  // The shapes of the fp32 case above: several causal blocks, blocks cut
  // into tiles of 128 rows, and backward's tiles of 64 rows. q, k, v and each
  // tile's weights and scores' gradient are rounded to bf16 (8 significant
  // bits: a relative error of at most 2^-8 per operand), so the bounds are
  // bf16's (kBf16OutTol), not fp32's.
  const uint64_t tiles_before = chiar::gemm_bf16_tile_count();
  check_core("fused", 11, 4);  // fp32: no bf16 tile
  CHECK(chiar::gemm_bf16_tile_count() == tiles_before);
  for (const auto& [T, block] : std::vector<std::pair<int64_t, int64_t>>{{11, 4}, {300, 256}, {1100, 2048}})
    check_against_f64("attention", Params().set("block", block).set("core", std::string("fused")),
                      chunked().set("block", block), T, at::kFloat, true, kBf16OutTol, bf16_grad_tol("attention"));
  // Heads of 64 and 32 (d 64): the causal whole-sequence passes cut the
  // first block into tiles of 128 rows x 256 keys, which run on primitives
  // made for their shapes (gemm_bf16_tile), reading a head's values, kt's
  // first 256 keys and, with 2 heads, the output's gradient copied dense, and
  // in backward kt and v transposed. The shapes above, and this case's
  // 44-row tiles and rows, run on the primitives for any size.
  const uint64_t shapes_before = chiar::gemm_bf16_primitives_made().for_shape;
  check_against_f64("attention", Params().set("block", int64_t{256}).set("core", std::string("fused")),
                    chunked().set("block", int64_t{256}), 300, at::kFloat, true, kBf16OutTol,
                    bf16_grad_tol("attention"), false, 64);
  if (chiar::gemm_bf16_native()) CHECK(chiar::gemm_bf16_primitives_made().for_shape > shapes_before);
  // The bf16 tiles ran (forward and backward, whole and by rows), or none
  // where the kernels are missing.
  if (chiar::gemm_bf16_native())
    CHECK(chiar::gemm_bf16_tile_count() > tiles_before);
  else
    CHECK(chiar::gemm_bf16_tile_count() == tiles_before);
}

TEST_CASE("attention's chunked and SDPA cores in fp32 match the float64 definition, forward and backward",
          "[operator][attention][sdpa]") {
  std::vector<std::string> cores{"chunked"};
  if (test::attention_has_sdpa()) cores.push_back("sdpa");
  for (const auto& core : cores)
    for (const auto& [T, block] : std::vector<std::pair<int64_t, int64_t>>{{11, 3}, {11, 4}, {300, 256}})
      check_core(core, T, block);
}

// Hidden (run it with chiar_tests "[cuda]" on a machine with a CUDA device):
// the harness trains on the CPU, but the operator is device-agnostic, and on
// CUDA its default core is libtorch's SDPA (flash or memory-efficient
// kernels) where the build has it. Fails, rather than passes, without a device.
TEST_CASE("attention on a CUDA device matches the float64 definition on the CPU", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  for (const auto& [T, block] : std::vector<std::pair<int64_t, int64_t>>{{11, 4}, {300, 256}}) {
    check_core("auto", T, block, cuda.dtype(at::kFloat), 1e-5, 1e-4);
    check_core("chunked", T, block, cuda.dtype(at::kFloat), 1e-5, 1e-4);
    // bf16 keeps 8 bits of mantissa: errors of a few 1e-3 per value.
    check_core("auto", T, block, cuda.dtype(at::kBFloat16), 3e-2, 6e-2);
  }
}

// The same comparison on the CPU: fp32 paths (the fused and row kernels
// among them) and bf16 autocast, which CPU training may ask for.
TEST_CASE("every operator in fp32 and under bf16 autocast matches itself in float64", "[operator][bf16]") {
  auto cases = op_cases();
  cases.push_back({"fourier", {}});
  for (const auto& c : cases) {
    check_against_f64(c.name, c.params, c.params, 11, at::kFloat, false, 1e-5, 1e-4, c.pre_norm);
    check_against_f64(c.name, c.params, c.params, 11, at::kFloat, true, kBf16OutTol, bf16_grad_tol(c.name), c.pre_norm);
  }
}

// Hidden, like the case above: every operator (the cases the CPU tests use,
// and fourier) on a CUDA device, in fp32 and under bf16 autocast, against
// itself in float64 on the CPU. Each must take a path that runs there (no
// CPU-only kernel, no silent copy to the host): a wrong path fails or errs.
TEST_CASE("every operator on a CUDA device matches itself in float64 on the CPU, fp32 and bf16 autocast", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  auto cases = op_cases();
  cases.push_back({"fourier", {}});
  for (const auto& c : cases)
    for (int64_t T : {11, 300}) {
      check_against_f64(c.name, c.params, c.params, T, cuda, false, 1e-5, 1e-4, c.pre_norm);
      check_against_f64(c.name, c.params, c.params, T, cuda, true, kBf16OutTol, bf16_grad_tol(c.name), c.pre_norm);
    }
}

TEST_CASE("attention's core option: unknown names and SDPA on builds without it are refused", "[operator][attention]") {
  OperatorSpec spec;
  spec.d_model = 16;
  spec.n_heads = 2;
  spec.params.set("core", std::string("flash"));
  CHECK_THROWS_WITH(test::plugins().make_operator("attention", spec),
                    Catch::Matchers::EndsWith("attention: core must be auto, fused, sdpa or chunked, found \"flash\""));
  spec.params.set("core", std::string("sdpa"));
  if (test::attention_has_sdpa()) {
    CHECK(test::plugins().make_operator("attention", spec)->describe().find("SDPA core") != std::string::npos);
  } else {
    CHECK_THROWS_WITH(
        test::plugins().make_operator("attention", spec),
        Catch::Matchers::EndsWith("attention: core \"sdpa\" needs libtorch 2.1 or newer; this build has " +
                                  std::string(TORCH_VERSION)));
  }
}

TEST_CASE("attention's fused core gives NaN exactly where the unfused core does", "[operator][attention][fused]") {
  auto fused = make_op("attention", 16, 2, Params().set("block", int64_t{4}), /*float64=*/false, 23);
  auto unfused = make_op("attention", 16, 2, chunked().set("block", int64_t{4}), false, 23);
  at::manual_seed(24);
  auto x = at::randn({2, 11, 16});
  x[0][5][3] = std::numeric_limits<float>::quiet_NaN();  // token 5's keys and values are NaN
  x[1][2][0] = std::numeric_limits<float>::infinity();
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    OpContext ctx;
    ctx.causal = causal;
    at::NoGradGuard no_grad;
    const auto want = unfused->forward(x, ctx).isnan();
    CHECK(want.any().item<bool>());
    CHECK(at::equal(fused->forward(x, ctx).isnan(), want));
  }
}

TEST_CASE("attention under bf16 autocast stays close to fp32, whole and by rows", "[operator][attention][bf16]") {
  auto op = make_op("attention", 16, 2, Params().set("block", int64_t{4}), /*float64=*/false, 25);
  at::manual_seed(26);
  auto x = at::randn({2, 11, 16});
  auto rows = at::tensor(std::vector<int64_t>{1, 4, 12, 21}, at::TensorOptions().dtype(at::kLong));
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    OpContext ctx;
    ctx.causal = causal;
    const auto want = op->forward(x, ctx).detach();
    auto input = x.clone().requires_grad_(true);
    at::Tensor got, got_rows;
    {
      // The residual stream stays fp32 while the projections' operands are
      // bf16 (their outputs bf16 where libtorch runs them): the fused core
      // and its RoPE take them widened to fp32.
      chiar::autocast::set_cpu(true, at::kBFloat16);
      at::autocast::increment_nesting();
      got = op->forward(input, ctx);
      got_rows = op->forward_rows(input, rows, ctx);
      at::autocast::decrement_nesting();
      chiar::autocast::set_cpu(false);
      at::autocast::clear_cache();
    }
    CHECK(rel_error(got.to(at::kFloat), want) < 5e-2);
    CHECK(rel_error(got_rows.to(at::kFloat), want.view({-1, 16}).index_select(0, rows)) < 5e-2);
    (got.to(at::kFloat).sum() + got_rows.to(at::kFloat).sum()).backward();
    CHECK(input.grad().isfinite().all().item<bool>());
  }
}

TEST_CASE("attention without RoPE is position-free", "[operator][attention]") {
  auto op = make_op("attention", 8, 2, Params().set("rope", false));
  auto x = at::randn({1, 6, 8}, kF64);
  auto w = attention_weights(*op, 2);
  w.rope = false;
  CHECK(rel_error(op->forward(x, {}), ref::attention(x, w, false, {})) < 1e-12);
}

TEST_CASE("rbf linear form equals the explicit quadratic form of the same kernel", "[operator][rbf]") {
  at::manual_seed(12);
  for (bool causal : {true, false}) {
    for (int64_t chunk : {1, 4, 64}) {
      INFO("causal " << causal << ", chunk " << chunk);
      auto op = make_op("rbf", 12, 1, Params().set("features", int64_t{8}).set("chunk", chunk));
      auto x = at::randn({3, 10, 12}, kF64);
      OpContext ctx;
      ctx.causal = causal;
      ctx.valid = test::padding_mask(10, {0, 2, 9});
      auto expected = ref::rbf_quadratic(x, rbf_weights(*op), causal, ctx.valid);
      CHECK(rel_error_valid(op->forward(x, ctx), expected, ctx.valid) < 1e-12);
      ctx.valid = at::Tensor();
      CHECK(rel_error(op->forward(x, ctx), ref::rbf_quadratic(x, rbf_weights(*op), causal, {})) < 1e-12);
    }
  }
}

TEST_CASE("rbf keeps the normaliser away from zero", "[operator][rbf]") {
  // A tiny eps forces the floor to bind for some rows; outputs stay finite.
  auto op = make_op("rbf", 8, 1, Params().set("features", int64_t{2}).set("eps", 0.5));
  auto x = at::randn({2, 16, 8}, kF64) * 10;
  OpContext ctx;
  ctx.causal = true;
  auto y = op->forward(x, ctx);
  CHECK(y.isfinite().all().item<bool>());
  CHECK(rel_error(y, ref::rbf_quadratic(x,
                                        [&] {
                                          auto w = rbf_weights(*op);
                                          w.eps = 0.5;
                                          return w;
                                        }(),
                                        true, {})) < 1e-12);
}

TEST_CASE("the rbf kernel estimate approaches exp(-gamma |q-k|^2)", "[operator][rbf]") {
  // With many features, phi(q).phi(k) converges to the RBF kernel.
  const int64_t d = 4, R = 20000;
  const double gamma = 0.3;
  auto op = make_op("rbf", d, 1, Params().set("features", R).set("gamma", gamma));
  auto omega = named(*op, "omega");
  auto q = at::randn({d}, kF64), k = at::randn({d}, kF64);
  auto phi = [&](const at::Tensor& u) {
    auto p = at::matmul(u, omega);
    return at::cat({at::cos(p), at::sin(p)}) / std::sqrt(static_cast<double>(R));
  };
  const double estimate = at::dot(phi(q), phi(k)).item<double>();
  const double exact = std::exp(-gamma * (q - k).square().sum().item<double>());
  CHECK(estimate == Approx(exact).margin(0.03));
}

TEST_CASE("every operator: forward_rows equals the selected rows of forward", "[operator][rows]") {
  at::manual_seed(13);
  for (const auto& c : op_cases()) {
    for (bool causal : {true, false}) {
      INFO(c.name << " " << describe(c) << ", causal " << causal);
      auto op = make_op(c.name, 16, 2, c.params, true, 7, c.pre_norm);
      auto x = at::randn({3, 11, 16}, kF64);
      OpContext ctx;
      ctx.causal = causal;
      if (!causal) ctx.valid = test::padding_mask(11, {0, 4, 1});
      auto full = op->forward(x, ctx).view({-1, 16});
      for (double share : {0.0, 0.2, 0.5, 1.0}) {
        auto pick = at::rand({3, 11}, kF64) < share;
        pick[1][10] = true;  // at least one row, at a chunk/sequence edge
        auto rows = test::rows_where(pick);
        CHECK(rel_error(op->forward_rows(x, rows, ctx), full.index_select(0, rows)) < 1e-12);
      }
    }
  }
}

// Pre-norm y = x + f(LN(x)) and post-norm y = LN(x + f(x)) share f: with
// n = LN(x), y_pre - x + n = n + f(n), whose LN is y_post(n). The same seed
// gives both instances the same parameters, the LayerNorm's affine included.
TEST_CASE("every operator's pre-norm form is its post-norm sub-layer on LN(x), plus x", "[operator][pre_norm]") {
  at::manual_seed(19);
  auto cases = op_cases();
  cases.push_back({"fourier", {}, true});
  for (const auto& c : cases) {
    if (!c.pre_norm) continue;
    for (bool causal : {true, false}) {
      INFO(c.name << " " << describe(c) << ", causal " << causal);
      auto pre = make_op(c.name, 16, 2, c.params, true, 7, true);
      auto post = make_op(c.name, 16, 2, c.params, true, 7, false);
      REQUIRE(pre->traits().pre_norm);
      if (causal && !pre->traits().causal) continue;
      OpContext ctx;
      ctx.causal = causal;
      if (!causal) ctx.valid = test::padding_mask(11, {0, 4, 1});
      auto x = at::randn({3, 11, 16}, kF64) * 3 + 1;  // not already normalised
      const auto ln = [&](const at::Tensor& u) {
        return ref::layer_norm(u.reshape({-1, 16}), named(*pre, "norm.weight"), named(*pre, "norm.bias")).view_as(u);
      };
      const auto n = ln(x);
      CHECK(rel_error_valid(ln(pre->forward(x, ctx) - x + n), post->forward(n, ctx), ctx.valid) < 1e-12);
      auto rows = at::tensor(std::vector<int64_t>{0, 5, 12, 16, 31}, at::TensorOptions().dtype(at::kLong));
      const auto flat = [](const at::Tensor& u) { return u.reshape({-1, 16}); };
      CHECK(
          rel_error(ln(pre->forward_rows(x, rows, ctx) - flat(x).index_select(0, rows) + flat(n).index_select(0, rows)),
                    post->forward_rows(n, rows, ctx)) < 1e-12);
    }
  }
}

TEST_CASE("every operator is causal: later tokens never change earlier outputs", "[operator][causal]") {
  at::manual_seed(14);
  for (const auto& c : op_cases()) {
    INFO(c.name << " " << describe(c));
    auto op = make_op(c.name, 16, 2, c.params, true, 7, c.pre_norm);
    OpContext ctx;
    ctx.causal = true;
    auto x = at::randn({2, 12, 16}, kF64);
    for (int64_t t : {0, 5, 10}) {
      auto changed = x.clone();
      changed.narrow(1, t + 1, 12 - t - 1).normal_();
      auto a = op->forward(x, ctx).narrow(1, 0, t + 1);
      auto b = op->forward(changed, ctx).narrow(1, 0, t + 1);
      CHECK(rel_error(b, a) < 1e-13);
      auto rows = at::arange(0, t + 1, at::TensorOptions().dtype(at::kLong));
      CHECK(rel_error(op->forward_rows(changed, rows, ctx), a[0]) < 1e-13);
    }
  }
}

TEST_CASE("every operator ignores the content of padding positions", "[operator][padding]") {
  at::manual_seed(15);
  for (const auto& c : op_cases()) {
    INFO(c.name << " " << describe(c));
    auto op = make_op(c.name, 16, 2, c.params, true, 7, c.pre_norm);
    OpContext ctx;
    ctx.valid = test::padding_mask(9, {0, 4});
    auto x = at::randn({2, 9, 16}, kF64);
    auto noisy = x.clone();
    noisy[1].narrow(0, 5, 4).normal_().mul_(100);
    CHECK(rel_error_valid(op->forward(noisy, ctx), op->forward(x, ctx), ctx.valid) < 1e-13);
  }
}

TEST_CASE("every operator passes a float64 finite-difference gradient check", "[operator][grad]") {
  at::manual_seed(16);
  for (const auto& c : op_cases()) {
    for (bool causal : {true, false}) {
      INFO(c.name << " " << describe(c) << ", causal " << causal);
      auto op = make_op(c.name, 8, 2, c.params, true, 7, c.pre_norm);
      auto x = at::randn({2, 5, 8}, kF64).requires_grad_(true);
      auto probe = at::randn({2, 5, 8}, kF64);  // a random projection of the output
      OpContext ctx;
      ctx.causal = causal;
      if (!causal) ctx.valid = test::padding_mask(5, {0, 2});
      std::vector<at::Tensor> inputs{x};
      for (auto& p : op->parameters()) inputs.push_back(p);
      CHECK(test::gradcheck([&] { return (op->forward(x, ctx) * probe).sum(); }, inputs) < 1e-6);
      auto rows = at::tensor(std::vector<int64_t>{1, 3, 6, 9}, at::TensorOptions().dtype(at::kLong));
      auto probe_rows = at::randn({4, 8}, kF64);
      CHECK(test::gradcheck([&] { return (op->forward_rows(x, rows, ctx) * probe_rows).sum(); }, inputs) < 1e-6);
    }
  }
}

TEST_CASE("flops: non-negative, linear in rows, monotone in T, exact for dct", "[operator][flops]") {
  for (const auto& c : op_cases()) {
    INFO(c.name << " " << describe(c));
    auto op = make_op(c.name, 64, 4, c.params, false);
    int64_t previous = 0;
    for (int64_t T : {16, 32, 64, 128, 256}) {
      const FlopCount full = op->flops(T, T, 64);
      CHECK(full.forward > 0);
      CHECK(full.backward > 0);
      CHECK(full.total() > previous);
      previous = full.total();
      CHECK(op->flops(T, T / 2, 64).forward < full.forward);
      CHECK(op->flops(T, 0, 64).forward >= 0);
    }
  }
  // d = 64, 10 rows, GEMM path: two 64x64 transforms, filter + residual, LayerNorm.
  auto dct = make_op("dct", 64, 4, Params().set("dct_impl", std::string("gemm")), false);
  const int64_t n = 10, d = 64;
  CHECK(dct->flops(100, n, d).forward == 2 * (2 * n * d * d) + 2 * n * d + 8 * n * d);
  CHECK(dct->flops(100, n, d).backward == 2 * (2 * n * d * d) + 2 * n * d + 16 * n * d);
  // A sequence with no rows costs nothing (its keys and values are not computed).
  CHECK(make_op("attention", 64, 4, {}, false)->flops(256, 0, 64) == FlopCount{});
  // Attention grows quadratically: doubling T (all rows) more than doubles it.
  auto attn = make_op("attention", 64, 4, {}, false);
  CHECK(attn->flops(512, 512, 64).forward > 3 * attn->flops(256, 256, 64).forward);
  // Causal attention in query blocks: a row in block [s, s + b) reads
  // min(T, s + b) keys. T 10, block 4: rows 0-3 read 4 keys, 4-7 read 8, 8-9 read 10.
  {
    const int64_t T = 10, d = 64, h = 4;
    // The unfused core keeps the weights for backward at these sizes; the
    // fused core (the default) recomputes them, as the unfused one does
    // above recompute_mib.
    const auto unfused = chunked();
    auto blocked = make_op("attention", d, h, Params(unfused).set("block", int64_t{4}), false);
    const auto all = every_position(T);
    const int64_t keys = 4 * 4 + 4 * 8 + 2 * 10;
    // Per (query, key) pair: two products and the softmax.
    const auto per_keys = [&](int64_t n) {
      return FlopCount{2 * n * d, 4 * n * d} * 2 + FlopCount{5 * n * h, 3 * n * h};
    };
    const FlopCount fixed = blocked->flops(T, T, d) - per_keys(T * T);
    CHECK(blocked->flops_at(T, all, d, {true, false}) == fixed + per_keys(keys));
    auto recomputed =
        make_op("attention", d, h, Params(unfused).set("block", int64_t{4}).set("recompute_mib", 0.0), false);
    auto fused = make_op("attention", d, h, Params().set("block", int64_t{4}), false);
    for (const auto& rows : std::vector<std::vector<int64_t>>{all, {1, 9}, {0, 2, 4, 6, 9}})
      for (bool causal : {true, false})
        CHECK(fused->flops_at(T, rows, d, {causal, false}) == recomputed->flops_at(T, rows, d, {causal, false}));
    CHECK(recomputed->flops(T, T, d).backward - blocked->flops(T, T, d).backward == 2 * T * T * d + 5 * T * T * h);
    CHECK(recomputed->flops(T, T, d).forward == blocked->flops(T, T, d).forward);
    // The default 64 MiB: 4 heads of fp32 weights per sequence exceed it from
    // T 2049 without causality, and from T 2834 with the causal blocks of 128.
    auto standard = make_op("attention", 256, 4, unfused, false);
    auto never = make_op("attention", 256, 4, Params(unfused).set("recompute_mib", 1e12), false);
    const auto recomputes = [&](int64_t t, bool causal) {
      const auto p = every_position(t);
      return standard->flops_at(t, p, 256, {causal, false}).backward >
             never->flops_at(t, p, 256, {causal, false}).backward;
    };
    CHECK_FALSE(recomputes(2048, false));
    CHECK(recomputes(2049, false));
    CHECK_FALSE(recomputes(2833, true));
    CHECK(recomputes(2834, true));
    CHECK(blocked->flops_at(T, all, d, {false, false}) == blocked->flops(T, T, d));
    // Sparse rows go in wider query blocks: 2 rows of 10 (density 0.2, about
    // 2.5 blocks per row pair) use spans of 2 blocks, so rows 1 and 9 read 8
    // and 10 keys; 5 rows (density 0.5) keep blocks of 4: rows 0, 2, 4, 6, 9
    // read 4, 4, 8, 8 and 10.
    const FlopCount fixed2 = blocked->flops(T, 2, d) - per_keys(2 * T);
    CHECK(blocked->flops_at(T, {1, 9}, d, {true, false}) == fixed2 + per_keys(8 + 10));
    const FlopCount fixed5 = blocked->flops(T, 5, d) - per_keys(5 * T);
    CHECK(blocked->flops_at(T, {0, 2, 4, 6, 9}, d, {true, false}) == fixed5 + per_keys(4 + 4 + 8 + 8 + 10));
    // One row in 40 positions: the nearest power of two to 20 blocks is 16,
    // which covers the sequence, so it reads all keys up to its block end.
    auto wide = make_op("attention", d, h, Params(unfused).set("block", int64_t{2}), false);
    CHECK(wide->flops_at(40, {3}, d, {true, false}) == wide->flops(40, 1, d) - per_keys(40) + per_keys(32));
    CHECK(blocked->flops_at(T, {}, d, {true, false}) == FlopCount{});
    // Operators whose cost does not depend on positions: flops_at == flops.
    CHECK(dct->flops_at(T, {1, 9}, d, {true, false}) == dct->flops(T, 2, d));
    // A supplied spectrum saves the DCT operator its forward transform.
    CHECK(dct->flops_at(T, {1, 9}, d, {true, true}) == dct->flops(T, 2, d) - matmul_flops(2, d, d, false));
  }
  // The linear RBF form grows linearly in T.
  auto rbf = make_op("rbf", 64, 4, {}, false);
  const double ratio =
      static_cast<double>(rbf->flops(1024, 1024, 64).forward) / static_cast<double>(rbf->flops(512, 512, 64).forward);
  CHECK(ratio == Approx(2.0).epsilon(0.01));
}

TEST_CASE("operators reject bad options with a clear message", "[operator][errors]") {
  OperatorSpec spec;
  spec.d_model = 10;
  spec.n_heads = 3;
  CHECK_THROWS_WITH(test::plugins().make_operator("attention", spec),
                    Catch::Matchers::EndsWith("attention: d_model 10 is not divisible by heads 3"));
  spec.n_heads = 2;
  spec.params.set("dct_impl", std::string("fast"));
  CHECK_THROWS_WITH(test::plugins().make_operator("dct", spec),
                    Catch::Matchers::EndsWith("unknown DCT implementation 'fast' (known: auto, gemm, fft)"));
  spec.params = Params().set("featuers", int64_t{8});
  CHECK_THROWS_WITH(
      test::plugins().make_operator("rbf", spec),
      Catch::Matchers::EndsWith("libchiar_rbf.so): unknown parameter 'featuers' (known: chunk, eps, features, gamma)"));
  spec.params = Params().set("features", std::string("many"));
  CHECK_THROWS_WITH(test::plugins().make_operator("rbf", spec),
                    Catch::Matchers::EndsWith("parameter 'features': expected an integer, found a string (\"many\")"));
}
